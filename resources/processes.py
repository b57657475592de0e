"""Facts about local processes and ports, read from /proc: which program a pid runs, whether
that process itself listens on a port, and stopping it.

For daemons Tidemark starts and finds again by a recorded pid, which the system may since have
given to another program, and whose port another program may hold.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from pathlib import Path


def runs(pid: int, marker: str) -> bool:
    """`pid` is alive (not a zombie) and `marker` is in its command line."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return marker.encode() in cmdline and state != "Z"


def listens_on(pid: int, port: int) -> bool:
    """`pid` itself listens on TCP `port`: its sockets' inodes against the kernel's table."""
    inodes = set()
    try:
        for fd in os.scandir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(fd.path)
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
    except OSError:
        return False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()  # sl local_address rem_address st ... inode
                listening = fields[3] == "0A"
                if listening and fields[9] in inodes and fields[1].endswith(f":{port:04X}"):
                    return True
    return False


def terminate(pid: int, marker: str, timeout: float = 30.0) -> None:
    """SIGTERM (a JVM runs its shutdown hooks), then SIGKILL if it still runs after `timeout`."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not runs(pid, marker):
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def port_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def group_members(pgid: int) -> list[int]:
    """Live processes (not zombies) of process group `pgid`, read from /proc."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            # After the command's closing parenthesis: state ppid pgrp ...
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[-1].split()
            if fields[0] != "Z" and int(fields[2]) == pgid:
                members.append(int(entry.name))
    return members


def terminate_group(pgid: int, timeout: float = 30.0) -> None:
    """SIGTERM to the whole group (a leader that forwards nothing still has its children
    stopped), then SIGKILL to what remains after `timeout`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not group_members(pgid):
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
