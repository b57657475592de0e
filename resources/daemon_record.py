"""The record of a daemon Tidemark starts under its home (the Spark Connect server, the
Dagster UI): one dataclass kept as a JSON file, and the lock that serialises its start and stop.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

Record = TypeVar("Record")


def load_record(path: Path, kind: type[Record]) -> Record | None:
    """The `kind` recorded at `path`; None when there is none yet or it is damaged, which
    counts as no daemon."""
    try:
        return kind(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def save_record(path: Path, record: Any) -> None:
    """Record `record` (a dataclass) at `path`."""
    path.write_text(json.dumps(asdict(record)))


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Held by one process at a time (an flock on `path`), so two starts at once (make ui in
    one shell, make demo in another) start one daemon."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
