"""Per stream, the compaction of `current`: a job, and a sensor that starts it when due.

Compaction runs apart from the sync job, so a scheduled run never waits for it. The sensor
asks the state store only (no Spark) whether the newest version's deltas have grown past the
stream's `compaction:` settings, and the job reports the new base as an observation of
`current` (the rows are the same; only their layout changed).
"""

import dagster as dg

from jobs.catalog import current_table
from jobs.transform import compact, delta_debt
from orchestration.assets import keys, pool
from orchestration.metadata import compaction_metadata, explained, table_metadata
from orchestration.resources import LakeResource, SparkResource, StateStoreResource
from tidemark.config import StreamConfig


def compaction_job_name(stream: StreamConfig) -> str:
    return f"{stream.name}_compact"


def compaction_job(stream: StreamConfig) -> dg.JobDefinition:
    @dg.op(name=f"{stream.name}__compact_current", pool=pool(stream))
    def compact_current(
        context: dg.OpExecutionContext,
        state: StateStoreResource,
        lake: LakeResource,
        spark: SparkResource,
    ) -> None:
        """Rewrite the newest version of `current` (a base and its deltas) as one base."""
        with explained():
            debt = delta_debt(state.store(), stream.name)
            result = compact(spark.session(), state.store(), lake.path, stream)
            table = current_table(state.store(), lake.path, stream.name, with_files=False)
        metadata = {**(table_metadata(table) if table else {}), **compaction_metadata(result, debt)}
        context.log_event(dg.AssetObservation(asset_key=keys(stream)["current"], metadata=metadata))

    @dg.job(
        name=compaction_job_name(stream),
        executor_def=dg.in_process_executor,
        description=f"Compact the current-state table of {stream.namespace} into one base.",
    )
    def compaction() -> None:
        compact_current()

    return compaction


def compaction_sensor(stream: StreamConfig) -> dg.SensorDefinition:
    @dg.sensor(
        name=f"{stream.name}_compaction_sensor",
        job_name=compaction_job_name(stream),
        minimum_interval_seconds=60,
        default_status=dg.DefaultSensorStatus.RUNNING,
    )
    def due(context: dg.SensorEvaluationContext, state: StateStoreResource) -> dg.SensorResult:
        """Starts the compaction once the deltas pass `compaction.delta_ratio` of the base's
        rows or number `compaction.max_deltas` (one run per version)."""
        debt = delta_debt(state.store(), stream.name)
        settings = stream.compaction
        if debt.version is None or not debt.due(settings.delta_ratio, settings.max_deltas):
            return dg.SensorResult(skip_reason=f"{debt.deltas} deltas: not due")
        return dg.SensorResult(run_requests=[dg.RunRequest(run_key=f"v{debt.version}")])

    return due
