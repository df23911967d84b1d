"""Replay suites (`kind: replay`): the suite file, its run over replay scenarios, the finding
analyses and the per-block figures of its arm runs."""
