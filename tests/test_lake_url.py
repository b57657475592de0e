"""A lake URL that is not a local path is refused, never written as a directory (issue 23,
item 3): `TIDEMARK_LAKE=s3://bucket/lake` once wrote to `./s3:/bucket/lake`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemark.cli.commands import main
from tidemark.errors import LakeNotLocal
from tidemark.settings import Settings, lake_path


@pytest.mark.fast
@pytest.mark.parametrize(
    "url",
    [
        "s3://bucket/lake",
        "gs://bucket/lake",
        "abfss://c@acct.dfs.core.windows.net/lake",
        "s3a://bucket/lake",
        "hdfs://namenode:8020/lake",
        "file://otherhost/lake",
    ],
)
def test_a_url_is_refused_with_the_fix(url: str):
    with pytest.raises(LakeNotLocal) as refused:
        lake_path(url)
    message = str(refused.value)
    assert url in message and "TIDEMARK_LAKE" in message and "local path" in message
    assert "not supported yet" in message


@pytest.mark.fast
def test_local_paths_and_file_urls_are_paths(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert lake_path("lake") == tmp_path / "lake"
    assert lake_path(str(tmp_path / "x")) == tmp_path / "x"
    assert lake_path(f"file://{tmp_path}/y") == tmp_path / "y"
    assert lake_path("~/lake") == Path.home() / "lake"


@pytest.mark.fast
def test_settings_refuse_a_url(monkeypatch):
    monkeypatch.setenv("TIDEMARK_LAKE", "s3://bucket/lake")
    with pytest.raises(LakeNotLocal):
        Settings.from_env()


@pytest.mark.fast
def test_drain_with_an_s3_lake_exits_2_and_creates_nothing(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "streams.yaml").write_text(
        "streams:\n  - name: orders\n    database: shop\n    collection: orders\n"
    )
    monkeypatch.setenv("TIDEMARK_LAKE", "s3://bucket/lake")
    monkeypatch.setenv("TIDEMARK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TIDEMARK_CONFIG", str(tmp_path / "streams.yaml"))
    monkeypatch.setenv("TIDEMARK_STATE_URL", f"sqlite:///{tmp_path / 'state.db'}")
    monkeypatch.setenv("MONGODB_URI", "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=100")

    assert main(["drain", "orders"]) == 2
    err = capsys.readouterr().err
    assert "s3://bucket/lake" in err and "Traceback" not in err
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith("s3")]


@pytest.mark.fast
def test_the_dagster_resource_refuses_a_url_too(tmp_path: Path, monkeypatch):
    from orchestration.resources import LakeResource

    monkeypatch.chdir(tmp_path)
    with pytest.raises(LakeNotLocal):
        _ = LakeResource(root="s3://bucket/lake").path
    assert LakeResource(root="lake").path == tmp_path / "lake"
    assert not list(tmp_path.iterdir())
