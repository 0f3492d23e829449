"""Sequence (context) parallelism: ring attention and all-to-all (Ulysses) attention."""
