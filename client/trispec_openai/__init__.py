"""OpenAI-compatible HTTP endpoint (``specdec-openai``) in front of the specdec model on Triton."""
