"""maserve_prefect.hear."""
