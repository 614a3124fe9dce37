"""Differential testing of offline validation against the real tritonserver.

`cases` generates model repositories, valid and subtly invalid; `runner` validates each offline and
loads it into a real tritonserver (explicit mode) and compares the verdicts. `python -m
tests.differential --report` prints the confusion matrix; tests/test_differential.py runs a sample
in the default suite and every case under `-m slow`.
"""
