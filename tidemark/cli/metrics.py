"""`tidemark metrics`: the Prometheus text exposition of every configured stream, printed once
or served on `/metrics` (`tidemark metrics serve --port N`) until interrupted."""

from __future__ import annotations

import sys

from pymongo import MongoClient

from jobs.ops.metrics import TidemarkCollector
from resources.metrics_http import MetricsServer, exposition
from resources.mongo import connect
from tidemark.cli.runtime import Runtime

DEFAULT_PORT = 9464  # the port OpenTelemetry's Prometheus exporters use by default
# A scrape waits this long for MongoDB, then reports it down: Prometheus' own scrape timeout
# is 10 s by default, and the state store's metrics must make it back within it.
SOURCE_TIMEOUT_MS = 3000


def collector_for(runtime: Runtime) -> TidemarkCollector:
    def client() -> MongoClient:
        return connect(runtime.uri, timeout_ms=SOURCE_TIMEOUT_MS, raw=True)

    return TidemarkCollector(runtime.config.streams, runtime.store, client)


def metrics_command(runtime: Runtime, action: str, host: str, port: int) -> int:
    collector = collector_for(runtime)
    try:
        if action == "show":
            sys.stdout.write(exposition(collector))
            return 0
        server = MetricsServer(collector, host, port)
        print(f"Serving Tidemark's metrics at {server.url} (Ctrl-C stops).", file=sys.stderr)
        try:
            server.wait()
        finally:
            server.close()
        return 0
    finally:
        collector.close()
