"""Support vector machines: the serial SMO solver and the parallel SVMs built on it."""
