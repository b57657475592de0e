"""The Python daemon of a Spark this machine starts: pyspark's own, after importing the
transform's modules once, so that every UDF worker it forks starts with them.

A fresh worker otherwise imports them at its first UDF (`change_log`, `typed_columns`,
`fold`, and through this package the state store, SQLAlchemy and the config models): seconds
per worker, paid
again whenever Spark retires idle workers, as it does between scheduled runs. Spark runs this
module (`spark.python.daemon.module`, set by `resources.spark`) in place of `pyspark.daemon`.
"""

from __future__ import annotations

import contextlib

from pyspark.daemon import manager

with contextlib.suppress(ImportError):  # off the project's path: workers import on demand
    import jobs.transform.change_log
    import jobs.transform.fold
    import jobs.transform.typed_columns  # noqa: F401

if __name__ == "__main__":
    manager()
