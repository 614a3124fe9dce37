"""The bottom of the core: small standard-library pieces every stage may use, and that import no stage.

`jsontext` (JSON text of big documents, and the contract's time format), `defaults` (the defaults the
CLI's client path needs), `periodic` (a thread that does one round every interval), `clock` (now, and
times given as text: `2h`, ISO 8601), `systemd` (sd_notify, never raises).
"""
