"""The Dagster code location: `dagster dev -w workspace.yaml` loads `defs` from here.

The streams file (TIDEMARK_CONFIG, default ./streams.yaml) shapes the asset graph, so it is
read when the definitions load, entry by entry: a broken stream is reported by its own asset,
check and sensor (`config_errors`) and the others load, and so is a stream whose definitions
fail to build, whatever the exception (each stream's are built and resolved on their own
first). Every connection setting is read from the environment when a run starts. Each kind of
definition comes from its own module, one factory per stream.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import count
from pathlib import Path
from typing import Any

import dagster as dg

from orchestration.assets import replay_partitions, stream_assets
from orchestration.checks import stream_checks
from orchestration.compaction import compaction_job, compaction_sensor
from orchestration.config_errors import WHOLE_FILE, config_error_definitions
from orchestration.discovery import known_tables, oplog_reach
from orchestration.maintenance import gc_job, gc_schedule
from orchestration.notifications import notification_sensors
from orchestration.replay_reach import replay_reach_check
from orchestration.resources import env_resources
from orchestration.schedules import drain_schedule, stream_jobs
from orchestration.table_assets import TableName, TableTranslator
from orchestration.transform_assets import collections_listed_check, transform_asset
from tidemark.config import BrokenStream, StreamConfig, StreamsFile, TidemarkConfig, load_streams
from tidemark.errors import ConfigError, StreamNotLoaded
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


@dataclass
class _Parts:
    """The definitions of some streams, in the lists `dg.Definitions` takes."""

    assets: list[Any] = field(default_factory=list)
    checks: list[Any] = field(default_factory=list)
    jobs: list[Any] = field(default_factory=list)
    schedules: list[Any] = field(default_factory=list)
    sensors: list[Any] = field(default_factory=list)

    def add(self, other: _Parts) -> None:
        for name in ("assets", "checks", "jobs", "schedules", "sensors"):
            getattr(self, name).extend(getattr(other, name))

    def definitions(self, resources: dict[str, Any]) -> dg.Definitions:
        return dg.Definitions(
            assets=self.assets,
            asset_checks=self.checks,
            jobs=self.jobs,
            schedules=self.schedules,
            sensors=self.sensors,
            resources=resources,
            # Runs the automation sensor starts (the transform): one process, so one JVM at most.
            executor=dg.in_process_executor,
        )


def _stream_parts(
    stream: StreamConfig, tables: Sequence[TableName], oplog_first: datetime | None
) -> _Parts:
    """Everything one stream contributes."""
    partitions = replay_partitions(stream, oplog_first)
    return _Parts(
        assets=[*stream_assets(stream, oplog_first), transform_asset(stream, tables)],
        checks=[
            *stream_checks(stream),
            collections_listed_check(stream, TableTranslator(stream).tables(tables)),
            replay_reach_check(stream, partitions),
        ],
        jobs=[*stream_jobs(stream)] + ([compaction_job(stream)] if stream.current_table else []),
        schedules=[drain_schedule(stream)],
        sensors=[compaction_sensor(stream)] if stream.current_table else [],
    )


def _loaded_alone(
    stream: StreamConfig,
    index: int,
    tables: Sequence[TableName],
    oplog_first: datetime | None,
    resources: dict[str, Any],
) -> _Parts | BrokenStream:
    """The stream's definitions, made and resolved on their own first, so whatever fails in
    them (a name Dagster refuses, a bug) is reported by the stream's error asset and sensor
    (`config_errors`) and never stops the other streams from loading."""
    try:
        parts = _stream_parts(stream, tables, oplog_first)
        dg.Definitions.validate_loadable(parts.definitions(resources))
    except Exception as exc:
        return BrokenStream(stream.name, index, StreamNotLoaded.of(stream.name, exc))
    return parts


def build_definitions(
    config: TidemarkConfig,
    resources: dict[str, Any] | None = None,
    broken: Sequence[BrokenStream] = (),
    tables: dict[str, list[TableName]] | None = None,
    oplog_reach: dict[str, datetime] | None = None,
) -> dg.Definitions:
    """Everything Tidemark contributes for the configured streams, and a report of each
    `broken` one (and of each stream whose definitions fail to load); `resources` (from
    `build_resources`) replaces the environment's, for the demo and tests. `tables` (stream ->
    (db, collection, kind)) gives each collection table the stream's runs made an asset (a
    collection stream's own are always there); `oplog_reach` (stream -> the oplog's first entry
    as its last drain saw it) starts its replay partitions there."""
    resources = env_resources() if resources is None else resources
    made, reach = tables or {}, oplog_reach or {}
    loaded, broken = [], list(broken)
    # The valid streams hold the file's entries that are not broken, in order.
    taken = {b.index for b in broken}
    entries = (i for i in count() if i not in taken)
    everything = _Parts()
    for index, stream in zip(entries, config.streams, strict=False):
        outcome = _loaded_alone(
            stream, index, made.get(stream.name, []), reach.get(stream.name), resources
        )
        if isinstance(outcome, BrokenStream):
            broken.append(outcome)
            continue
        loaded.append(stream)
        everything.add(outcome)
    for spec, check, sensor in (config_error_definitions(b) for b in broken):
        everything.add(_Parts(assets=[spec], checks=[check], sensors=[sensor]))
    everything.add(
        _Parts(
            jobs=[gc_job(loaded)],
            schedules=[gc_schedule()],
            sensors=[
                automation_sensor(),
                *notification_sensors(config.notifications, [s.name for s in loaded]),
            ],
        )
    )
    return everything.definitions(resources)


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
    state_url = Settings.from_env().state_url
    return build_definitions(
        config,
        broken=streams_file.broken,
        tables=known_tables(state_url, streams_file.streams),
        oplog_reach=oplog_reach(state_url),
    )


defs = location_definitions(os.environ.get("TIDEMARK_CONFIG", "streams.yaml"))
