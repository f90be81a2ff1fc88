"""Generated protobuf and gRPC stubs of flashsampler.v1 (built from proto/ by setup.py)."""
