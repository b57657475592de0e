"""The typed errors Tidemark raises; each carries what went wrong and how to fix it.

Operators see these as one paragraph (the CLI prints `str(error)`, never a traceback), so the
message names the problem, the thing it concerns (stream, URI, file) and the fix.
"""

from __future__ import annotations


class TidemarkError(Exception):
    """Base of every error Tidemark raises on purpose. `fix` says what to do about it."""

    def __init__(self, problem: str, fix: str = "") -> None:
        self.problem = problem.strip()
        self.fix = fix.strip()
        super().__init__(f"{self.problem} {self.fix}".strip())


# -- The streams file and the command line --------------------------------------------------------


class ConfigError(TidemarkError):
    """The streams config file is missing, malformed or invalid."""


class WebhookUrlUnset(ConfigError):
    """The notifications' webhook URL names an environment variable that is unset here."""


class UnknownStream(TidemarkError):
    """A stream name that the config does not declare."""


class StreamArgumentMissing(TidemarkError):
    """A command over streams was given neither one stream nor --all (or was given both)."""


class WorkloadStreamMissing(TidemarkError):
    """`tidemark workload` found no collection or database stream in the config to write to."""


# -- The source: MongoDB and which deployment a checkpoint belongs to -----------------------------


class MongoConnectionError(TidemarkError):
    """MongoDB cannot be reached, the URI is wrong, or the credentials are refused."""


class ReplicaSetRequired(TidemarkError):
    """The server is a standalone mongod: change streams need a replica set or sharded cluster."""


class EmbeddedMongoError(TidemarkError):
    """The embedded mongod (demo and tests) could not be started."""


class SourceChanged(TidemarkError):
    """MONGODB_URI reaches another deployment than the one the stream's checkpoint came from."""


class StreamDefinitionChanged(TidemarkError):
    """A stream's definition no longer matches the one its checkpoint was taken with."""


# -- Capture: the change stream, its history, snapshots and replays -------------------------------


class StreamInvalidated(TidemarkError):
    """The watched collection or database went away and the stream is set to stop there."""


class ResumedFromInvalidate(TidemarkError):
    """resumeAfter was given an invalidate's token: the caller may open with startAfter."""


class HistoryLost(TidemarkError):
    """The stored resume point is no longer in the oplog (server error ChangeStreamHistoryLost)."""


class SnapshotOutrun(HistoryLost):
    """A copy made because the history was lost was itself outrun by the oplog before the
    stream could go on from it: the oplog holds less than one copy's time."""


class SnapshotPipelineError(TidemarkError):
    """The stream's pipeline makes of a snapshot document's insert event something a snapshot
    row cannot be (no fullDocument, or one with another _id)."""


class SplitStageRequired(TidemarkError):
    """The stream stands after an event the server split (over 16 MB) and was opened without
    $changeStreamSplitLargeEvent, which resuming there needs."""


class FragmentOutOfOrder(TidemarkError):
    """The stream delivered a fragment without the ones before it."""


class ResumeTokenRejected(TidemarkError):
    """The server rejected the stored resume token as invalid: the checkpoint looks damaged."""


class EventTooLarge(TidemarkError):
    """A change event is over MongoDB's 16 MB limit and the server cannot split it (or was not
    asked to), so it cannot be delivered."""


class ChangeStreamFailed(TidemarkError):
    """The change stream failed on the server for a reason Tidemark has no better name for."""


class WindowNotConfirmed(TidemarkError):
    """The server never showed a replay window's end as passed: it could not be complete."""


class ReplayRefused(TidemarkError):
    """A window that cannot be replayed exactly: not closed yet, or older than the oplog."""


class ResetTimeInFuture(TidemarkError):
    """`tidemark reset --to-time` was given a time that has not come yet."""


class ResetTimeBeforeOplog(TidemarkError):
    """`tidemark reset --to-time` was given a time before the oplog's first entry: the changes
    since then are gone from the server."""


# -- The state store: leases, checkpoints and its own health --------------------------------------


class LeaseHeld(TidemarkError):
    """Another run holds the stream's lease: two drains of one stream never run at once."""


class LeaseLost(TidemarkError):
    """This run's lease was taken over (fencing epoch moved on): its commit was refused."""


class CheckpointConflict(TidemarkError):
    """The checkpoint moved under this run (compare-and-set failed): nothing was committed."""


class StateStoreError(TidemarkError):
    """The SQL state store is unreachable, of another schema version, or holds bad data."""


# -- The lake and its servers ---------------------------------------------------------------------


class LakeError(TidemarkError):
    """The lake directory cannot be written or holds something unexpected."""


class LakeUrlUnsupported(LakeError):
    """TIDEMARK_LAKE is a URL of a kind Tidemark cannot write (hdfs://, another host's file://)."""


class EmbeddedS3Error(TidemarkError):
    """The local S3 server (SeaweedFS, for `make demo LAKE=s3` and the tests) could not start."""


# -- The transform: Spark and the curated Delta tables --------------------------------------------


class SparkUnavailable(TidemarkError):
    """Spark cannot start: no suitable Java, or the session failed to come up."""


class SparkServerError(SparkUnavailable):
    """The local Spark Connect server did not start, or did not answer; its log says why."""


class SparkServerLost(SparkUnavailable):
    """The Spark Connect server went away while a run used it (it exited, was killed, or ran
    out of memory): nothing was committed."""


class SparkOutOfMemory(TidemarkError):
    """Spark's driver ran out of memory (java.lang.OutOfMemoryError) during a run."""


class SparkQueryFailed(TidemarkError):
    """A Spark query failed on the JVM side for a reason Tidemark has no better name for."""


class TransformConflict(TidemarkError):
    """Another transform committed a version of this stream first; nothing was committed."""


class LegacyCuratedZone(TidemarkError):
    """The stream's curated tables are in the format older releases wrote (base + deltas)."""


class CurrentTableBehind(TidemarkError):
    """Runs with `current_table: false` left the `current` tables without their events."""


class CuratedTableMissing(TidemarkError):
    """A curated table (or a version of it) asked for is not there."""


class SchemaFrozen(TidemarkError):
    """A stream with `schema: freeze` met a field its table lacks or a type it does not hold."""


# -- Dagster ------------------------------------------------------------------------------------


class StreamNotLoaded(TidemarkError):
    """A stream's Dagster definitions failed to build; the code location loads without it."""

    @classmethod
    def of(cls, stream: str, cause: BaseException) -> StreamNotLoaded:
        first_line = (str(cause).strip().splitlines() or [""])[0].rstrip(".")
        return cls(
            f"Stream {stream!r} has no Dagster definitions: building them failed with "
            f"{type(cause).__name__}: {first_line}. The other streams load and run as usual.",
            "This is a bug of Tidemark's, not of the streams file: report it with this "
            "message. Meanwhile `tidemark drain` and `tidemark transform` run the stream from "
            "the command line; reload the code location once Tidemark is fixed.",
        )


# -- Processes Tidemark serves --------------------------------------------------------------------


class DagsterUiRunning(TidemarkError):
    """`tidemark ui` found the home's Dagster UI already running."""


class MetricsServerError(TidemarkError):
    """`tidemark metrics serve` cannot listen where it was asked to (port taken, bad host)."""
