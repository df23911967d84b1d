"""The engine seam and the whole HEAR vocabulary.

A `Replica` serves one deployment, a `Pool` owns devices and replicas (`engine`). What travels
across the seam, in HEAR's four categories: `subjects` (what a message is about), `intents`
(description, never an order), `controls` (requirements and preferences, with their force),
`state` and `capabilities` (what an engine reports and can honour) and `outcomes` (what really
happened); `messages` is one import surface for all of them. `force.resolve` is the one place the
force rules are enforced; `channel` keeps intents and controls apart; `views` are the read-only
views policies decide over; `fake` is the smallest engine that obeys the protocol.
"""
