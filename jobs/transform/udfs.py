"""The transform's Arrow UDFs, built on first use rather than when a module is imported.

PySpark builds a UDF for the mode the process is in when the UDF is made: classic, or Spark
Connect once `SPARK_CONNECT_MODE_ENABLED` is set (`resources.spark.prepare_connect_mode`), and
a classic UDF used over Connect fails (SESSION_OR_CONTEXT_NOT_EXISTS). Made at import, the
mode would be whatever it was when the modules happened to be imported; made here, when a
query first calls it, importing a module creates nothing of Spark's, and each mode gets its
own. The bodies stay plain functions over pyarrow arrays, importable and testable without
Spark.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql.functions import arrow_udf
from pyspark.sql.types import DataType
from pyspark.sql.utils import is_remote

ArrowBody = Callable[[pa.Array], pa.Array]
ArrowUdf = Callable[..., Column]


def arrow_udf_of(body: ArrowBody, return_type: DataType) -> ArrowUdf:
    """`body` as an Arrow UDF returning `return_type`, made once per Spark mode."""
    return _made(body, return_type, is_remote())


@functools.cache
def _made(body: ArrowBody, return_type: DataType, remote: bool) -> ArrowUdf:
    # `remote` is only the cache's key: arrow_udf reads the mode itself (the same is_remote).
    return arrow_udf(body, return_type)
