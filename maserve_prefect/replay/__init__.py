"""maserve_prefect.replay."""
