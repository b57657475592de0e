"""The pipelines as plain functions; no Dagster here (Dagster jobs live in `orchestration/`)."""
