"""Dagster: assets, checks, jobs, schedules and resources over the plain functions in `jobs`.

A Spark Connect remote (TIDEMARK_SPARK_REMOTE) is announced to PySpark here, first thing: the
transform's UDFs are built, on first use, for the mode the process is in then (see
`resources.spark.prepare_connect_mode`).
"""

import os

from resources.spark import REMOTE_ENV, prepare_connect_mode

prepare_connect_mode(os.environ.get(REMOTE_ENV))
