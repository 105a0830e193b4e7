"""Client library and CLI for the specdec model on Triton (gRPC and HTTP)."""
