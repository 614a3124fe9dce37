"""The gateway: the data path in front of tritonserver (docs/gateway.md).

Clients send inference to the gateway under a model's public name; its route table maps that name to
the private name (`<model>__<8 hex of digest>`) of the digest that serves, so a switch is an alias flip.
routes.py, control.py and launcher.py are what the daemon imports (no asyncio); the rest is the
gateway process (`python -m controlplane.gateway`).
"""
