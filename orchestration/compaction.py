"""Per stream, the compaction of `current`: a job, and a sensor that starts it when due.

Compaction (Delta OPTIMIZE and a purge of deletion vectors) runs apart from the sync job, so a
scheduled run never waits for it. The sensor asks the state store only (no Spark) whether
enough runs merged since the last one (the stream's `compaction:` settings), and the job
reports each collection's `current` as an observation (the rows are the same; only their files
changed), and what it did as one of `curated`.
"""

import dagster as dg

from jobs.catalog import tables
from jobs.curated_zone import DATABASE_EVENTS
from jobs.transform import compact, delta_debt
from orchestration.keys import keys, pool
from orchestration.metadata import compaction_metadata, explained
from orchestration.resources import LakeResource, SparkResource, StateStoreResource
from orchestration.table_assets import TableTranslator, table_metadata
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
        """OPTIMIZE every `current` table of the stream and purge its deletion vectors."""
        with explained():
            debt = delta_debt(state.store(), stream.name)
            result = compact(spark.session(), state.store(), lake.path, stream)
            now = [t for t in tables(state.store(), lake.path, stream.name) if t.table == "current"]
        translator = TableTranslator(stream)
        for table in now:
            coll = table.coll or DATABASE_EVENTS
            key = translator.key((table.db or "", coll, "current"))
            context.log_event(dg.AssetObservation(asset_key=key, metadata=table_metadata(table)))
        metadata = compaction_metadata(result, debt)
        context.log_event(dg.AssetObservation(asset_key=keys(stream)["curated"], metadata=metadata))

    @dg.job(
        name=compaction_job_name(stream),
        executor_def=dg.in_process_executor,
        description=f"OPTIMIZE the current-state tables of {stream.namespace} (Delta Lake).",
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
        """Starts the compaction once the runs that merged since the last one number
        `compaction.max_deltas`, or folded `compaction.delta_ratio` of the rows (one run per
        version)."""
        debt = delta_debt(state.store(), stream.name)
        settings = stream.compaction
        if debt.run is None or not debt.due(settings.delta_ratio, settings.max_deltas):
            return dg.SensorResult(skip_reason=f"{debt.deltas} deltas: not due")
        return dg.SensorResult(run_requests=[dg.RunRequest(run_key=f"v{debt.run}")])

    return due
