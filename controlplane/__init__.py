"""tritonctl's core: watch a model repository, snapshot it atomically, record every version,
and deploy snapshots to a real tritonserver in explicit mode with verification and rollback."""

import os

__version__ = "0.1.0"

# gRPC's fork handlers (on by default in grpcio's builds) run at every fork(); the daemon forks only to
# exec tritonserver, and a fork while another thread sits in a gRPC call can crash the process in those
# handlers (grpc/grpc#29044; seen here as a segfault of a process that restarted tritonserver while a
# thread polled it). Set before grpc is first imported, which every entry point does through this package.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
