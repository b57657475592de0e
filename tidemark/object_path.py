"""A lake on object storage (s3://, gs://, abfss://), spoken to as the lake code speaks pathlib.

The lake's code joins, lists, stats and deletes paths; a local lake is a `pathlib.Path`, and a
lake on object storage is an `ObjectPath`: the same operations, done by pyarrow's filesystem
layer (the one that writes the raw zone's Parquet, so there is one S3 client, not two). Its
text is the object URL (`s3://bucket/lake/curated/...`), which Spark (with s3a, see
resources/spark.py), delta-rs and other engines read as is.

The endpoint, region and credentials come from the standard AWS variables and files
(AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, ~/.aws/credentials, an instance profile),
read by pyarrow when the filesystem is made; Tidemark never copies them anywhere.

Object stores have no rename and no directories: a file is written once under its final name
(`jobs/lake.py`), a directory exists while an object lies under it, and there is nothing to
fsync or to remove when empty.
"""

from __future__ import annotations

import fnmatch
import functools
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import NamedTuple, TypeAlias
from urllib.parse import urlsplit

import pyarrow.fs as pafs

# The schemes pyarrow's filesystem layer serves; s3a (Hadoop's name) is the same store as s3.
SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gs", "gcs": "gs", "abfs": "abfs", "abfss": "abfss"}


class ObjectStat(NamedTuple):
    st_size: int
    st_mtime: float


@functools.cache
def filesystem(scheme: str, bucket: str) -> pafs.FileSystem:
    """One filesystem per bucket and process, made from the environment on first use."""
    fs, _ = pafs.FileSystem.from_uri(f"{scheme}://{bucket}/")
    return fs


@dataclass(frozen=True)
class ObjectPath:
    """`scheme://bucket/key`: an immutable path on object storage with pathlib's names."""

    scheme: str
    bucket: str
    key: str = ""  # without a leading or trailing slash; "" is the bucket itself

    @classmethod
    def from_url(cls, url: str) -> ObjectPath:
        parts = urlsplit(url)
        scheme = SCHEMES[parts.scheme.lower()]
        return cls(scheme, parts.netloc, parts.path.strip("/"))

    # -- pure path operations ------------------------------------------------------------
    def __truediv__(self, part: str | PurePosixPath) -> ObjectPath:
        joined = PurePosixPath(self.key or "/", str(part)).as_posix().strip("/")
        return ObjectPath(self.scheme, self.bucket, joined)

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.key}".rstrip("/")

    def __lt__(self, other: ObjectPath) -> bool:
        return str(self) < str(other)

    @property
    def name(self) -> str:
        return PurePosixPath(self.key).name

    @property
    def stem(self) -> str:
        return PurePosixPath(self.key).stem

    @property
    def parent(self) -> ObjectPath:
        parent = PurePosixPath(self.key).parent.as_posix()
        return ObjectPath(self.scheme, self.bucket, "" if parent == "." else parent)

    def relative_to(self, other: ObjectPath) -> PurePosixPath:
        if (self.scheme, self.bucket) != (other.scheme, other.bucket):
            raise ValueError(f"{self} is not under {other}")
        return PurePosixPath(self.key).relative_to(PurePosixPath(other.key))

    def as_posix(self) -> str:
        return str(self)

    def as_uri(self) -> str:
        return str(self)

    # -- the store -----------------------------------------------------------------------
    @property
    def fs(self) -> pafs.FileSystem:
        return filesystem(self.scheme, self.bucket)

    @property
    def fs_path(self) -> str:
        """The path pyarrow's filesystem takes: `bucket/key` (Azure: `container/key`)."""
        return f"{self._container}/{self.key}".rstrip("/")

    @property
    def _container(self) -> str:
        # abfss://container@account.dfs.core.windows.net: the account is the filesystem's
        return self.bucket.split("@", 1)[0]

    def _info(self) -> pafs.FileInfo:
        return self.fs.get_file_info(self.fs_path)

    def exists(self) -> bool:
        return self._info().type != pafs.FileType.NotFound

    def is_dir(self) -> bool:
        return self._info().type == pafs.FileType.Directory

    def stat(self) -> ObjectStat:
        info = self._info()
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(str(self))
        return ObjectStat(info.size or 0, _seconds(info.mtime))

    def _children(self, recursive: bool) -> list[tuple[ObjectPath, pafs.FileInfo]]:
        selector = pafs.FileSelector(self.fs_path, recursive=recursive, allow_not_found=True)
        base = len(self._container) + 1
        return [
            (ObjectPath(self.scheme, self.bucket, info.path[base:].strip("/")), info)
            for info in self.fs.get_file_info(selector)
        ]

    def iterdir(self) -> list[ObjectPath]:
        return [path for path, _ in self._children(recursive=False)]

    def glob(self, pattern: str) -> list[ObjectPath]:
        """The children whose names match `pattern` (one level, as the lake's callers need)."""
        return [p for p, _ in self._children(recursive=False) if fnmatch.fnmatch(p.name, pattern)]

    def files(self) -> list[tuple[ObjectPath, ObjectStat]]:
        """Every object under this path, with its size and time, in one listing."""
        return [
            (path, ObjectStat(info.size or 0, _seconds(info.mtime)))
            for path, info in self._children(recursive=True)
            if info.type == pafs.FileType.File
        ]

    def read_bytes(self) -> bytes:
        with self.fs.open_input_stream(self.fs_path) as stream:
            return stream.read()

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def write_bytes(self, data: bytes) -> None:
        with self.fs.open_output_stream(self.fs_path) as stream:
            stream.write(data)

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self.fs.delete_file(self.fs_path)
        except FileNotFoundError:
            if not missing_ok:
                raise


def _seconds(moment: datetime | None) -> float:
    return moment.timestamp() if moment is not None else 0.0


# The lake's root and every path under it: a local directory, or a place on object storage.
LakePath: TypeAlias = Path | ObjectPath


def list_files(base: LakePath) -> list[tuple[LakePath, float]]:
    """Every file under `base` (none when it does not exist) with its modification time, sorted;
    on object storage, one listing rather than a request per file."""
    if isinstance(base, ObjectPath):
        return sorted((path, stat.st_mtime) for path, stat in base.files())
    if not base.exists():
        return []
    return sorted((p, p.stat().st_mtime) for p in base.rglob("*") if p.is_file())
