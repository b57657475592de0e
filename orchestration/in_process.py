"""Running a stream's job in this process, for `tidemark demo`: the same definitions as the
code location (collection tables discovered from the state store as it loads them), with
resources built from the demo's settings instead of EnvVars."""

from __future__ import annotations

from typing import Any

import dagster as dg

from orchestration.definitions import build_definitions
from orchestration.discovery import known_tables, oplog_reach
from orchestration.resources import build_resources
from orchestration.schedules import sync_job_name
from orchestration.table_assets import TableName, table_of
from tidemark.config import StreamConfig, TidemarkConfig

QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def local_definitions(
    config: TidemarkConfig,
    mongodb_uri: str,
    state_url: str,
    lake_root: str,
    spark_master: str = "local[*]",
    spark_remote: str = "",
) -> dg.Definitions:
    resources = build_resources(
        mongodb_uri=mongodb_uri,
        state_url=state_url,
        lake_root=lake_root,
        spark_master=spark_master,
        spark_remote=spark_remote,
    )
    return build_definitions(
        config,
        resources,
        tables=known_tables(state_url, config.streams),
        oplog_reach=oplog_reach(state_url),
    )


def listed_tables(defs: dg.Definitions, stream: StreamConfig) -> set[TableName]:
    """The stream's collection tables the definitions have assets for."""
    found = (table_of(key, stream.name) for key in defs.resolve_all_asset_keys())
    return {table for table in found if table is not None}


def table_named(path: tuple[str, ...], stream: StreamConfig) -> TableName | None:
    """(db, collection, kind) of a materialized asset's key path, if it is a table of `stream`."""
    return table_of(dg.AssetKey(list(path)), stream.name)


def run_checks(defs: dg.Definitions, stream: StreamConfig) -> Any:
    """One run of every check of the stream's assets, without materializing anything: after a
    run that made collection tables the definitions did not know yet (rebuilt definitions
    list them), so their checks are evaluated too."""
    name = f"{stream.name}_checks"
    assets = [key for key in defs.resolve_all_asset_keys() if key.path[0] == stream.name]
    job = dg.define_asset_job(
        name,
        selection=dg.AssetSelection.checks_for_assets(*assets),
        executor_def=dg.in_process_executor,
    )
    merged = dg.Definitions.merge(defs, dg.Definitions(jobs=[job]))
    return merged.resolve_job_def(name).execute_in_process(
        instance=dg.DagsterInstance.get(), run_config=QUIET
    )


def run_sync(defs: dg.Definitions, stream: StreamConfig) -> Any:
    """One run of `<stream>_sync` in this process, recorded in the DAGSTER_HOME instance."""
    job = defs.resolve_job_def(sync_job_name(stream))
    return job.execute_in_process(instance=dg.DagsterInstance.get(), run_config=QUIET)


def materializations(result: Any) -> dict[tuple[str, ...], dict[str, Any]]:
    """Asset key path -> the metadata of its materialization in the run (a collection newer
    than the definitions included: the run reports it by its key too)."""
    return {
        tuple(event.asset_key.path): {k: v.value for k, v in event.materialization.metadata.items()}
        for event in result.get_asset_materialization_events()
    }


def check_outcomes(result: Any) -> dict[tuple[tuple[str, ...], str], str]:
    """(asset key path, check name) -> 'ok' or the severity of its failure."""
    outcomes = {}
    for event in result.all_events:
        if event.event_type != dg.DagsterEventType.ASSET_CHECK_EVALUATION:
            continue
        data = event.asset_check_evaluation_data
        outcome = "ok" if data.passed else data.severity.value
        outcomes[(tuple(data.asset_key.path), data.check_name)] = outcome
    return outcomes
