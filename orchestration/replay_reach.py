"""Which replay windows can run: the partitions are every window from `replay.start` to the
open one (`orchestration.assets.replay_partitions`), and a check on `replay` reports the
oplog's first entry and how many partitions lie before it (those a run would refuse)."""

from __future__ import annotations

import dagster as dg

from jobs.ops import stream_status
from orchestration.keys import keys
from orchestration.metadata import explained
from orchestration.resources import MongoResource, StateStoreResource
from tidemark.config import StreamConfig
from tidemark.tokens import moment_text


def replay_reach_check(
    stream: StreamConfig, partitions_def: dg.TimeWindowPartitionsDefinition
) -> dg.AssetChecksDefinition:
    @dg.asset_check(asset=keys(stream)["replay"], name="oplog_reach", blocking=False)
    def oplog_reach(mongo: MongoResource, state: StateStoreResource) -> dg.AssetCheckResult:
        """Which replay windows the oplog still holds: its first entry, the first partition
        that can run, and how many start before it (a run of those is refused)."""
        with explained():
            status = stream_status(stream, mongo.raw_client(), state.store())
        all_keys = partitions_def.get_partition_keys()
        first = status.oplog_first
        if first is None:
            return dg.AssetCheckResult(
                passed=True,
                metadata={"partitions": len(all_keys)},
                description="the oplog cannot be read here (mongos, or no privilege on "
                "local.oplog.rs): a window older than it is refused when it runs",
            )
        reachable = [k for k in all_keys if partitions_def.start_time_for_partition_key(k) >= first]
        out_of_reach = len(all_keys) - len(reachable)
        return dg.AssetCheckResult(
            passed=True,
            metadata={
                "oplog_first_time": dg.MetadataValue.timestamp(first),
                "partitions": len(all_keys),
                "partitions_out_of_reach": out_of_reach,
                "first_replayable_partition": reachable[0] if reachable else "none",
            },
            description=f"the oplog holds {moment_text(first)} onwards: "
            + (
                f"{out_of_reach} of {len(all_keys)} partitions start before it and cannot run; "
                if out_of_reach
                else "every partition can run; "
            )
            + (f"the first that can is {reachable[0]}" if reachable else "none can yet"),
        )

    return oplog_reach
