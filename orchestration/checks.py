"""Asset checks of a stream's raw zone: lag, oplog headroom, uncommitted files, the watched
namespace (the collection tables' checks are in `orchestration.table_assets`)."""

import dagster as dg

from jobs.ops import missing_namespace, stream_status, uncommitted_files
from orchestration.keys import keys
from orchestration.metadata import explained
from orchestration.resources import LakeResource, MongoResource, StateStoreResource
from tidemark.config import StreamConfig


def _graded(
    value: float | None, warn: float, error: float, higher_is_worse: bool
) -> tuple[bool, dg.AssetCheckSeverity]:
    if value is None:
        return False, dg.AssetCheckSeverity.WARN
    bad_error = value > error if higher_is_worse else value < error
    bad_warn = value > warn if higher_is_worse else value < warn
    if bad_error:
        return False, dg.AssetCheckSeverity.ERROR
    if bad_warn:
        return False, dg.AssetCheckSeverity.WARN
    return True, dg.AssetCheckSeverity.WARN


def stream_checks(stream: StreamConfig) -> list[dg.AssetChecksDefinition]:
    k = keys(stream)
    limits = stream.checks

    @dg.asset_check(asset=k["raw_changes"], name="lag", blocking=False)
    def lag(mongo: MongoResource, state: StateStoreResource) -> dg.AssetCheckResult:
        """Seconds between the cluster's time and the stored token's, against the thresholds."""
        with explained():
            status = stream_status(stream, mongo.raw_client(), state.store())
        passed, severity = _graded(
            status.lag_seconds, limits.lag_warn_seconds, limits.lag_error_seconds, True
        )
        return dg.AssetCheckResult(
            passed=passed,
            severity=severity,
            metadata={
                "lag_seconds": round(float(status.lag_seconds or 0.0), 1),
                "warn_above": limits.lag_warn_seconds,
                "error_above": limits.lag_error_seconds,
            },
            description=None
            if status.lag_seconds is not None
            else "the stream has no position yet",
        )

    @dg.asset_check(asset=k["raw_changes"], name="oplog_headroom", blocking=False)
    def headroom(mongo: MongoResource, state: StateStoreResource) -> dg.AssetCheckResult:
        """Time until the stored token falls off the oplog, projected from the oplog's fill."""
        with explained():
            status = stream_status(stream, mongo.raw_client(), state.store())
        passed, severity = _graded(
            status.headroom_seconds,
            limits.headroom_warn_seconds,
            limits.headroom_error_seconds,
            False,
        )
        note = None
        if status.oplog_is_young:
            # Nothing can fall off an oplog that is not full, and a few minutes of writes
            # project nothing reliable: report the projection, do not fail on it.
            passed = True
            note = (
                f"the oplog is young ({status.oplog_window_seconds or 0:.0f} s of history, "
                f"{(status.oplog_fill or 0) * 100:.0f}% full): the headroom is a rough projection"
            )
        metadata = {
            "warn_below": limits.headroom_warn_seconds,
            "error_below": limits.headroom_error_seconds,
        }
        if status.headroom_seconds is not None:
            metadata["headroom_seconds"] = round(float(status.headroom_seconds), 1)
        if status.oplog_window_seconds is not None:
            metadata["oplog_window_seconds"] = round(float(status.oplog_window_seconds), 1)
        if status.oplog_fill is not None:
            metadata["oplog_fill"] = round(status.oplog_fill, 4)
        if status.headroom_seconds is None:
            note = "the oplog cannot be read here (mongos, or no privilege on local.oplog.rs)"
        return dg.AssetCheckResult(
            passed=passed, severity=severity, metadata=metadata, description=note
        )

    @dg.asset_check(asset=k["raw_changes"], name="no_uncommitted_files", blocking=False)
    def orphans(state: StateStoreResource, lake: LakeResource) -> dg.AssetCheckResult:
        """Raw files that no committed batch lists (left by crashed runs; `tidemark gc`)."""
        with explained():
            found = uncommitted_files(lake.path, state.store(), stream.name)
        return dg.AssetCheckResult(
            passed=not found,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={
                "uncommitted_files": len(found),
                "examples": dg.MetadataValue.json(found[:5]),
            },
        )

    @dg.asset_check(asset=k["raw_changes"], name="watched_namespace_exists", blocking=False)
    def namespace(mongo: MongoResource) -> dg.AssetCheckResult:
        """The collection or database the stream watches exists: a stream on one that does not
        reads nothing until it is created (a warning, never a failure of the stream)."""
        with explained():
            missing = missing_namespace(mongo.raw_client(), stream)
        return dg.AssetCheckResult(
            passed=missing is None,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={"watches": stream.namespace},
            description=missing,
        )

    checks = [lag, headroom, orphans]
    if stream.scope != "cluster":
        checks.append(namespace)
    return checks
