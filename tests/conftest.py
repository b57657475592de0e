"""Shared fixtures: one real mongod replica set per session, fresh databases per test, and the
state store on SQLite and on PostgreSQL (a server of the session's own, or
TIDEMARK_TEST_POSTGRES_URL; required when TIDEMARK_REQUIRE_POSTGRES=1, as in CI, so those tests
can never be skipped silently)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis.configuration import set_hypothesis_home_dir
from pymongo import MongoClient
from sqlalchemy import create_engine, text

from resources.embedded_mongo import (
    DEFAULT_VERSION,
    Mongod,
    start_mongod,
    stop_mongod,
)
from resources.embedded_s3 import BUCKET, S3Server, start_s3, stop_s3
from resources.mongo import connect
from state import StateStore
from state.engine import normalize_url
from tests.helpers.credentials import SECRET
from tests.helpers.postgres_server import PostgresUnavailable, start_postgres, stop_postgres
from tidemark.config import StreamConfig
from tidemark.errors import EmbeddedMongoError
from tidemark.object_path import LakePath, ObjectPath

# Where the suite's time goes, printed at the end of every run (.ci/run's table).
pytest_plugins = ["tests.helpers.suite_time"]

POSTGRES_ENV = "TIDEMARK_TEST_POSTGRES_URL"
# CI sets it: a second server that cannot run fails instead of skipping.
MATRIX_ENV = "TIDEMARK_REQUIRE_MONGOD_MATRIX"

# The suite chooses its Spark itself (a local session; tests/test_spark_server.py a Connect
# server of its own): a TIDEMARK_SPARK_REMOTE in the developer's shell would switch every
# process that imports `orchestration` to Spark Connect mode.
os.environ.pop("TIDEMARK_SPARK_REMOTE", None)
# The suite's other Spark JVMs (a child process's, a CLI run's) are short-lived: the quick
# compiler alone saves ~40 % of such a JVM's CPU (README, TIDEMARK_SPARK_JAVA_OPTIONS); child
# processes inherit it. The session's own JVM keeps the defaults (the `spark` fixture).
os.environ.setdefault("TIDEMARK_SPARK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")
# Hypothesis keeps what it stores (the examples it found, its caches of constants and Unicode
# tables) under the system's temporary directory, not in the checkout's .hypothesis: no test
# writes into the repository (.ci/run checks it).
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "tidemark-hypothesis")
# The test S3 server's identity (any pair: it is the server's only one).
TEST_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "tidemark-test",
    "AWS_SECRET_ACCESS_KEY": "tidemark-test-secret",
    "AWS_REGION": "us-east-1",
}

# The test S3 server's key pair, in the environment before any process starts (the Spark JVMs
# and Connect servers the suite starts inherit it, as a deployment's would): no test can reach
# a real AWS account with a developer's own keys.
os.environ.update(TEST_CREDENTIALS)
for _name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION"):
    os.environ.pop(_name, None)

# What the fast tier (`-m fast`, `make test-fast`) must never start: a mongod or a Spark session.
SERVER_FIXTURES = frozenset({"mongod", "client", "raw_client", "auth_mongod", "spark"})


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked `fast` that needs mongod or Spark, directly or through another fixture,
    fails here, before either starts: the fast tier stays fast."""
    if item.get_closest_marker("fast") is None:
        return
    needed = sorted(SERVER_FIXTURES & set(getattr(item, "fixturenames", ())))
    if needed:
        pytest.fail(
            f"{item.nodeid} is marked fast but needs {', '.join(needed)}: the fast tier runs "
            "without mongod and Spark. Remove the fast mark or the fixture.",
            pytrace=False,
        )


