"""Benchmarks (not tests: these machines are noisy; what counts are ratios measured in one run)."""
