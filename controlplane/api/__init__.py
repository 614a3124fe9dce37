"""Control API: proto, generated code, server and client."""