# Under pytest-xdist (`make test` runs three workers on two cores), the tests that start a JVM,
# Connect server, cluster or multi-gigabyte process of their own run on one worker, one at a
# time: two at once on two cores would each take twice as long and risk their timeouts. The rest
# (mostly waiting on mongod, Dagster's processes, a browser) runs beside them.
OWN_SERVERS_GROUP = "own_servers"


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("own_servers") is not None:
            item.add_marker(pytest.mark.xdist_group(OWN_SERVERS_GROUP))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The server-version matrix: a test (or module) marked `servers("6.0.5", "6.0.27")` runs
    once per server, with `mongod` (and so `client`, `raw_client`) being that server. The
    default server's parameter is None, the key unmarked tests use too, so they share one
    session mongod; pytest groups the tests of the other server together."""
    marker = metafunc.definition.get_closest_marker("servers")
    if marker is None or "mongod" not in metafunc.fixturenames:
        return
    versions = list(marker.args)
    params = [None if version == DEFAULT_VERSION else version for version in versions]
    metafunc.parametrize("mongod", params, ids=versions, indirect=True, scope="session")


@pytest.fixture(scope="session")
def mongod(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Mongod]:
    version = getattr(request, "param", None) or DEFAULT_VERSION
    try:
        # Test commands enable the failCommand fail point, for real server-side faults.
        server = start_mongod(
            tmp_path_factory.mktemp(f"mongod-{version}") / "data",
            extra_args=("--setParameter", "enableTestCommands=1"),
            version=version,
        )
    except EmbeddedMongoError as exc:
        if version == DEFAULT_VERSION or os.environ.get(MATRIX_ENV) == "1":
            raise
        pytest.skip(f"mongod {version} cannot run here ({exc}); `make install` fetches it")
    yield server
    stop_mongod(server)


@pytest.fixture(scope="session")
def client(mongod: Mongod) -> Iterator[MongoClient]:
    c = connect(mongod.uri)
    yield c
    c.close()


@pytest.fixture(scope="session")
def raw_client(mongod: Mongod) -> Iterator[MongoClient]:
    c = connect(mongod.uri, raw=True)
    yield c
    c.close()


@pytest.fixture
def db_name(client: MongoClient) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:10]}"
    yield name
    client.drop_database(name)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A real S3 server of the session's own (SeaweedFS on loopback, resources/embedded_s3.py),
    named by AWS_ENDPOINT_URL for the rest of the session. Never skipped: `weed` comes with the
    dev dependencies."""
    directory = Path(tempfile.mkdtemp(prefix="tidemark-s3-"))
    server = start_s3(directory, credentials=TEST_CREDENTIALS)
    os.environ["AWS_ENDPOINT_URL"] = server.endpoint
    yield server
    stop_s3(server)
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def s3_lake(s3_server: S3Server) -> LakePath:
    """A lake of the test's own on the S3 server: a fresh prefix of its bucket."""
    return ObjectPath("s3", BUCKET, f"t-{uuid.uuid4().hex[:10]}/lake")


