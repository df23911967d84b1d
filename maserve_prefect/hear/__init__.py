"""maserve_prefect.hear: HEAR, the bidirectional harness-engine protocol, and its policies.

Messages (`messages` re-exports them): `subjects`, `intents`, `controls`, `state`, `outcomes`;
`capabilities` (what an engine supports) and `force` (the one `resolve` every engine side
uses); `channel` (intent vs control channels), `reference` (the smallest conforming engine
side). Policies: `views`, `policies`, `modemap`, `mode_calibration`; `overhead` accounts for the
protocol's own cost. Policy code imports only `hear.*`, `engine.protocol` and `errors`.
"""
