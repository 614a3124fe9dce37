"""The `tritonctl` command line: parses, calls one core function, renders. No decisions here."""
