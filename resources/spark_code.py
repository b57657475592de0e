"""Tidemark's own modules, shipped to the executors of every Spark Connect session it opens.

The transform's UDFs are Tidemark functions: a Python worker on an executor imports
`jobs.transform...` to run them. A cluster's workers have the libraries those modules import
(pandas, pyarrow, python-bsonjs, pymongo's bson, ...; the README lists them) but not
Tidemark, and should not need to: the session adds one zip of Tidemark's packages as a Python
artifact (`SparkSession.addArtifacts(..., pyfile=True)`), which Spark Connect puts on the
session's workers' `sys.path`. The zip is named by its content's hash, so a session never runs
code other than its client's, and two clients of one server with different checkouts each
get their own.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

# Every package a UDF's module imports, directly or not: the layers below the orchestration.
PACKAGES = ("jobs", "state", "resources", "tidemark")
_ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def code_archive() -> Path:
    """The zip of Tidemark's packages (their .py files), made once per process."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in PACKAGES:
            for source in sorted((_ROOT / package).rglob("*.py")):
                name = source.relative_to(_ROOT).as_posix()
                # A fixed time: the same code makes the same bytes, so the same name.
                info = zipfile.ZipInfo(name, date_time=(2000, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                archive.writestr(info, source.read_bytes())
    data = buffer.getvalue()
    digest = hashlib.sha256(data).hexdigest()[:16]
    target = Path(tempfile.gettempdir()) / "tidemark-spark-code" / f"tidemark-{digest}.zip"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        # A name of this process's own: two processes shipping the same code never share one.
        staged = target.with_suffix(f".{os.getpid()}.part")
        staged.write_bytes(data)
        staged.replace(target)
    return target


def ship_code(session: Any) -> None:
    """Add Tidemark's packages to a Connect session's Python workers."""
    session.addArtifacts(str(code_archive()), pyfile=True)
