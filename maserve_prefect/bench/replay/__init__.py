"""Replay suites: the finding analyses and the per-block figures of a replay suite's arm runs."""
