"""Benchmark suite behind `make bench`: claims/s, latency, Redis and GitHub cost per claim."""
