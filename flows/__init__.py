"""maserve_prefect.flows (shipped from the repository's flows/ folder)."""
