"""Transform: committed raw batches -> each collection's Delta tables `changes` and `current`.

`transform` runs one stream's transform (`run`): the change log (`change_log`), then the fold
into `current` (`apply`, by the rules in `fold`), every Delta commit made once (`delta_io`).
Documents become typed columns plus a residual by `type_rule` (run in `typed_columns`); the
Arrow UDFs are made on first use (`udfs`), and `python_daemon` starts Spark's Python workers
with these modules imported. `compact` is Delta's OPTIMIZE and purge, `vacuum` its VACUUM.
`read_current` and `read_changes` read the tables (`readers`); their columns and paths are
`jobs.curated_zone`'s.
"""

from jobs.transform.compact import (
    CompactionResult,
    DeltaDebt,
    compact,
    delta_debt,
    needs_compaction,
)
from jobs.transform.readers import exact_documents, read_changes, read_current
from jobs.transform.run import SparkSource, TransformResult, transform

__all__ = [
    "CompactionResult",
    "DeltaDebt",
    "SparkSource",
    "TransformResult",
    "compact",
    "delta_debt",
    "exact_documents",
    "needs_compaction",
    "read_changes",
    "read_current",
    "transform",
]
