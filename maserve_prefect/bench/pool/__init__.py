"""Pool suites (`kind: pool`): recorded multi-agent work on a heterogeneous pool under every pool
plan — the suite file, the run, its record and its tables."""
