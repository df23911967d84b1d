"""maserve_prefect.predictors (shipped from the repository's predictors/ folder)."""
