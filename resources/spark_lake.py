"""How Spark reaches a lake on object storage: the s3a settings a session needs for `s3://`.

Spark reads and writes the lake's Delta tables by their object URLs (`s3://bucket/lake/...`,
the same text Tidemark shows and other engines read). Hadoop serves `s3://` with S3A once
`fs.s3.impl` names it; hadoop-aws and the AWS SDK's jars are in the venv from `make install`
(resources/delta.py). The settings are set on the session, not the JVM, when the lake is first
used: a Connect server takes Hadoop's `fs.*` keys per session (the `spark.hadoop.*` form is
fixed at its start), and Delta and the DataFrame readers build their Hadoop configuration from
the session's.

What is set comes from the standard AWS variables: AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3)
for a store that is not AWS (MinIO, SeaweedFS, R2: path-style addressing, TLS as its scheme
says) and AWS_REGION (or AWS_DEFAULT_REGION). Credentials are never set here: the AWS SDK's
default chain finds them where the driver and executors run (their environment,
~/.aws/credentials and AWS_PROFILE, a web identity or an instance role), so a key never travels
in a Spark setting.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from tidemark.object_path import LakePath, ObjectPath

S3A = "org.apache.hadoop.fs.s3a.S3AFileSystem"
# The SDK v2 chain (environment, profile files, web identity, container, instance role); S3A's
# own default list leaves out the profile files.
DEFAULT_CREDENTIALS = "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider"


def endpoint(environ: Mapping[str, str]) -> str | None:
    return environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL") or None


def region(environ: Mapping[str, str]) -> str | None:
    return environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION") or None


def lake_settings(lake: LakePath, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The session settings Spark needs for `lake` ({} for a local one, or a store other than
    S3, whose connector a cluster configures itself)."""
    if not isinstance(lake, ObjectPath) or lake.scheme != "s3":
        return {}
    environ = os.environ if environ is None else environ
    settings = {"fs.s3.impl": S3A, "fs.s3a.aws.credentials.provider": DEFAULT_CREDENTIALS}
    url = endpoint(environ)
    if url:
        settings["fs.s3a.endpoint"] = url
        settings["fs.s3a.path.style.access"] = "true"
        settings["fs.s3a.connection.ssl.enabled"] = str(urlsplit(url).scheme == "https").lower()
    where = region(environ)
    if where:
        settings["fs.s3a.endpoint.region"] = where
    return settings


def use_lake(session: Any, lake: LakePath) -> None:
    """Set the session's settings for `lake` (idempotent; nothing for a local lake)."""
    conf = session.conf
    for key, value in lake_settings(lake).items():
        if conf.get(key, None) != value:
            conf.set(key, value)
