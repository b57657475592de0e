"""Where Tidemark keeps things: the home directory and the locations derived from it.

Everything generated (embedded mongod data, the SQLite state store, the lake) lives under
the Tidemark home unless an environment variable points elsewhere, so one `rm -rf` resets a
demo and nothing generated lands in the source tree by accident.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tidemark.errors import LakeUrlUnsupported
from tidemark.object_path import SCHEMES, LakePath, ObjectPath

# scheme://... as in RFC 3986; a Windows drive (C:\\lake) has no "//" after its colon.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def tidemark_home() -> Path:
    """`TIDEMARK_HOME`, else `./.tidemark` when the current directory has one (what `make`
    uses, so the bare CLI in a checkout sees the demo's state), else `~/.tidemark`."""
    raw = os.environ.get("TIDEMARK_HOME")
    if raw:
        return Path(raw).expanduser().resolve()
    local = Path.cwd() / ".tidemark"
    return local if local.is_dir() else Path.home() / ".tidemark"


def _has_state(home: Path) -> bool:
    return any((home / name).exists() for name in ("state.db", "lake", "mongod", "spark"))


def home_notice(home: Path) -> str | None:
    """A line naming the home in use when it may not be the one meant: another candidate home
    (`./.tidemark`, `~/.tidemark`) exists beside it with no variable choosing, or the home in
    use holds no state while another does. None when the choice is the obvious one."""
    others = [
        p
        for p in (Path.cwd() / ".tidemark", Path.home() / ".tidemark")
        if p.is_dir() and p.resolve() != home.resolve()
    ]
    chosen_by_env = bool(os.environ.get("TIDEMARK_HOME"))
    if not others or (chosen_by_env and (_has_state(home) or not any(map(_has_state, others)))):
        return None
    if chosen_by_env:
        why = "TIDEMARK_HOME"
    else:
        why = "this directory's" if home == Path.cwd() / ".tidemark" else "the default"
    empty = "" if _has_state(home) else ", which holds no state yet"
    return (
        f"Tidemark home: {home} ({why}{empty}); also found {', '.join(map(str, others))}. "
        "Set TIDEMARK_HOME to choose."
    )


def lake_path(raw: str) -> LakePath:
    """The lake root `raw` names: an absolute local path, or an object store's URL; the one
    place every entry point (the CLI, the Dagster resources) reads TIDEMARK_LAKE.

    `file:///abs/path` is that local path; `s3://bucket/prefix` (also `s3a://`), `gs://` and
    `abfss://` are object storage. Any other URL is refused: a Path would take
    `hdfs://nn/lake` for the relative directory `hdfs:/nn/lake` and write the lake there.

    Raises:
        LakeUrlUnsupported: `raw` is a URL of another kind, or an object URL with no bucket.
    """
    if _URL.match(raw):
        parts = urlsplit(raw)
        scheme = parts.scheme.lower()
        if scheme in SCHEMES and parts.netloc:
            _check_object_url(raw, scheme)
            return ObjectPath.from_url(raw)
        if scheme != "file" or parts.netloc not in ("", "localhost"):
            raise LakeUrlUnsupported(
                f"TIDEMARK_LAKE is {raw!r}, a URL Tidemark cannot write: the lake is a local "
                "path or object storage (s3://bucket/prefix, gs://bucket/prefix, "
                "abfss://container@account.dfs.core.windows.net/prefix), and Tidemark "
                "writes nothing rather than take it for a directory name.",
                "Set TIDEMARK_LAKE to a local directory (a mounted network file system "
                "works) or to an object store's URL with its bucket, or leave it unset for "
                "$TIDEMARK_HOME/lake.",
            )
        raw = unquote(parts.path)
    return Path(raw).expanduser().resolve()


def _check_object_url(raw: str, scheme: str) -> None:
    """Refuse what an object URL must not carry: a part `urlsplit` would drop (`?`, `#`: the
    lake would land in another lake's prefix), credentials (they belong in the environment,
    and would be printed with the URL), or path segments a store keeps literally (`//`, `.`)."""
    parts = urlsplit(raw)
    userinfo = "@" in parts.netloc and scheme not in ("abfs", "abfss")
    shown = f"{parts.scheme}://***@{parts.netloc.rsplit('@', 1)[-1]}/..." if userinfo else raw
    segments = parts.path.strip("/").split("/") if parts.path.strip("/") else []
    problem = None
    if userinfo:
        problem = "carries credentials in the URL"
    elif parts.query or parts.fragment or raw.rstrip().endswith(("?", "#")):
        problem = "has a query or a fragment ('?' or '#'), which is no part of an object key"
    elif any(s in ("", ".", "..") for s in segments):
        problem = "has an empty, '.' or '..' path segment"
    if problem:
        raise LakeUrlUnsupported(
            f"TIDEMARK_LAKE ({shown}) {problem}: Tidemark writes nothing rather than guess "
            "which prefix was meant.",
            "Write it as scheme://bucket/prefix with plain path segments, and give the "
            "credentials in the standard variables (AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE).",
        )


@dataclass(frozen=True)
class Settings:
    """The environment-derived locations one Tidemark process works with."""

    home: Path
    config_path: Path
    state_url: str
    lake_root: LakePath
    mongodb_uri: str | None
    spark_master: str | None  # a Spark master: each process starts its own driver JVM
    spark_remote: str | None  # a Spark Connect server (sc://host:port): no JVM here

    @classmethod
    def from_env(cls) -> Settings:
        home = tidemark_home()
        config = os.environ.get("TIDEMARK_CONFIG", "streams.yaml")
        state_url = os.environ.get("TIDEMARK_STATE_URL") or f"sqlite:///{home / 'state.db'}"
        lake = os.environ.get("TIDEMARK_LAKE") or str(home / "lake")
        return cls(
            home=home,
            config_path=Path(config).expanduser().resolve(),
            state_url=state_url,
            lake_root=lake_path(lake),
            mongodb_uri=os.environ.get("MONGODB_URI") or None,
            spark_master=os.environ.get("TIDEMARK_SPARK_MASTER") or None,
            spark_remote=os.environ.get("TIDEMARK_SPARK_REMOTE") or None,
        )
