"""Shared groundwork of suite families (BLAS, layer, training suites), so that no case module imports another."""
