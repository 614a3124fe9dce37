"""Differential testing of offline validation against the real tritonserver.

`cases` generates model repositories, valid and subtly invalid; `runner` validates each offline,
asks the deploy-time host check, and loads it into a real tritonserver (explicit mode);
`verdicts` decides what counts as agreement: the same verdict, and when both refuse, the same
field; a host-dependent false accept only for the refusal its allow-list entry names. `python -m
tests.differential --report` prints the confusion matrix; tests/test_differential.py runs a sample
in the default suite and every case under `-m slow`.
"""
