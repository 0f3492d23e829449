"""Collectives and the parallel training strategies, written on mpi4py point-to-point messages."""
