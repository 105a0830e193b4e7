"""Drafters: whatever proposes the next k tokens for the target to verify."""
