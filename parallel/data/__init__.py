"""Data parallelism: gradient allreduce, gradient buckets and wire formats, the parameter server."""
