"""`tidemark s3 start|stop`: the local S3 server (SeaweedFS) that `make demo LAKE=s3` puts the
lake on, its data under the Tidemark home. It serves the port of the S3 endpoint the lake's
clients read (AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL), as the key pair in the environment."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from resources.embedded_s3 import DEFAULT_PORT, running_s3, start_s3, stop_s3
from resources.spark_lake import endpoint
from tidemark.errors import EmbeddedS3Error
from tidemark.settings import Settings


def s3_command(settings: Settings, action: str) -> int:
    directory = settings.home / "s3"
    server = running_s3(directory)
    if action == "stop":
        if server is not None:
            stop_s3(server)
        print("local S3 server stopped" if server else "no local S3 server was running")
        return 0
    if server is None:
        directory.mkdir(parents=True, exist_ok=True)
        server = start_s3(directory, port=_port())
        print(f"local S3 server started at {server.endpoint} (data in {directory / 'data'})")
    else:
        print(f"local S3 server already running at {server.endpoint}")
    return 0


def _port() -> int:
    url = endpoint(os.environ)  # the one the lake's clients will use
    if not url:
        return DEFAULT_PORT
    parts = urlsplit(url)
    if parts.hostname not in ("127.0.0.1", "localhost") or parts.port is None:
        raise EmbeddedS3Error(
            f"The S3 endpoint is {url}, which is not a port on this machine's loopback.",
            "Unset AWS_ENDPOINT_URL_S3 and AWS_ENDPOINT_URL, or set them to "
            "http://127.0.0.1:PORT for the local S3 server.",
        )
    return parts.port
