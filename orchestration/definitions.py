"""The Dagster code location: `dagster dev -w workspace.yaml` loads `defs` from here.

The streams file (TIDEMARK_CONFIG, default ./streams.yaml) shapes the asset graph, so it is
read when the definitions load, entry by entry: a broken stream is reported by its own asset,
check and sensor (`config_errors`) and the others load. Every connection setting is read from
the environment when a run starts. Each kind of definition comes from its own module, one
factory per stream.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import dagster as dg

from orchestration.assets import replay_partitions, stream_assets
from orchestration.checks import stream_checks
from orchestration.collection_checks import collections_listed_check
from orchestration.compaction import compaction_job, compaction_sensor
from orchestration.config_errors import WHOLE_FILE, config_error_definitions
from orchestration.discovery import first_checkpoints, known_tables
from orchestration.keys import TableName
from orchestration.maintenance import gc_job, gc_schedule
from orchestration.notifications import notification_sensors
from orchestration.replay_reach import replay_reach_check
from orchestration.resources import env_resources
from orchestration.schedules import drain_schedule, stream_jobs
from orchestration.transform_assets import stream_tables, transform_asset
from tidemark.config import BrokenStream, StreamsFile, TidemarkConfig, load_streams
from tidemark.errors import ConfigError
from tidemark.settings import Settings


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
    config: TidemarkConfig,
    resources: dict[str, Any] | None = None,
    broken: Sequence[BrokenStream] = (),
    first_checkpoints: dict[str, datetime] | None = None,
    tables: dict[str, list[TableName]] | None = None,
) -> dg.Definitions:
    """Everything Tidemark contributes for the configured streams, and a report of each
    `broken` one; `resources` (from `build_resources`) replaces the environment's, for the demo
    and tests. `first_checkpoints` (stream -> time) starts each replay's partitions at its
    stream's first checkpoint; `tables` (stream -> (db, collection, kind)) gives each
    collection table the stream's runs made an asset (a collection stream's own are always
    there)."""
    streams = config.streams
    firsts = first_checkpoints or {}
    made = tables or {}
    reports = [config_error_definitions(b) for b in broken]
    return dg.Definitions(
        assets=[a for s in streams for a in stream_assets(s, firsts.get(s.name))]
        + [transform_asset(s, made.get(s.name, [])) for s in streams]
        + [spec for spec, _, _ in reports],
        asset_checks=[check for stream in streams for check in stream_checks(stream)]
        + [collections_listed_check(s, stream_tables(s, made.get(s.name, []))) for s in streams]
        + [replay_reach_check(s, replay_partitions(s, firsts.get(s.name))) for s in streams]
        + [check for _, check, _ in reports],
        jobs=[job for stream in streams for job in stream_jobs(stream)]
        + [compaction_job(stream) for stream in streams if stream.current_table]
        + [gc_job(list(streams))],
        schedules=[drain_schedule(stream) for stream in streams] + [gc_schedule()],
        sensors=[compaction_sensor(stream) for stream in streams if stream.current_table]
        + [sensor for _, _, sensor in reports]
        + [automation_sensor()]
        + notification_sensors(config.notifications, [s.name for s in streams]),
        resources=env_resources() if resources is None else resources,
        # Runs the automation sensor starts (the transform): one process, so one JVM at most.
        executor=dg.in_process_executor,
    )


def location_definitions(path: Path | str) -> dg.Definitions:
    """The code location's definitions: the valid streams, and every broken one reported."""
    try:
        streams_file = load_streams(path)
    except ConfigError as exc:
        # Nothing in the file can be trusted: no stream loads, the error is reported as one.
        streams_file = StreamsFile(Path(path), [], [BrokenStream(WHOLE_FILE, -1, exc)])
    config = TidemarkConfig.model_construct(
        streams=streams_file.streams, notifications=streams_file.notifications
    )
    # When each stream took its first checkpoint: the replay partitions start there.
    state_url = Settings.from_env().state_url
    return build_definitions(
        config,
        broken=streams_file.broken,
        first_checkpoints=first_checkpoints(state_url),
        tables=known_tables(state_url, streams_file.streams),
    )


defs = location_definitions(os.environ.get("TIDEMARK_CONFIG", "streams.yaml"))
