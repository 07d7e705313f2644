"""Benchmarks of the fix's cost (GPU study, CPU model timing) and the report they render into."""
