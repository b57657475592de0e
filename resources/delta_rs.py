"""A Delta table opened with delta-rs (the `deltalake` package: Rust, no JVM), local or on S3,
found as any AWS client finds a store (the standard variables `resources.spark_lake` reads).

Tidemark looks with it where a JVM round trip costs more than the answer (gc asking whether a
table has anything to VACUUM); it never deletes or writes with it: deltalake 1.6.6's full
VACUUM takes the deletion-vector files of live rows for unreferenced ones (measured on a copy
of a torture `current`: it deleted two, and the table could no longer be read). Tests read the
curated tables with it as any engine's user would."""

from __future__ import annotations

import os

from deltalake import DeltaTable

from resources.spark_lake import endpoint, region
from tidemark.object_path import LakePath, ObjectPath


def delta_table(path: LakePath) -> DeltaTable:
    """The Delta table at `path`, at its newest version."""
    if not isinstance(path, ObjectPath):
        return DeltaTable(str(path))
    options = {"AWS_REGION": region(os.environ) or "us-east-1"}
    url = endpoint(os.environ)
    if url:
        options |= {"AWS_ENDPOINT_URL": url, "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false"}
        options["AWS_ALLOW_HTTP"] = str(url.startswith("http:")).lower()
    return DeltaTable(str(path), storage_options=options)
