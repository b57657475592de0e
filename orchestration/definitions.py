"""The Dagster code location: `dagster dev -w workspace.yaml` loads `defs` from here.

The streams file (TIDEMARK_CONFIG, default ./streams.yaml) shapes the asset graph, so it is
read when the definitions load; every connection setting is an EnvVar, resolved at run time.
"""

from __future__ import annotations

import os
from typing import Any

import dagster as dg

from orchestration.assets import keys, stream_assets
from orchestration.checks import stream_checks
from orchestration.resources import env_resources
from tidemark.config import StreamConfig, TidemarkConfig, load_config


def sync_job_name(stream: StreamConfig) -> str:
    return f"{stream.name}_sync"


def resnapshot_job_name(stream: StreamConfig) -> str:
    return f"{stream.name}_resnapshot"


def replay_job_name(stream: StreamConfig) -> str:
    return f"{stream.name}_replay"


def stream_jobs(stream: StreamConfig) -> tuple[list[Any], list[dg.ScheduleDefinition]]:
    k = keys(stream)
    selected = [k["raw_changes"], k["changes"]] + ([k["current"]] if stream.current_table else [])
    sync = dg.define_asset_job(
        sync_job_name(stream),
        selection=dg.AssetSelection.assets(*selected),
        # One process for the drain and the Spark step: one JVM per run, no pickling between.
        executor_def=dg.in_process_executor,
        description=f"Drain {stream.namespace} and fold it into changes and current.",
    )
    replay_job = dg.define_asset_job(
        replay_job_name(stream),
        selection=dg.AssetSelection.assets(k["replay"]),
        executor_def=dg.in_process_executor,
        description=f"Replay operation-time windows of {stream.namespace}.",
    )
    resnapshot = dg.define_asset_job(
        resnapshot_job_name(stream),
        selection=dg.AssetSelection.assets(*selected),
        executor_def=dg.in_process_executor,
        config={"ops": {f"{stream.name}__raw_changes": {"config": {"resnapshot": True}}}},
        description=f"Copy {stream.namespace} afresh (a re-snapshot), then drain and fold it.",
    )
    schedule = dg.ScheduleDefinition(
        name=f"{stream.name}_schedule",
        job=sync,
        cron_schedule=stream.schedule,
        execution_timezone="UTC",
        default_status=dg.DefaultScheduleStatus.RUNNING,
    )
    return [sync, replay_job, resnapshot], [schedule]


def build_definitions(
    config: TidemarkConfig, resources: dict[str, Any] | None = None
) -> dg.Definitions:
    assets: list[Any] = []
    checks: list[Any] = []
    jobs: list[Any] = []
    schedules: list[Any] = []
    for stream in config.streams:
        assets += stream_assets(stream)
        checks += stream_checks(stream)
        stream_job_list, stream_schedules = stream_jobs(stream)
        jobs += stream_job_list
        schedules += stream_schedules
    return dg.Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=jobs,
        schedules=schedules,
        resources=resources if resources is not None else env_resources(),
    )


defs = build_definitions(load_config(os.environ.get("TIDEMARK_CONFIG", "streams.yaml")))
