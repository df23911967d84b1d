"""The ecosystem's formats in and out: a Semantic Trace as OpenTelemetry GenAI spans (`otel_*`),
as AIPerf inputs, and AIPerf's per-request records back as a ledger run (`aiperf_*`).

Each module maps the project's records onto one outside format and leaves the format's own
library to write it where one exists; nothing here changes a recorded trace.
"""
