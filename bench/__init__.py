"""The harness: benchmark cases, timing, sweeps, CSV, reports and the command line."""
