"""HEAR policies: pure decisions over the protocol's views, never the engine's internals.

`policies` (FCFS, Cache-Aware, Guard-W, Session-Aware retention, role -> mode selection),
`modemap` (the frozen role -> mode mapping), `mode_calibration` (choosing it on a development
set) and `overhead` (the protocol's own cost). Policy code imports only `protocol` and `errors`.
"""
