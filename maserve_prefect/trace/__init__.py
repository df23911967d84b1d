"""maserve_prefect.trace."""
