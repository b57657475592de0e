"""Tidemark: MongoDB change streams into a Parquet lake, exactly once.

This package is the ground floor every layer stands on: the error hierarchy (`errors`), the
streams config (`config`), resume tokens and cluster times (`tokens`), the Tidemark home and the
lake's URL (`settings`), paths on object storage (`object_path`), the stages that remove excluded
fields (`field_exclusion`) and which pipeline stages a stream may add (`pipeline_stages`). It
imports nothing of Tidemark's. The application on top (the `tidemark` command, the demo) is
`tidemark.cli`; the work is in `jobs/`, the state store in `state/`, connections in
`resources/`, the Dagster wiring in `orchestration/`.
"""
