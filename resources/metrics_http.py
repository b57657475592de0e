"""Serving metrics over HTTP: a collector's Prometheus text exposition, once (`exposition`) or
on `/metrics` for scrapers (`MetricsServer`). What the metrics are is `jobs.ops.metrics`'s
business; this module only registers a collector and listens."""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.registry import Collector

from tidemark.errors import MetricsServerError


def registry_of(collector: Collector) -> CollectorRegistry:
    """A registry holding `collector` alone: no process or platform metrics of this Python,
    which say nothing about the pipeline."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def exposition(collector: Collector) -> str:
    """One scrape's text, as a scraper would read it."""
    return generate_latest(registry_of(collector)).decode()


class MetricsServer:
    """prometheus_client's HTTP server on a thread of its own: `/metrics` (and `/`) answer
    with the collector's exposition, computed per request."""

    def __init__(self, collector: Collector, host: str = "127.0.0.1", port: int = 0) -> None:
        """Listen on `host`:`port` (0: a free port; see `port`).

        Raises:
            MetricsServerError: the address cannot be listened on.
        """
        try:
            server, thread = start_http_server(port, addr=host, registry=registry_of(collector))
        except OSError as exc:
            raise MetricsServerError(
                f"The metrics server cannot listen on {host}:{port}: {exc.strerror or exc}.",
                "Pick another --port (or stop what holds this one), or a --host of this machine.",
            ) from None
        self._server: WSGIServer = server
        self._thread: threading.Thread = thread
        self.host = host
        self.port: int = server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def wait(self) -> None:
        """Block until the server stops (the CLI's foreground)."""
        self._thread.join()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
