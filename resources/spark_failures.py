"""Spark's failures as Tidemark's errors. Spark raises py4j, gRPC and PySpark exceptions whose
text is a JVM stack trace; the transform's entry (jobs.transform.run) passes everything it
catches through `spark_failure`, the one place that names them, each with its fix."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from resources.spark import REMOTE_ENV
from tidemark.errors import SparkOutOfMemory, SparkQueryFailed, SparkServerLost, TidemarkError

_OOM = re.compile(r"java\.lang\.OutOfMemoryError[^\n]*")
_SERVER_GONE = (
    "failed to connect to all addresses",
    "Connection refused",
    "Socket closed",
    "Connection reset",
    "Answer from Java side is empty",  # py4j: the local driver JVM died
    "Error while sending or receiving",
    # A Connect server whose driver ran out of memory stops its SparkContext (its log has the
    # OutOfMemoryError) and answers every query with this until it is restarted.
    "Cannot call methods on a stopped SparkContext",
    # The session's server was replaced under it (restarted on the same address).
    "NO_ACTIVE_SESSION",
    "SESSION_CHANGED",
    "SESSION_NOT_FOUND",
    "SESSION_CLOSED",
)
_MEMORY_FIX = (
    "Give Spark's driver more memory: `tidemark spark stop`, then `tidemark spark start "
    "--driver-memory 4g` (the local Connect server; a remote one is sized where it runs), and "
    "run the transform again. A smaller `budget.max_bytes` in the stream's config keeps later "
    "drains' batches, and so a transform's input, smaller."
)


def spark_failure(exc: BaseException, what: str, remote: str | None) -> TidemarkError | None:
    """`exc` as Tidemark's typed error with its fix when it is Spark's (PySpark, py4j, gRPC),
    else None. `what` names the work (e.g. "the transform of stream 'orders'"); `remote` is
    the Connect URL in use, if any."""
    if isinstance(exc, TidemarkError) or not type(exc).__module__.startswith(
        ("pyspark", "py4j", "grpc")
    ):
        return None
    text = str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = (lines[0] if lines else type(exc).__name__)[:300]
    oom = _OOM.search(text)
    if oom:
        return SparkOutOfMemory(
            f"Spark ran out of memory during {what} ({oom.group(0).strip()[:200]}); nothing "
            "was committed.",
            _MEMORY_FIX,
        )
    status = getattr(exc, "getGrpcStatusCode", None)
    code = getattr(status(), "name", "") if callable(status) else ""
    if code == "UNAVAILABLE" or any(marker in text for marker in _SERVER_GONE):
        if remote or ".connect" in type(exc).__module__:
            where = "The Spark Connect server" + (f" at {remote}" if remote else "")
        else:
            where = "Spark's driver JVM"
        return SparkServerLost(
            f"{where} went away during {what} ({first}); nothing was committed. A server "
            "whose driver ran out of memory fails this way.",
            "`tidemark spark start` starts the local server again (`tidemark transform` does "
            "so by itself); if its log (`tidemark spark status` names it) shows "
            "java.lang.OutOfMemoryError, start it with more memory: `tidemark spark stop`, "
            "then `tidemark spark start --driver-memory 4g`. A remote server "
            f"({REMOTE_ENV}) is restarted where it runs.",
        )
    return SparkQueryFailed(
        f"Spark failed during {what}: {type(exc).__name__}: {first}. Nothing was committed.",
        "Run it again; if it fails the same way, the Spark server's log (`tidemark spark "
        "status` names the local one's) has the whole error.",
    )


@contextlib.contextmanager
def spark_failures(what: str) -> Iterator[None]:
    """Re-raise Spark's failures inside the block as Tidemark's errors (no JVM trace)."""
    try:
        yield
    except Exception as exc:
        translated = spark_failure(exc, what, _active_remote())
        if translated is None:
            raise
        raise translated from None


def _active_remote() -> str | None:
    """The Connect URL of the process's session, or None (a classic session, or none)."""
    with contextlib.suppress(Exception):
        from pyspark.sql import SparkSession

        session = SparkSession.active()
        if type(session).__module__.startswith("pyspark.sql.connect"):
            return f"sc://{session.client._builder.endpoint}"
    return None
