"""`tidemark status`: per stream, where its position is and what state it is in, as a table
for people or as JSON (`--json`) for scripts and monitoring."""

from __future__ import annotations

from jobs.ops import stream_status
from tidemark.cli.runtime import Runtime
from tidemark.cli.table import format_table, human_seconds, iso_utc, print_json


def status_table(runtime: Runtime) -> int:
    rows = []
    warnings: list[str] = []
    for stream in runtime.config.streams:
        s = stream_status(stream, runtime.client, runtime.store)
        last = s.last_batch
        rows.append(
            [
                s.stream,
                s.namespace,
                f"{s.position_time:%Y-%m-%d %H:%M:%S}" if s.position_time else "no position yet",
                human_seconds(s.lag_seconds),
                f"{last.committed_at:%Y-%m-%d %H:%M:%S} ({last.event_count:,} events)"
                if last
                else "-",
                human_seconds(s.oplog_window_seconds),
                human_seconds(s.headroom_seconds),
                s.condition,
            ]
        )
        warnings += s.warnings()
    print(
        format_table(
            [
                "stream",
                "watches",
                "token time (UTC)",
                "lag",
                "last batch (UTC)",
                "oplog window",
                "headroom",
                "state",
            ],
            rows,
        )
    )
    for warning in warnings:
        print(f"warning: {warning}.")
    return 0


def status_json(runtime: Runtime) -> int:
    """`status --json`: the table's facts with numbers as numbers (seconds, counts, bytes)
    and times as ISO 8601 UTC; null where the table shows `-`."""
    streams = []
    for stream in runtime.config.streams:
        s = stream_status(stream, runtime.client, runtime.store)
        last = s.last_batch
        streams.append(
            {
                "stream": s.stream,
                "watches": s.namespace,
                "token_time": iso_utc(s.position_time),
                "lag_seconds": s.lag_seconds,
                "batches": s.batches,
                "last_batch": None
                if last is None
                else {
                    "id": last.id,
                    "source": last.source,
                    "committed_at": iso_utc(last.committed_at),
                    "events": last.event_count,
                    "bytes": last.bytes,
                },
                "oplog_first": iso_utc(s.oplog_first),
                "oplog_window_seconds": s.oplog_window_seconds,
                "headroom_seconds": s.headroom_seconds,
                "definition": "changed" if s.definition_changed else "ok",
                "state": s.condition,
                "warnings": s.warnings(),
            }
        )
    print_json({"streams": streams})
    return 0
