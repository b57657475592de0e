"""The capture's assets per stream: `raw_changes` (the drain) and `replay` (backfill by
operation time); the transform's are in `orchestration.transform_assets`."""

import warnings
from datetime import datetime
from typing import Any

import dagster as dg

from jobs.capture import drain, replay
from jobs.ops import stream_status
from jobs.progress import ProgressCallback, describe, sparse
from jobs.raw_zone import stream_root
from orchestration.keys import keys, pool
from orchestration.metadata import drain_metadata, explained
from orchestration.resources import (
    LakeResource,
    MongoResource,
    StateStoreResource,
)
from tidemark.config import StreamConfig


class DrainConfig(dg.Config):
    """Launchpad settings of a raw_changes run."""

    resnapshot: bool = False  # copy the collection(s) afresh first (see README, Snapshots)


def progress_log(context: dg.AssetExecutionContext) -> ProgressCallback:
    """Long work's progress in the run's log: each phase, the end, and a line per 10 s."""
    return sparse(lambda progress: context.log.info(describe(progress)), every_s=10)


def replay_partitions(
    stream: StreamConfig, oplog_first: datetime | None = None
) -> dg.TimeWindowPartitionsDefinition:
    """The windows from the one holding the oplog's first entry as the stream's last drain saw
    it (`oplog_first`, from the state store: a load reads no MongoDB), never before
    `replay.start`, to the open one. Without a drain yet, from `replay.start`. A window the
    oplog no longer holds by the time it runs, or the open one, is refused in its run with
    Tidemark's message (`ReplayRefused`); the check `oplog_reach` says which can run."""
    minutes = stream.replay.cron.split()[0] != "0"

    def windows(start: datetime) -> dg.TimeWindowPartitionsDefinition:
        return dg.TimeWindowPartitionsDefinition(
            cron_schedule=stream.replay.cron,
            start=start,
            fmt="%Y-%m-%d-%H:%M" if minutes else "%Y-%m-%d-%H:00",
            timezone="UTC",
            # The open window is a partition too, so asking for it gets the reason it cannot
            # run, not Dagster's unknown-partition error.
            end_offset=1,
        )

    configured = windows(stream.replay.start)
    if oplog_first is None or oplog_first <= stream.replay.start:
        return configured
    key = configured.get_partition_key_for_timestamp(oplog_first.timestamp())
    return windows(configured.start_time_for_partition_key(key))


def stream_assets(
    stream: StreamConfig, oplog_first: datetime | None = None
) -> list[dg.AssetsDefinition]:
    k = keys(stream)
    raw_zone = _raw_zone_asset(stream)

    @dg.asset(key=k["raw_changes"], **raw_zone)
    def raw_changes(
        context: dg.AssetExecutionContext,
        config: DrainConfig,
        mongo: MongoResource,
        state: StateStoreResource,
        lake: LakeResource,
    ) -> dg.MaterializeResult:
        """The stream's raw zone. Each run drains the change stream from the stored resume token
        to its postBatchResumeToken (or the run's horizon, or its budget), writes the events as
        Hive-partitioned Parquet and commits the files and the new token in one transaction."""
        with explained():
            result = drain(
                stream,
                mongo.raw_client(),
                state.store(),
                lake.path,
                resnapshot=config.resnapshot,
                progress=progress_log(context),
            )
            status = stream_status(stream, mongo.raw_client(), state.store())
        for warning in result.warnings:
            context.log.warning(warning)
        location = stream_root(lake.path, stream.name)
        return dg.MaterializeResult(
            metadata=drain_metadata(result, status, location),
            # The newest committed batch: unchanged by a quiet drain, so the transform's
            # automation condition (`on_new_raw_batches`) does not fire for it.
            data_version=dg.DataVersion(status.last_batch.id if status.last_batch else "none"),
        )

    with warnings.catch_warnings():
        # Single-run backfills (a partition range in one run) need backfill_policy, still beta.
        warnings.simplefilter("ignore", dg.BetaWarning)
        replay_window = _replay_asset(stream, k, raw_zone, oplog_first)
    return [raw_changes, replay_window]


def _raw_zone_asset(stream: StreamConfig) -> dict[str, Any]:
    """What both assets of a stream's raw zone (`raw_changes`, `replay`) are: in the stream's
    group and its pool (so they never write at once), of the same kinds and metadata."""
    return {
        "group_name": stream.name,
        "pool": pool(stream),
        "kinds": {"mongodb", "parquet"},
        "metadata": {"namespace": stream.namespace, "scope": stream.scope},
    }


def _replay_asset(
    stream: StreamConfig,
    k: dict[str, dg.AssetKey],
    raw_zone: dict[str, Any],
    oplog_first: datetime | None,
) -> dg.AssetsDefinition:
    @dg.asset(
        key=k["replay"],
        partitions_def=replay_partitions(stream, oplog_first),
        backfill_policy=dg.BackfillPolicy.single_run(),
        **raw_zone,
    )
    def replay_window(
        context: dg.AssetExecutionContext,
        mongo: MongoResource,
        state: StateStoreResource,
        lake: LakeResource,
    ) -> dg.MaterializeResult:
        """Backfill by operation time: replays the change stream over the partition's window
        [start, end) with startAtOperationTime, into batches marked as replay. The incremental
        checkpoint never moves; the transform drops events it already has. Only windows the
        oplog still covers can be replayed: raw_changes' `oplog_window_seconds` (and `tidemark
        status`) says how far back that is; an older window is refused with a message before
        any work."""
        window = context.partition_time_window
        with explained():
            result = replay(
                stream, mongo.raw_client(), state.store(), lake.path, window.start, window.end
            )
        metadata = drain_metadata(result, None, stream_root(lake.path, stream.name))
        metadata["window_start"] = dg.MetadataValue.timestamp(window.start)
        metadata["window_end"] = dg.MetadataValue.timestamp(window.end)
        return dg.MaterializeResult(metadata=metadata)

    return replay_window
