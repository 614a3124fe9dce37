"""The daemon's start: what changed in the source while it was down, and recording it.

`scan` (plan the start from recorded source signatures), `record` (record and deploy in waves).
"""
