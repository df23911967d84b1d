"""maserve_prefect.metrics."""
