"""trispec_build: build-time tools (checkpoint and tokenizer conversion); never imported while serving."""