@pytest.fixture
def lake(request: pytest.FixtureRequest, tmp_path: Path) -> LakePath:
    """The test's lake: a local directory, or on the S3 server where a test parametrizes it
    (`@pytest.mark.parametrize("lake", ["local", "s3"], indirect=True)`)."""
    if getattr(request, "param", "local") == "s3":
        return request.getfixturevalue("s3_lake")
    return tmp_path / "lake"


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str | None]:
    """TIDEMARK_TEST_POSTGRES_URL when set; else a PostgreSQL server of the session's own
    (tests/helpers/postgres_server.py). Where none can start, the PostgreSQL tests skip, except
    with TIDEMARK_REQUIRE_POSTGRES=1 (CI), where they fail."""
    url = os.environ.get(POSTGRES_ENV)
    if url:
        yield url
        return
    try:
        server = start_postgres()
    except PostgresUnavailable as exc:
        if os.environ.get("TIDEMARK_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"PostgreSQL is required (TIDEMARK_REQUIRE_POSTGRES=1) but: {exc}")
        yield None
        return
    yield server.url
    stop_postgres(server)


@pytest.fixture
def pg_schema_url(postgres_url: str | None) -> Iterator[str]:
    """A PostgreSQL URL whose search_path is a fresh schema, dropped afterwards."""
    base = postgres_url
    if base is None:
        pytest.skip(
            "no PostgreSQL here (apt-get install postgresql, or set "
            f"{POSTGRES_ENV}) for the PostgreSQL state-store tests"
        )
    schema = f"tm_{uuid.uuid4().hex[:10]}"
    admin = create_engine(normalize_url(base))
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    except Exception as exc:  # pragma: no cover - only when the server is down
        if os.environ.get("TIDEMARK_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"PostgreSQL at {base} is required (CI) but failed: {exc}")
        pytest.skip(f"PostgreSQL at {base} is unreachable: {exc}")
    sep = "&" if "?" in base else "?"
    yield f"{base}{sep}options=-csearch_path%3D{schema}"
    with admin.begin() as conn:
        conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def state_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state.db'}"
    return request.getfixturevalue("pg_schema_url")


@pytest.fixture
def store(state_url: str) -> Iterator[StateStore]:
    s = StateStore(state_url)
    yield s
    s.close()


def _stream_maker(database: str) -> Callable[..., StreamConfig]:
    def make(**overrides: Any) -> StreamConfig:
        fields: dict[str, Any] = {
            "name": "orders",
            "database": database,
            "collection": "orders",
            "max_await_time_ms": 300,
        }
        fields.update(overrides)
        return StreamConfig.model_validate(fields)

    return make


@pytest.fixture
def make_stream(db_name: str) -> Callable[..., StreamConfig]:
    """A stream over the test's own database on the session's mongod."""
    return _stream_maker(db_name)


@pytest.fixture
def make_config() -> Callable[..., StreamConfig]:
    """The same stream config with no mongod behind it, for tests of the state store and the
    lake alone (the fast tier)."""
    return _stream_maker(f"t_{uuid.uuid4().hex[:10]}")


@pytest.fixture
def state_url_sqlite(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'state.db'}"


@pytest.fixture
def sqlite_store(state_url_sqlite: str) -> Iterator[StateStore]:
    """For tests about what is drained, not about the store: one backend is enough."""
    s = StateStore(state_url_sqlite)
    yield s
    s.close()


@pytest.fixture(scope="session")
def spark():
    from resources.spark import SparkConfig, spark_session, stop_if_created

    # Two shuffle partitions: one task a core; the tests' tables are small. The session lives
    # for the whole run, so its JVM keeps both compilers (measured: three fold tests 100 s
    # against 118 s with the quick compiler alone, which the suite's short JVMs keep).
    config = SparkConfig(
        master="local[2]", driver_memory="2g", shuffle_partitions=2, java_options=""
    )
    session, created = spark_session(config)
    yield session
    stop_if_created(session, created)


@pytest.fixture(autouse=True)
def _the_process_session_first(request: pytest.FixtureRequest) -> None:
    """Every test that may reach Spark finds the worker's session running. Code run in
    process (the CLI, a Dagster run) that finds none makes its own and stops it at its end;
    a session made after that in the same process failed (py4j: `org.apache.spark.sql.
    functions does not exist in the JVM`), which under xdist's order broke every later
    Spark test of that worker."""
    if request.node.get_closest_marker("fast") is None:
        request.getfixturevalue("spark")


@pytest.fixture
def tiny_mongod(tmp_path: Path) -> Iterator[Mongod]:
    """A replica set of the test's own with a 1 MB oplog, for history lost on purpose
    (`tests.helpers.oplog.roll_oplog_past`): `--syncdelay 1` lets the server truncate its
    oplog within seconds instead of a minute (FIELD-NOTES)."""
    server = start_mongod(tmp_path / "tiny", oplog_size_mb=1, extra_args=("--syncdelay", "1"))
    yield server
    stop_mongod(server)


@pytest.fixture(scope="session")
def mongod_b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mongod]:
    """A second replica set, of the same name as the session's (`rs0`): only its id tells them
    apart. One per session: the tests that need it only need a separate server."""
    server = start_mongod(tmp_path_factory.mktemp("mongod-b") / "data", oplog_size_mb=64)
    # The tests' positions on A must lie inside B's oplog, as a long-lived B's would: else B
    # answers "history lost" and the silent case those tests are about never happens.
    with MongoClient(server.uri) as b:
        first = b.local["oplog.rs"].find_one({}, sort=[("$natural", 1)])["ts"]
    while time.time() < first.time + 2:
        time.sleep(0.1)
    yield server
    stop_mongod(server)


@pytest.fixture(scope="session")
def raw_client_b(mongod_b: Mongod) -> Iterator[MongoClient]:
    c = connect(mongod_b.uri, raw=True)
    yield c
    c.close()


@pytest.fixture(scope="session")
def auth_mongod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Mongod, str]]:
    """A replica set with access control and a least-privilege user; returns (server, URI)."""
    base = tmp_path_factory.mktemp("auth")
    keyfile = base / "keyfile"
    keyfile.write_text("tidemarktestkeyfilecontents0123456789")
    keyfile.chmod(0o600)
    server = start_mongod(base / "data", extra_args=("--auth", "--keyFile", str(keyfile)))
    # The localhost exception lets the first user be created without credentials.
    with MongoClient(f"127.0.0.1:{server.port}", directConnection=True) as admin:
        admin.admin.command("createUser", "root", pwd="rootpw", roles=["root"])
    with MongoClient(
        f"127.0.0.1:{server.port}", directConnection=True, username="root", password="rootpw"
    ) as root:
        root.admin.command(
            "createRole",
            "tidemarkCapture",
            privileges=[
                {"resource": {"db": "shop", "collection": ""}, "actions": ["find", "changeStream"]},
                {"resource": {"db": "local", "collection": "oplog.rs"}, "actions": ["find"]},
            ],
            roles=[],
        )
        root.admin.command("createUser", "capture", pwd=SECRET, roles=["tidemarkCapture"])
        root.shop.orders.insert_one({"_id": "seed"})
    uri = f"mongodb://capture:{SECRET}@127.0.0.1:{server.port}/?replicaSet=rs0&authSource=admin"
    yield server, uri
    stop_mongod(server)
