"""Sharded data parallelism, ZeRO stages 1, 2 and 3 (Rajbhandari et al., 2020; FSDP), beside
`parallel.data.data_parallel`'s replicas.

- `shards`: the layout (segments of the flat vectors split by `block_range`) and the byte counts,
- `exchange`: a segment's reduce-scatter and allgather (MPI's or the hand-written ones),
- `base`: the step all stages share (micro-batches, mixed precision, the shard's optimiser pairs),
- `optimizer_sharding` (stage 1), `gradient_sharding` (stage 2), `parameter_sharding` (stage 3).

`ZERO_STAGES` maps the ``dp`` suite's variant names to the trainers.
"""
from parallel.data.zero.exchange import ZERO_COLLECTIVES
from parallel.data.zero.gradient_sharding import GradientSharding
from parallel.data.zero.optimizer_sharding import OptimizerSharding
from parallel.data.zero.parameter_sharding import ParameterSharding
from parallel.data.zero.shards import held_bytes

ZERO_STAGES = {"zero1": OptimizerSharding, "zero2": GradientSharding, "zero3": ParameterSharding}

__all__ = ["ZERO_COLLECTIVES", "ZERO_STAGES", "held_bytes"]
