"""`tidemark ui` and `tidemark ui stop`: `dagster dev` over Tidemark's definitions, in the
environment `dagster_env` fills in, as a process group of its own that a stop ends whole."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from resources.dagster_ui import forget, start_ui, stop_ui
from tidemark.cli.dagster_env import dagster_environment
from tidemark.settings import Settings


def ui_command(settings: Settings, action: str, port: int) -> int:
    """`tidemark ui` (start, in the foreground) and `tidemark ui stop`."""
    if action == "stop":
        stopped = stop_ui(settings.home)
        print("Dagster UI stopped" if stopped else "no Dagster UI was running")
        return 0
    env = {**os.environ, **dagster_environment(settings)}
    root = Path(__file__).resolve().parents[2]  # the checkout's root
    dagster = Path(sys.executable).parent / "dagster"
    command = [str(dagster), "dev", "-w", str(root / "workspace.yaml")]
    command += ["-h", "127.0.0.1", "-p", str(port)]
    # Its own session, so a stop (Ctrl-C, SIGTERM, `tidemark ui stop`) ends every process of it.
    ui, process = start_ui(settings.home, command, env, root, "127.0.0.1", port)
    print(
        f"Dagster UI on {ui.url} (DAGSTER_HOME={env['DAGSTER_HOME']}, pid {ui.pid}); "
        "`tidemark workload` in another shell writes live changes, `tidemark ui stop` stops it.",
        file=sys.stderr,
    )
    signal.signal(signal.SIGTERM, lambda *_: stop_ui(settings.home))
    try:
        code = process.wait()
    except KeyboardInterrupt:
        stop_ui(settings.home)
        code = process.wait()
    finally:
        forget(settings.home, ui)
    return 0 if code in (0, -signal.SIGTERM, -signal.SIGKILL) else code
