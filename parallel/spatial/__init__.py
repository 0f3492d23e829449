"""Spatial (domain) parallelism: tiles, halo exchange, halo convolutions, the domain-parallel CNN."""
