"""TIDEMARK_LAKE names a local directory or a place on object storage; any other URL is refused,
never written as a directory (issue 23, item 3: `s3://bucket/lake` once wrote to
`./s3:/bucket/lake`; issue 26: object storage is a lake)."""

from __future__ import annotations

from pathlib import Path

import pytest

from resources.spark_lake import lake_settings
from tidemark.cli.commands import main
from tidemark.errors import LakeUrlUnsupported
from tidemark.object_path import ObjectPath
from tidemark.settings import Settings, lake_path


@pytest.mark.fast
@pytest.mark.parametrize(
    "url", ["hdfs://namenode:8020/lake", "file://otherhost/lake", "ftp://host/lake", "s3:///lake"]
)
def test_a_url_tidemark_cannot_write_is_refused_with_the_fix(url: str):
    with pytest.raises(LakeUrlUnsupported) as refused:
        lake_path(url)
    message = str(refused.value)
    assert url in message and "TIDEMARK_LAKE" in message and "local" in message
    assert "s3://bucket/prefix" in message


@pytest.mark.fast
@pytest.mark.parametrize(
    ("url", "text", "fs_path"),
    [
        ("s3://bucket/lake", "s3://bucket/lake", "bucket/lake"),
        ("s3a://bucket/a/b/", "s3://bucket/a/b", "bucket/a/b"),
        ("gs://bucket/lake", "gs://bucket/lake", "bucket/lake"),
        (
            "abfss://c@acct.dfs.core.windows.net/lake",
            "abfss://c@acct.dfs.core.windows.net/lake",
            "c/lake",
        ),
    ],
)
def test_object_storage_urls_are_object_paths(url: str, text: str, fs_path: str):
    root = lake_path(url)
    assert isinstance(root, ObjectPath)
    assert str(root) == text and root.fs_path == fs_path
    table = root / "curated" / "orders"
    assert str(table) == f"{text}/curated/orders"
    assert table.relative_to(root).as_posix() == "curated/orders"
    assert table.parent.parent == root and table.name == "orders"


@pytest.mark.fast
def test_local_paths_and_file_urls_are_paths(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert lake_path("lake") == tmp_path / "lake"
    assert lake_path(str(tmp_path / "x")) == tmp_path / "x"
    assert lake_path(f"file://{tmp_path}/y") == tmp_path / "y"
    assert lake_path("~/lake") == Path.home() / "lake"


@pytest.mark.fast
def test_settings_read_an_object_store_lake(monkeypatch):
    monkeypatch.setenv("TIDEMARK_LAKE", "s3://bucket/lake")
    assert Settings.from_env().lake_root == ObjectPath("s3", "bucket", "lake")


@pytest.mark.fast
def test_spark_reaches_s3_by_the_standard_variables_and_never_carries_a_key():
    lake = ObjectPath("s3", "bucket", "lake")
    environ = {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:8333",
        "AWS_REGION": "eu-west-3",
        "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI",
    }
    settings = lake_settings(lake, environ)
    assert settings["fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert settings["fs.s3a.endpoint"] == "http://127.0.0.1:8333"
    assert settings["fs.s3a.path.style.access"] == "true"
    assert settings["fs.s3a.connection.ssl.enabled"] == "false"
    assert settings["fs.s3a.endpoint.region"] == "eu-west-3"
    assert not any(v in str(settings) for v in ("AKIDEXAMPLE", "wJalrXUtnFEMI"))
    # AWS itself: no endpoint, so S3A's own (virtual-hosted, TLS); a local lake needs nothing.
    on_aws = lake_settings(lake, {"AWS_REGION": "us-east-2"})
    assert "fs.s3a.endpoint" not in on_aws and "fs.s3a.path.style.access" not in on_aws
    assert lake_settings(Path("/data/lake"), environ) == {}


@pytest.mark.fast
def test_drain_with_an_hdfs_lake_exits_2_and_creates_nothing(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "streams.yaml").write_text(
        "streams:\n  - name: orders\n    database: shop\n    collection: orders\n"
    )
    monkeypatch.setenv("TIDEMARK_LAKE", "hdfs://namenode/lake")
    monkeypatch.setenv("TIDEMARK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TIDEMARK_CONFIG", str(tmp_path / "streams.yaml"))
    monkeypatch.setenv("TIDEMARK_STATE_URL", f"sqlite:///{tmp_path / 'state.db'}")
    monkeypatch.setenv("MONGODB_URI", "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=100")

    assert main(["drain", "orders"]) == 2
    err = capsys.readouterr().err
    assert "hdfs://namenode/lake" in err and "Traceback" not in err
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith("hdfs")]


@pytest.mark.fast
def test_the_dagster_resource_reads_the_same_urls(tmp_path: Path, monkeypatch):
    from orchestration.resources import LakeResource

    monkeypatch.chdir(tmp_path)
    with pytest.raises(LakeUrlUnsupported):
        _ = LakeResource(root="hdfs://namenode/lake").path
    assert LakeResource(root="s3://bucket/lake").path == ObjectPath("s3", "bucket", "lake")
    assert LakeResource(root="lake").path == tmp_path / "lake"
    assert not list(tmp_path.iterdir())


def test_a_key_the_store_refuses_is_one_paragraph_before_anything_is_drained(
    s3_server, monkeypatch
):
    from jobs.lake import ensure_writable
    from tidemark.errors import LakeError

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    # A bucket name of this test's own: the process makes one filesystem per bucket, with the
    # environment's key as it is then.
    with pytest.raises(LakeError) as refused:
        ensure_writable(ObjectPath("s3", "denied-bucket", "lake"))
    message = str(refused.value)
    assert "s3://denied-bucket/lake" in message and "Nothing was drained" in message
    assert "AWS_ACCESS_KEY_ID" in message and "not-the-secret" not in message
    assert "\n" not in message and "Traceback" not in message


@pytest.mark.fast
@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("s3://lake/team#b", "a query or a fragment"),  # once: s3://lake/team, another lake's
        ("s3://lake/q?x", "a query or a fragment"),
        ("s3://lake/a//b", "path segment"),
        ("s3://lake/a/../b", "path segment"),
    ],
)
def test_an_object_url_that_would_name_another_prefix_is_refused(url: str, problem: str):
    with pytest.raises(LakeUrlUnsupported) as refused:
        lake_path(url)
    assert problem in str(refused.value) and url in str(refused.value)


@pytest.mark.fast
def test_credentials_in_a_lake_url_are_refused_and_never_printed():
    with pytest.raises(LakeUrlUnsupported) as refused:
        lake_path("s3://AKIAEXAMPLE:sekrit@lake/x")
    message = str(refused.value)
    assert "credentials" in message and "AWS_ACCESS_KEY_ID" in message
    assert "sekrit" not in message and "AKIAEXAMPLE" not in message
