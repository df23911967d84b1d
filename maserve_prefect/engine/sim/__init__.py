"""maserve_prefect.engine.sim."""
