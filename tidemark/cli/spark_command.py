"""`tidemark spark start|stop|status|url`: the Spark Connect server under the Tidemark home,
local by default, or the driver of a standalone cluster (`--master spark://...`)."""

from __future__ import annotations

import argparse
import socket
import time
from urllib.parse import urlsplit

from resources.spark import REMOTE_ENV
from resources.spark_server import last_log, running_server, start_server, stop_server
from tidemark.errors import SparkServerError
from tidemark.settings import Settings


def _driver_host(master: str) -> str:
    """The address a cluster's executors reach the server's driver at: the one this machine
    reaches the master from (loopback for a master on this machine)."""
    parts = urlsplit(master)
    if parts.scheme != "spark" or not parts.hostname:
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((parts.hostname, parts.port or 7077))  # no packet: picks the route
        return probe.getsockname()[0]


def spark_command(args: argparse.Namespace, settings: Settings) -> int:
    """`tidemark spark start|stop|status|url`."""
    home = settings.home
    if args.action == "stop":
        stopped = stop_server(home)
        print("Spark Connect server stopped" if stopped else "no Spark Connect server was running")
        return 0
    if args.action == "start":
        began = time.monotonic()
        conf = {}
        if args.master != "local[*]":
            conf = {"spark.driver.host": _driver_host(args.master)}
        if args.executor_python:
            conf["spark.pyspark.python"] = args.executor_python
        server, started = start_server(
            home,
            port=args.port,
            driver_memory=args.driver_memory,
            master=args.master,
            timeout=args.timeout,
            conf=conf,
        )
        took = f" in {time.monotonic() - began:.1f} s" if started else ""
        print(
            f"Spark Connect server {'started' if started else 'already running'} at "
            f"{server.url}{took} (pid {server.pid}, driver memory {server.driver_memory}; "
            f"log {server.log}).\nPoint runs at it with {REMOTE_ENV}={server.url} "
            "(make demo and make ui do); `tidemark spark stop` stops it."
        )
        return 0
    server = running_server(home)
    if args.action == "url":
        if server is None:
            raise SparkServerError(
                "No Spark Connect server runs under this Tidemark home.",
                "Start it with `tidemark spark start`.",
            )
        print(server.url)
        return 0
    if server is None:
        log = last_log(home)
        print("Spark Connect server: not running" + (f" (last log: {log})" if log else ""))
        return 1
    print(f"Spark Connect server: running\n  url            {server.url}")
    print(f"  pid            {server.pid}\n  driver memory  {server.driver_memory}")
    print(f"  python         {server.python}\n  log            {server.log}")
    return 0
