"""Fetch Delta Lake's and s3a's jars into the venv once, at `make install`: tests and runs never
download.

Maven resolves `scripts/delta-jars/pom.xml` (delta-spark and delta-storage at the version
resources/delta.py names, for the installed pyspark's Spark; hadoop-aws at the wheel's Hadoop
and the AWS SDK modules it uses) with their runtime dependencies;
every jar that repeats a class the pyspark wheel's own jars already hold (Scala, Hadoop,
Jackson, Parquet, logging, ...) is dropped, so the driver's classpath has one copy of each.
The directory is renamed into place last: it exists whole or not at all.

Usage: python scripts/fetch_delta_jars.py   (with the venv's Python; needs `mvn`)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from resources.delta import (  # noqa: E402
    AWS_SDK_VERSION,
    DELTA_VERSION,
    hadoop_version,
    jars_dir,
    spark_binary,
)

POM = ROOT / "scripts" / "delta-jars" / "pom.xml"


def classes(jar: Path) -> set[str]:
    # module-info and multi-release copies name no class a classloader could see twice
    with zipfile.ZipFile(jar) as archive:
        return {
            name
            for name in archive.namelist()
            if name.endswith(".class")
            and not name.endswith("module-info.class")
            and not name.startswith("META-INF/")
        }


def spark_classes() -> set[str]:
    import pyspark

    provided: set[str] = set()
    for jar in (Path(pyspark.__file__).parent / "jars").glob("*.jar"):
        provided |= classes(jar)
    return provided


def main() -> int:
    target = jars_dir()
    if target.is_dir() and any(target.glob("delta-spark_*.jar")):
        print(f"Delta Lake {DELTA_VERSION} and s3a jars: already in {target}")
        return 0
    if shutil.which("mvn") is None:
        print(
            "Tidemark fetches Delta Lake's jars with Maven at install time, and `mvn` is not on "
            "the PATH. Install it (Debian/Ubuntu: sudo apt-get install maven; macOS: brew "
            "install maven) and run make install again.",
            file=sys.stderr,
        )
        return 1
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".delta-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide the jars from the venv's other users
    try:
        command = [
            "mvn", "-q", "-B", "-f", str(POM), "dependency:copy-dependencies",
            f"-Ddelta.version={DELTA_VERSION}", f"-Dspark.binary={spark_binary()}",
            f"-Dhadoop.version={hadoop_version()}", f"-Dawssdk.version={AWS_SDK_VERSION}",
            "-DincludeScope=runtime", f"-DoutputDirectory={staging}",
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
            print(
                f"Maven could not fetch Delta Lake's jars ({' '.join(command)}):\n{tail}\n"
                "Check that Maven Central (or your Maven mirror) is reachable, then run make "
                "install again.",
                file=sys.stderr,
            )
            return 1
        provided = spark_classes()
        kept = []
        for jar in sorted(staging.glob("*.jar")):
            if classes(jar) & provided:
                jar.unlink()  # the wheel's copy wins: one copy of each class
            else:
                kept.append(jar)
        for needed in ("delta-spark_", "hadoop-aws-"):
            if not any(jar.name.startswith(needed) for jar in kept):
                print(f"Maven fetched no {needed}* jar into {staging}.", file=sys.stderr)
                return 1
        for old in target.parent.glob("delta-*"):
            shutil.rmtree(old, ignore_errors=True)  # an earlier pin's jars
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    size = sum(jar.stat().st_size for jar in target.glob("*.jar"))
    print(f"Delta Lake {DELTA_VERSION} and s3a jars: {len(kept)} ({size / 1e6:.1f} MB) in {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
