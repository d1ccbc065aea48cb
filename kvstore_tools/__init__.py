"""Operator tools around the kvstore daemon: admin CLI and benchmarks."""
