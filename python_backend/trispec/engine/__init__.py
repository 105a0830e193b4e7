"""Engines: what runs a model's forward pass and owns its KV cache."""
