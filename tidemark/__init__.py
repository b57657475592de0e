"""Tidemark: MongoDB change streams into a Parquet lake, exactly once.

This package holds what every layer shares: the error hierarchy, the streams config, the
Tidemark home and the operator CLI. The work itself lives in `jobs/`, the state store in
`state/`, connections in `resources/` and the Dagster wiring in `orchestration/`.
"""
