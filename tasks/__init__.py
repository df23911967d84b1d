"""maserve_prefect.tasks (shipped from the repository's tasks/ folder)."""
