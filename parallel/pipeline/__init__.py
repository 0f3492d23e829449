"""Pipeline parallelism: stage partition and schedules, one stage's run, micro-batch state."""
