"""A throwaway PostgreSQL server for the state-store tests: `initdb` and `pg_ctl` into a fresh
directory, trust auth, a free loopback port, stopped and removed at the end of the session.

No machine this project runs on starts a database service, so the suite brings its own, as it
brings its own mongod. The binaries are Debian's (`apt-get install postgresql`; `make test`
installs them when missing). PostgreSQL refuses to run as root, so under root the server runs
as the `postgres` system user (or `nobody`), in a directory that user owns.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT_S = 60


class PostgresUnavailable(Exception):
    """No PostgreSQL binaries here, or the server did not start; the message says which."""


@dataclass(frozen=True)
class PostgresServer:
    directory: Path
    port: int
    bin_dir: Path
    user: str | None  # the system user it runs as, when started by root

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/test"


def find_bin_dir() -> Path | None:
    """The directory holding initdb and pg_ctl: on PATH, else Debian's versioned directory."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(on_path).resolve().parent
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(candidate) / "initdb").exists() and (Path(candidate) / "pg_ctl").exists():
            return Path(candidate)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_as(user: str | None, argv: list[str], log: Path | None = None) -> None:
    if user is not None:
        argv = ["runuser", "-u", user, "--", *argv]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip()
        if log is not None and log.exists():
            detail += "\n" + log.read_text(errors="replace")[-2000:]
        raise PostgresUnavailable(f"{' '.join(argv)} failed: {detail}")


def _service_user() -> str | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise PostgresUnavailable("running as root and no `postgres` or `nobody` user to run as")


def start_postgres() -> PostgresServer:
    bin_dir = find_bin_dir()
    if bin_dir is None:
        raise PostgresUnavailable(
            "no initdb/pg_ctl found (on PATH or in /usr/lib/postgresql/*/bin): "
            "apt-get install postgresql, or set TIDEMARK_TEST_POSTGRES_URL to a server"
        )
    user = _service_user()
    directory = Path(tempfile.mkdtemp(prefix="tidemark-pg-"))
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(directory, entry.pw_uid, entry.pw_gid)
    data, log = directory / "data", directory / "server.log"
    _run_as(
        user,
        [str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "-E", "UTF8"],
    )
    port = _free_port()
    options = f"-h 127.0.0.1 -p {port} -k {directory} -c fsync=off -c max_connections=200"
    _run_as(
        user,
        [
            str(bin_dir / "pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(log),
            "-o",
            options,
            "-w",
            "-t",
            str(START_TIMEOUT_S),
            "start",
        ],
        log,
    )
    server = PostgresServer(directory, port, bin_dir, user)
    _create_database(server)
    return server


def _create_database(server: PostgresServer) -> None:
    import psycopg

    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            with psycopg.connect(
                f"postgresql://postgres@127.0.0.1:{server.port}/postgres", autocommit=True
            ) as conn:
                conn.execute("CREATE DATABASE test")
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def stop_postgres(server: PostgresServer) -> None:
    with contextlib.suppress(PostgresUnavailable):
        _run_as(
            server.user,
            [
                str(server.bin_dir / "pg_ctl"),
                "-D",
                str(server.directory / "data"),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        )
    shutil.rmtree(server.directory, ignore_errors=True)
