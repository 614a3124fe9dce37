"""The read-only web view served at /ui/ on `--web-address` (docs/web.md): pages, login gate, timeline."""
