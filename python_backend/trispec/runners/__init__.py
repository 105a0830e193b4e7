"""Runners: what executes a step plan (draft, verify, accept, keep the caches right) behind one seam."""
