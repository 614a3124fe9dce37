"""Every answer to an operator's read: `status` (one row per model), `sync` (is what serves the
source's newest content, and why not), `queries` (versions, diff, audit, what served when). Read-only.
"""
