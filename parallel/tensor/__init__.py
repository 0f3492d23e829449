"""Tensor parallelism: column- and row-parallel linear layers, the Megatron MLP."""
