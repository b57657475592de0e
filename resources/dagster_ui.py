"""The `dagster dev` process behind `tidemark ui` and `tidemark ui stop`.

`dagster dev` started from a script with a plain `&` ignores SIGTERM and SIGINT, and its
webserver, daemon and code server are processes of their own. So it runs in a session of its
own (its pid is its process group's id), recorded under `<home>/ui`, and stopping it stops the
whole group. Plain functions, no Dagster import: the command line is the caller's.
"""

from __future__ import annotations

import contextlib
import subprocess
from dataclasses import dataclass
from pathlib import Path

from resources.daemon_record import exclusive_lock, load_record, save_record
from resources.processes import group_members, runs, terminate_group
from tidemark.errors import DagsterUiRunning

MARKER = "dagster"  # in the command line of the recorded pid, or the pid was reused


@dataclass(frozen=True)
class DagsterUi:
    """A `dagster dev` this module started, as recorded under the Tidemark home."""

    pid: int  # also its process group's id
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def ui_dir(home: Path) -> Path:
    return home / "ui"


def _state_file(home: Path) -> Path:
    return ui_dir(home) / "dagster-dev.json"


def running_ui(home: Path) -> DagsterUi | None:
    """The home's `dagster dev` if its process group still runs."""
    saved = _load(home)
    if saved and runs(saved.pid, MARKER):
        return saved
    return None


def start_ui(
    home: Path, command: list[str], env: dict[str, str], cwd: Path, host: str, port: int
) -> tuple[DagsterUi, subprocess.Popen[bytes]]:
    """Start `command` (a `dagster dev`) in its own session and record it; its output goes
    to this process's. One per home: a second start names the running one."""
    with _lock(home):
        running = running_ui(home)
        if running:
            raise DagsterUiRunning(
                f"The Dagster UI already runs under this Tidemark home at {running.url} "
                f"(pid {running.pid}).",
                "Open it, or stop it with `tidemark ui stop` first.",
            )
        process = subprocess.Popen(command, env=env, cwd=cwd, start_new_session=True)
        ui = DagsterUi(pid=process.pid, host=host, port=port)
        save_record(_state_file(home), ui)
        return ui, process


def stop_ui(home: Path, timeout: float = 30.0) -> bool:
    """Stop the home's `dagster dev` and every process of its group; True when one ran."""
    with _lock(home):
        saved = _load(home)
        running = saved is not None and bool(group_members(saved.pid))
        if saved is not None and running:
            terminate_group(saved.pid, timeout)
        _state_file(home).unlink(missing_ok=True)
        return running


def forget(home: Path, ui: DagsterUi) -> None:
    """Drop the record of `ui` once it has exited (not a newer one's)."""
    with _lock(home):
        if _load(home) == ui:
            _state_file(home).unlink(missing_ok=True)


def _load(home: Path) -> DagsterUi | None:
    return load_record(_state_file(home), DagsterUi)


def _lock(home: Path) -> contextlib.AbstractContextManager[None]:
    return exclusive_lock(ui_dir(home) / "ui.lock")
