"""Settings: what the daemon runs with (`config`: flag > TRITONCTL_* environment > TOML file > defaults,
validated once) and what a SIGHUP reload replaces (`live`).
"""
