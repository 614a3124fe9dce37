"""source → **intake** → plan: what the source hands on becomes recorded content and a plan.

`flow` (the `Intake`: the watcher's and `load`'s captures, returning a plan), `recording` (capture →
validate → record → audit, the one path from content to a recorded snapshot), `decision` (the one rule
book: does a content deploy now), `changeset` (which models deploy together, and in what order), `tags`
(names operators give versions, and the models that track one).
"""
