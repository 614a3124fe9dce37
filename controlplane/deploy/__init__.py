"""The deploy engine: loading, verifying, smoke-testing, publishing and recovering deploys.

`engine` (the `Deployer` and its state machine), `plans` (a change set as an ordered plan),
`steps` (the steps each plan runs), `publish` (the serving repository Triton reads), `smoke`
(smoke tests), `reconcile` (registry vs Triton at start), `causes` (failure causes: retryable or not).
"""
