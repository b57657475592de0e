"""Running a stream's job in this process, for `tidemark demo`: the same definitions as the
code location, with resources built from the demo's settings instead of EnvVars."""

from __future__ import annotations

from typing import Any

import dagster as dg

from orchestration.definitions import build_definitions
from orchestration.resources import build_resources
from orchestration.schedules import sync_job_name
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
    return build_definitions(config, resources)


def run_sync(defs: dg.Definitions, stream: StreamConfig) -> Any:
    """One run of `<stream>_sync` in this process, recorded in the DAGSTER_HOME instance."""
    job = defs.resolve_job_def(sync_job_name(stream))
    return job.execute_in_process(instance=dg.DagsterInstance.get(), run_config=QUIET)


def materialization_metadata(result: Any, name: str) -> dict[str, Any]:
    for event in result.get_asset_materialization_events():
        if event.asset_key.path[-1] == name:
            return {k: v.value for k, v in event.materialization.metadata.items()}
    return {}


def check_outcomes(result: Any) -> dict[str, str]:
    """Check name -> 'ok' or the severity of its failure."""
    return {
        e.asset_check_evaluation_data.check_name: (
            "ok"
            if e.asset_check_evaluation_data.passed
            else e.asset_check_evaluation_data.severity.value
        )
        for e in result.all_events
        if e.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION
    }
