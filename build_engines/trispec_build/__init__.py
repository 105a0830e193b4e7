"""specdec's build tools (``specdec-build``); never imported while serving."""
