"""The `tidemark` command for operators: drain, transform, status, tables, reset, gc, the
embedded mongod, the local Spark Connect server, demo.

Every `TidemarkError` is printed as its one-paragraph message (exit code 2), never a traceback.
"""

from __future__ import annotations

import argparse
import getpass
import socket
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from resources.embedded_mongo import ensure_embedded, stop_embedded
from resources.spark_server import DEFAULT_PORT
from tidemark.cli.curated import tables_command, transform_command
from tidemark.cli.progress import terminal_progress
from tidemark.cli.runtime import Runtime, StreamFailures, open_runtime
from tidemark.cli.table import format_table, human_bytes
from tidemark.errors import StreamArgumentMissing, TidemarkError, WorkloadStreamMissing
from tidemark.settings import Settings, home_notice
from tidemark.tokens import moment_text, ts_to_datetime

if TYPE_CHECKING:
    from jobs.capture import DrainResult

# The pipeline's modules (`jobs.*`) are imported by the commands that use them: a `transform`
# or `tables` then starts without the capture's imports (a quiet run is mostly start-up).


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tidemark",
        description="MongoDB change streams into a Parquet lake, exactly once.",
        epilog="Environment: MONGODB_URI, TIDEMARK_CONFIG, TIDEMARK_STATE_URL, TIDEMARK_LAKE, "
        "TIDEMARK_HOME, TIDEMARK_SPARK_REMOTE, TIDEMARK_SPARK_MASTER (see README).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("drain", help="drain one stream (or all) now and commit")
    p.add_argument("stream", nargs="?", help="stream name; omit with --all")
    p.add_argument("--all", action="store_true", help="drain every stream in the config")
    p = sub.add_parser(
        "transform", help="fold committed raw batches into changes and current (as Dagster does)"
    )
    p.add_argument("stream", nargs="?", help="stream name; omit with --all")
    p.add_argument("--all", action="store_true", help="transform every stream in the config")
    p = sub.add_parser(
        "status", help="checkpoint time, lag, last batch and oplog headroom per stream"
    )
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p = sub.add_parser("tables", help="per stream: newest version, rows, manifest and columns")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p = sub.add_parser("reset", help="move a stream's checkpoint explicitly (recorded)")
    p.add_argument("stream")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--to-now", action="store_true", help="start from the current time")
    where.add_argument(
        "--to-time",
        type=_utc_datetime,
        metavar="T",
        help="start from T (ISO 8601, UTC unless it has an offset)",
    )
    p = sub.add_parser("resnapshot", help="copy a stream's collections afresh, then drain")
    p.add_argument("stream")
    p = sub.add_parser("gc", help="delete raw files that no committed batch lists")
    p.add_argument(
        "--min-age",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="keep orphans younger than this (default 60)",
    )
    p = sub.add_parser("mongod", help="the embedded mongod under the Tidemark home")
    p.add_argument("action", choices=["start", "stop", "uri"])
    p = sub.add_parser("spark", help="the local Spark Connect server under the Tidemark home")
    p.add_argument("action", choices=["start", "stop", "status", "url"])
    p.add_argument(
        "--port",
        type=int,
        help=f"port on 127.0.0.1 (default: the last one, else {DEFAULT_PORT}, else a free one)",
    )
    p.add_argument("--driver-memory", default="2g", help="the server JVM's heap (default 2g)")
    p.add_argument(
        "--master",
        default="local[*]",
        help="the cluster the server drives, e.g. spark://host:7077 (default local[*])",
    )
    p.add_argument(
        "--executor-python",
        metavar="PATH",
        help="the cluster's Python for UDFs, on every worker (default: this venv's)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="how long start waits for the server to answer (default 120)",
    )
    p = sub.add_parser("s3", help="a local S3 server under the Tidemark home (make demo LAKE=s3)")
    p.add_argument("action", choices=["start", "stop"])
    p = sub.add_parser("demo", help="sample workload, drain and summary (make demo)")
    p.add_argument("--orders", type=int, default=500)
    p = sub.add_parser("ui", help="the Dagster UI on 127.0.0.1 (make ui); `ui stop` stops it")
    p.add_argument("action", nargs="?", choices=["start", "stop"], default="start")
    p.add_argument("--port", type=int, default=3000)
    p = sub.add_parser(
        "metrics", help="Prometheus metrics per stream: printed once, or `metrics serve`d"
    )
    p.add_argument("action", nargs="?", choices=["show", "serve"], default="show")
    p.add_argument("--host", default="127.0.0.1", help="serve: address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=9464, help="serve: port (default 9464; 0: free)")
    p = sub.add_parser("workload", help="keep writing the sample workload, for live runs")
    p.add_argument("--orders", type=int, default=100, help="orders per round (default 100)")
    p.add_argument(
        "--every",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="seconds between rounds (default 10)",
    )
    p.add_argument("--rounds", type=int, default=0, help="stop after N rounds (default: never)")
    return parser


def _utc_datetime(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO 8601 time, e.g. 2026-11-21T05:00:00Z"
        ) from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except TidemarkError as exc:
        print(f"tidemark: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "tidemark: interrupted; nothing was committed by the interrupted step.", file=sys.stderr
        )
        return 130


def _run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    notice = home_notice(settings.home)
    if notice:
        print(f"tidemark: {notice}", file=sys.stderr)
    if args.command == "mongod":
        return _mongod(args.action, settings)
    if args.command == "spark":
        from tidemark.cli.spark_command import spark_command

        return spark_command(args, settings)
    if args.command == "s3":
        from tidemark.cli.local_s3 import s3_command

        return s3_command(settings, args.action)
    if args.command == "ui":
        from tidemark.cli.ui import ui_command

        return ui_command(settings, args.action, args.port)
    runtime = open_runtime(settings)
    try:
        if args.command == "drain":
            return _drain(runtime, args)
        if args.command == "transform":
            return transform_command(runtime, args)
        if args.command == "status":
            from tidemark.cli.status import status_json, status_table

            return status_json(runtime) if args.json else status_table(runtime)
        if args.command == "tables":
            return tables_command(runtime, as_json=args.json)
        if args.command == "reset":
            return _reset(runtime, args)
        if args.command == "resnapshot":
            return _resnapshot(runtime, args.stream)
        if args.command == "gc":
            return _gc(runtime, args.min_age)
        if args.command == "demo":
            from tidemark.cli.demo import run_demo

            run_demo(runtime, orders=args.orders)
            return 0
        if args.command == "workload":
            return _workload(runtime, args)
        if args.command == "metrics":
            from tidemark.cli.metrics import metrics_command

            return metrics_command(runtime, args.action, args.host, args.port)
    finally:
        runtime.close()
    raise AssertionError(args.command)


def _drain(runtime: Runtime, args: argparse.Namespace) -> int:
    from jobs.capture import drain

    if args.all == bool(args.stream):
        raise StreamArgumentMissing("Name one stream to drain, or pass --all.", "")
    shown = terminal_progress()
    if not args.all:
        stream = runtime.config.stream(args.stream)
        result = drain(stream, runtime.client, runtime.store, runtime.lake_root, progress=shown)
        print(_drain_table([result]))
        return 0
    results: list[DrainResult | str] = []
    failures = StreamFailures.of(runtime.config)
    for stream in runtime.config.streams:
        outcome = failures.run(
            stream.name,
            lambda s=stream: drain(
                s, runtime.client, runtime.store, runtime.lake_root, progress=shown
            ),
        )
        results.append(outcome if outcome is not None else stream.name)
    print(_drain_table(results))
    return failures.report()


def _drain_table(results: Sequence[DrainResult | str]) -> str:
    rows: list[list[Any]] = []
    for r in results:
        if isinstance(r, str):  # a stream that failed: its message follows the table
            rows.append([r, "-", "-", "-", "-", "FAILED (see below)", "-"])
            continue
        token_time = ts_to_datetime(r.token_cluster_time)
        rows.append(
            [
                r.stream,
                f"{r.events:,}",
                len(r.files),
                human_bytes(r.file_bytes),
                f"{token_time:%Y-%m-%d %H:%M:%S}" if token_time else "-",
                r.stop_reason,
                f"{r.duration_s:.2f} s",
            ]
        )
    table = format_table(
        ["stream", "events", "files", "bytes", "token time (UTC)", "stopped", "took"], rows
    )
    warnings = [
        f"warning: stream {r.stream}: {w}."
        for r in results
        if not isinstance(r, str)
        for w in r.warnings
    ]
    return "\n".join([table, *warnings])


def _reset(runtime: Runtime, args: argparse.Namespace) -> int:
    from jobs.ops import reset_stream

    stream = runtime.config.stream(args.stream)
    actor = f"{getpass.getuser()}@{socket.gethostname()} (tidemark reset)"
    moment = reset_stream(
        stream,
        runtime.client,
        runtime.store,
        to_time=None if args.to_now else args.to_time,
        actor=actor,
    )
    print(
        f"Stream {stream.name!r} now starts from {moment_text(moment)} "
        "(recorded in the state store's reset history)."
    )
    return 0


def _resnapshot(runtime: Runtime, name: str) -> int:
    from jobs.capture import drain

    stream = runtime.config.stream(name)
    result = drain(
        stream,
        runtime.client,
        runtime.store,
        runtime.lake_root,
        resnapshot=True,
        progress=terminal_progress(),
    )
    snapshot = result.snapshot
    assert snapshot is not None
    print(
        f"Snapshot {snapshot.id} of stream {stream.name!r}: {snapshot.status}, "
        f"{snapshot.chunks} chunks, {snapshot.documents:,} documents "
        f"(recorded in the state store; the stream continues from its time)."
    )
    if snapshot.status != "done":
        print("The copy stopped at the run's time budget: `tidemark drain` continues it.")
    else:
        print(_drain_table([result]))
    return 0


def _gc(runtime: Runtime, min_age: float) -> int:
    from jobs.ops import collect_garbage
    from tidemark.cli.curated import lazy_spark

    rows = []
    with lazy_spark(runtime) as (session, _):
        sweeps = collect_garbage(runtime.lake_root, runtime.store, min_age, spark=session)
    for sweep in sweeps:
        removed = len(sweep.result.removed) if sweep.result is not None else "-"
        young = len(sweep.result.kept_young) if sweep.result is not None else "-"
        vacuumed = len(sweep.curated) if sweep.curated is not None else "-"
        note = "; ".join(n for n in (sweep.note, sweep.curated_note) if n) or "ok"
        rows.append([sweep.stream, removed, vacuumed, young, note])
    header = ["stream", "raw files removed", "Delta files vacuumed", "kept (younger)", "note"]
    print(format_table(header, rows) if rows else "The lake holds no raw files yet.")
    return 0


def _workload(runtime: Runtime, args: argparse.Namespace) -> int:
    from resources.mongo import connect
    from tidemark.cli.workload import stream_workload

    streams = [s for s in runtime.config.streams if s.scope in ("collection", "database")]
    if not streams:
        raise WorkloadStreamMissing(
            "The workload needs a collection or database stream in the streams config.", ""
        )
    writer = connect(runtime.uri)
    done = 0
    try:
        while not args.rounds or done < args.rounds:
            for stream in streams:
                rounds = stream_workload(writer, stream, orders=args.orders, seed=int(time.time()))
                for namespace, ops in rounds.items():
                    print(
                        f"{datetime.now(UTC):%H:%M:%S} {namespace}: "
                        + ", ".join(f"{v} {k}" for k, v in ops.items()),
                        flush=True,
                    )
            done += 1
            if not args.rounds or done < args.rounds:
                time.sleep(args.every)
    finally:
        writer.close()
    return 0


def _mongod(action: str, settings: Settings) -> int:
    if action == "stop":
        stopped = stop_embedded(settings.home)
        print("embedded mongod stopped" if stopped else "no embedded mongod was running")
        return 0
    mongod = ensure_embedded(settings.home)
    print(mongod.uri)
    return 0


if __name__ == "__main__":
    sys.exit(main())
