"""Fakes that honour real contracts, for tests and benchmarks."""
