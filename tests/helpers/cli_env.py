"""The environment a `tidemark` command of a test runs in: the test's mongod, a streams file,
a SQLite state store, a lake and a home, all under the test's temporary directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


def cli_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mongodb_uri: str, streams_yaml: str
) -> dict[str, Any]:
    """Point the CLI at these; returns the streams file, the state URL and the lake."""
    config = tmp_path / "streams.yaml"
    config.write_text(streams_yaml)
    state_url = f"sqlite:///{tmp_path / 'state.db'}"
    monkeypatch.setenv("MONGODB_URI", mongodb_uri)
    monkeypatch.setenv("TIDEMARK_CONFIG", str(config))
    monkeypatch.setenv("TIDEMARK_STATE_URL", state_url)
    monkeypatch.setenv("TIDEMARK_LAKE", str(tmp_path / "lake"))
    monkeypatch.setenv("TIDEMARK_HOME", str(tmp_path / "home"))
    # The command runs in the test's directory: a checkout's own `.tidemark` (`make demo`
    # leaves one) would otherwise be a second candidate home, named in a notice on stderr.
    monkeypatch.chdir(tmp_path)
    # Nor may the developer's own `~/.tidemark`, the other candidate.
    monkeypatch.setenv("HOME", str(tmp_path))
    return {"config": config, "state_url": state_url, "lake": tmp_path / "lake"}
