"""Adapters to tritonserver: a client facade over tritonclient.grpc and a launcher for an embedded server."""
