"""`python -m controlplane.gateway`: the gateway process (see cli.py for its arguments)."""

from controlplane.gateway.cli import main

raise SystemExit(main())
