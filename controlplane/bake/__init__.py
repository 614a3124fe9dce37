"""Bake: a new digest serves for `bake_s` on live figures before its deploy is done, and is rolled back
by itself when they fail. `baker` (the bakes in progress and their judging), `figures` (a bake's record
and its verdict, pure), `warn` (load-time and memory warnings).
"""
