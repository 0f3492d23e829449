"""One module per benchmark suite."""
