"""Tidemark's benchmarks: scripts that print markdown tables (see BENCHMARKS.md)."""
