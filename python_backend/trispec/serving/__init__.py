"""Serving the speculative loop from Triton Inference Server."""
