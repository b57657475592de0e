"""The Dagster code location: `dagster dev -w workspace.yaml` loads `defs` from here.

The streams file (TIDEMARK_CONFIG, default ./streams.yaml) shapes the asset graph, so it is
read when the definitions load; every connection setting is an EnvVar, resolved at run time.
Each kind of definition comes from its own module, one factory per stream.
"""

from __future__ import annotations

import os
from typing import Any

import dagster as dg

from orchestration.assets import stream_assets
from orchestration.checks import stream_checks
from orchestration.compaction import compaction_job, compaction_sensor
from orchestration.resources import env_resources
from orchestration.schedules import stream_jobs, sync_schedule
from tidemark.config import TidemarkConfig, load_config


def automation_sensor() -> dg.AutomationConditionSensorDefinition:
    """Evaluates the assets' automation conditions (the transform's `on_new_raw_batches`); on
    by default, so `dagster dev` folds new batches without a click."""
    return dg.AutomationConditionSensorDefinition(
        "tidemark_automation",
        target=dg.AssetSelection.all(),
        default_status=dg.DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=30,
    )


def build_definitions(
    config: TidemarkConfig, resources: dict[str, Any] | None = None
) -> dg.Definitions:
    """Everything Tidemark contributes for the configured streams; `resources` (from
    `build_resources`) replaces the EnvVar ones, for the demo and tests."""
    streams = config.streams
    return dg.Definitions(
        assets=[asset for stream in streams for asset in stream_assets(stream)],
        asset_checks=[check for stream in streams for check in stream_checks(stream)],
        jobs=[job for stream in streams for job in stream_jobs(stream)]
        + [compaction_job(stream) for stream in streams if stream.current_table],
        schedules=[sync_schedule(stream) for stream in streams],
        sensors=[compaction_sensor(stream) for stream in streams if stream.current_table]
        + [automation_sensor()],
        resources=env_resources() if resources is None else resources,
        # Runs the automation sensor starts (the transform): one process, so one JVM at most.
        executor=dg.in_process_executor,
    )


defs = build_definitions(load_config(os.environ.get("TIDEMARK_CONFIG", "streams.yaml")))
