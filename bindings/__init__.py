"""maserve_prefect.bindings (shipped from the repository's bindings/ folder)."""
