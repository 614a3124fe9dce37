"""plan → **target**: where a plan goes, chosen once when the control plane is built: this host's
Deployer (`HostTarget`) or a rollout over the fleet (`FleetTarget`), in `targets`.
"""
