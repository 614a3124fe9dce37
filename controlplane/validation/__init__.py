"""Checks a snapshot passes before it is recorded as valid: one-line errors naming file and field.

`modelconfig` (parse config.pbtxt, run every check), `fields` (the per-field rules), `content`
(files beside the config: smoke.json, model.py), `ensembles` and `ensemblemembers` (an ensemble's
steps against their models), `warmup` (model_warmup entries).
"""
