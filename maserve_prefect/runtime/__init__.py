"""maserve_prefect.runtime."""
