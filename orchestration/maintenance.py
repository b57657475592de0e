"""The lake's garbage collection from Dagster: the job `tidemark_gc` and its nightly schedule.

The same work as `tidemark gc` (`jobs.ops.collect_garbage`): raw files no committed batch
lists, under the raw writers' leases, and a VACUUM of each stream's Delta tables, under its
transform lease alone, so drains and replays go on while it runs. The schedule is off by
default, as VACUUM is in most lakehouses: a team turns it on in the UI. What each stream's sweep
did is recorded as observations of its `raw_changes` and `curated` assets.
"""

import dagster as dg

from jobs.ops import collect_garbage
from orchestration.keys import keys
from orchestration.metadata import explained
from orchestration.resources import LakeResource, SparkResource, StateStoreResource
from tidemark.config import StreamConfig

GC_JOB = "tidemark_gc"


class GcConfig(dg.Config):
    """Launchpad settings of a gc run."""

    # Spares raw files a writer on a host with a skewed clock might still be renaming into place.
    min_age_seconds: float = 60.0


def gc_job(streams: list[StreamConfig]) -> dg.JobDefinition:
    configured = {s.name: s for s in streams}

    @dg.op(name="collect_garbage")
    def sweep(
        context: dg.OpExecutionContext,
        config: GcConfig,
        state: StateStoreResource,
        lake: LakeResource,
        spark: SparkResource,
    ) -> None:
        """Removes raw orphans and VACUUMs the curated tables of every stream in the lake."""
        with explained():
            sweeps = collect_garbage(
                lake.path, state.store(), config.min_age_seconds, spark=spark.session
            )
        for found in sweeps:
            for note in (found.note, found.curated_note):
                if note:
                    context.log.warning(f"{found.stream}: {note}")
            removed = len(found.result.removed) if found.result else 0
            context.log.info(
                f"{found.stream}: {removed} raw files removed, "
                f"{len(found.curated or [])} Delta files vacuumed"
            )
            stream = configured.get(found.stream)
            if stream is None:
                continue  # in the lake, no longer in the streams file: no asset to observe
            if found.result is not None:
                context.log_event(
                    dg.AssetObservation(
                        asset_key=keys(stream)["raw_changes"],
                        metadata={
                            "gc_files_removed": removed,
                            "gc_files_kept_young": len(found.result.kept_young),
                        },
                    )
                )
            if found.curated is not None:
                context.log_event(
                    dg.AssetObservation(
                        asset_key=keys(stream)["curated"],
                        metadata={"vacuum_files_deleted": len(found.curated)},
                    )
                )

    @dg.job(
        name=GC_JOB,
        executor_def=dg.in_process_executor,
        description="Remove raw files no committed batch lists and VACUUM the Delta tables of "
        "every stream (as `tidemark gc`).",
    )
    def gc() -> None:
        sweep()

    return gc


def gc_schedule() -> dg.ScheduleDefinition:
    """Nightly at 03:00 UTC; off until turned on."""
    return dg.ScheduleDefinition(
        name=f"{GC_JOB}_schedule",
        job_name=GC_JOB,
        cron_schedule="0 3 * * *",
        execution_timezone="UTC",
        default_status=dg.DefaultScheduleStatus.STOPPED,
    )
