"""maserve_prefect.engine."""
