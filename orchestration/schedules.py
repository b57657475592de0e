"""Per stream, the jobs that run its assets (drain, sync, replay, resnapshot) and the drain's
schedule. The schedule runs the drain alone (cheap, no Spark); the transform follows by its
automation condition (`orchestration.transform_assets.transform_condition`), only when a batch
is new."""

from __future__ import annotations

from typing import Any

import dagster as dg

from orchestration.keys import keys
from tidemark.config import StreamConfig

# What `define_asset_job` returns: Dagster does not export the class.
AssetJob = Any


def sync_job_name(stream: StreamConfig) -> str:
    return f"{stream.name}_sync"


def drain_job_name(stream: StreamConfig) -> str:
    return f"{stream.name}_drain"


def drain_job(stream: StreamConfig) -> AssetJob:
    return dg.define_asset_job(
        drain_job_name(stream),
        selection=dg.AssetSelection.assets(keys(stream)["raw_changes"]),
        executor_def=dg.in_process_executor,
        description=f"Drain {stream.namespace} into the raw zone (the transform follows by its "
        "automation condition when the drain committed a new batch).",
    )


def _drain_and_fold(stream: StreamConfig) -> dg.AssetSelection:
    """The drain, the fold and every collection table of the stream (its group, but replay)."""
    return dg.AssetSelection.groups(stream.name) - dg.AssetSelection.assets(keys(stream)["replay"])


def sync_job(stream: StreamConfig) -> AssetJob:
    return dg.define_asset_job(
        sync_job_name(stream),
        selection=_drain_and_fold(stream),
        # One process for the drain and the Spark step: one JVM per run, no pickling between.
        executor_def=dg.in_process_executor,
        description=f"Drain {stream.namespace} and fold it into its collections' tables at once "
        "(by hand; the schedule runs the drain alone).",
    )


def replay_job(stream: StreamConfig) -> AssetJob:
    return dg.define_asset_job(
        f"{stream.name}_replay",
        selection=dg.AssetSelection.assets(keys(stream)["replay"]),
        executor_def=dg.in_process_executor,
        description=f"Replay operation-time windows of {stream.namespace}.",
    )


def resnapshot_job(stream: StreamConfig) -> AssetJob:
    return dg.define_asset_job(
        f"{stream.name}_resnapshot",
        selection=_drain_and_fold(stream),
        executor_def=dg.in_process_executor,
        config={"ops": {f"{stream.name}__raw_changes": {"config": {"resnapshot": True}}}},
        description=f"Copy {stream.namespace} afresh (a re-snapshot), then drain and fold it.",
    )


def stream_jobs(stream: StreamConfig) -> list[AssetJob]:
    return [drain_job(stream), sync_job(stream), replay_job(stream), resnapshot_job(stream)]


def drain_schedule(stream: StreamConfig) -> dg.ScheduleDefinition:
    """The drain job on the stream's `schedule:` cron (UTC), on by default."""
    return dg.ScheduleDefinition(
        name=f"{stream.name}_schedule",
        # By name: the job itself is listed once, in `stream_jobs`.
        job_name=drain_job_name(stream),
        cron_schedule=stream.schedule,
        execution_timezone="UTC",
        default_status=dg.DefaultScheduleStatus.RUNNING,
    )
