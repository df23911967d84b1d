"""The ecosystem's formats in and out: a Semantic Trace as OpenTelemetry spans (`otel_*`).

Each module maps the project's records onto one outside format and leaves the format's own
library to write it; nothing here changes a trace.
"""
