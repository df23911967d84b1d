"""maserve_prefect.spec."""
