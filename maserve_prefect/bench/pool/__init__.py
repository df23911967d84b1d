"""Pool suites: recorded multi-agent work on a heterogeneous pool under every pool plan."""
