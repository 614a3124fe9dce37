"""The documents tritonctl hands outside, as data: every `--json` document (`results`) and the audit
event object that webhooks, the event stream and `audit --json` share (`events`).
"""
