"""The driver JVM's class archive (`resources.jvm_archive`): `make install` builds it and every
driver JVM started here maps it; without one, JVMs start as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from resources.jvm_archive import ARCHIVE_NAME, archive_options, archive_path
from resources.spark import (
    QUICK_COMPILER_CODE_CACHE,
    SparkConfig,
    _conf_dir,
    driver_java_options,
    jvm_settings,
)


@pytest.mark.fast
def test_the_archive_is_mapped_only_when_built(tmp_path: Path):
    assert archive_options(prefix=tmp_path) == ""
    built = archive_path(prefix=tmp_path)
    built.parent.mkdir(parents=True)
    built.write_bytes(b"")
    assert f"-XX:SharedArchiveFile={built}" in archive_options(prefix=tmp_path)


@pytest.mark.fast
def test_a_driver_jvm_gets_the_quiet_logs_by_path_and_an_empty_conf_dir():
    """The JVM refuses its archive when a directory on its class path holds a file, and Spark
    puts SPARK_CONF_DIR there first."""
    options = jvm_settings(SparkConfig(java_options="-Xss4m"))["spark.driver.extraJavaOptions"]
    assert "-Dlog4j2.configurationFile=" in options and options.endswith("-Xss4m")
    assert options == driver_java_options(SparkConfig(java_options="-Xss4m"))
    assert not any(Path(_conf_dir()).iterdir())


def test_the_sessions_jvm_maps_the_archive_make_install_built(spark):
    path = archive_path()
    assert path.is_file(), f"no {ARCHIVE_NAME}: `make install` builds it"
    pid = spark.sparkContext._gateway.proc.pid
    assert str(path) in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.fast
@pytest.mark.parametrize(
    ("own", "room"),
    [
        ("-XX:TieredStopAtLevel=1", True),
        ("-Xss4m -XX:TieredStopAtLevel=3", True),
        ("-XX:TieredStopAtLevel=4", False),  # the full tiered compiler keeps its 240 MB
        ("-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=64m", False),  # the user's own
        ("", False),
    ],
)
def test_a_driver_on_the_quick_compiler_alone_keeps_room_for_compiled_code(own, room):
    """`-XX:TieredStopAtLevel=1` alone shrinks the code cache to 48 MB, which a Spark driver
    fills within a minute, after which the JVM compiles nothing more (resources/spark.py)."""
    options = driver_java_options(SparkConfig(java_options=own))
    assert own in options
    assert (QUICK_COMPILER_CODE_CACHE in options) is room
