"""Lowest layer of mlscale: array backends, data distribution, BLAS-level kernels."""
