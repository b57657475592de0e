"""Transform: committed raw batches -> the curated tables `changes` and `current`, with Spark.

`transform` runs one stream's transform (`run`); `read_current` and `read_changes` read the
curated tables (`tables`). The fold's rule lives in `fold`, document columns in `doc_columns`.
"""

from jobs.transform.run import TransformResult, transform
from jobs.transform.tables import read_changes, read_current

__all__ = ["TransformResult", "read_changes", "read_current", "transform"]
