"""Opening the state database: its URL, the SQLAlchemy engine, the schema, and its errors.

SQLite and PostgreSQL behave alike from here up: on SQLite every transaction takes the write
lock when it begins, so two writers queue instead of deadlocking on a lock upgrade.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Connection, Engine, create_engine, event, func, insert, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import (
    ArgumentError,
    DatabaseError,
    IntegrityError,
    SQLAlchemyError,
)

from state import schema
from tidemark.errors import StateStoreError


def normalize_url(url: str) -> str:
    """postgresql:// means psycopg 3 here (the driver Tidemark installs)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def redact_url(url: str) -> str:
    """The URL with its password replaced by ***, fit for an error message."""
    return re.sub(r"(://[^:/@]+:)([^@]*)(@)", r"\1***\3", url)


def make_engine(url: str) -> Engine:
    """An engine for `url`; a SQLite file's directory is created.

    Raises:
        StateStoreError: `url` is not a database URL.
    """
    url = normalize_url(url)
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StateStoreError(
            f"The state store URL {redact_url(url)!r} is not a database URL.",
            "Set TIDEMARK_STATE_URL to sqlite:///path/state.db or "
            "postgresql://user:password@host:5432/db.",
        ) from None
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_setup(dbapi_connection, _record) -> None:
            # Let SQLAlchemy's BEGIN below be the only transaction control.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn) -> None:
            # Take the write lock up front: two writers never deadlock upgrading read locks.
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return create_engine(url, pool_pre_ping=True)


@contextmanager
def database_errors(url: str, what: str) -> Iterator[None]:
    """Turn the database going away during `what` into one `StateStoreError`.

    Raises:
        StateStoreError: the database failed (unreachable, locked too long); the message
            names `what` and the URL without its password.
    """
    try:
        yield
    except IntegrityError:
        raise  # a conflict its caller decides about, not a failure
    except DatabaseError as exc:  # OperationalError, and a file that is no database at all
        raise StateStoreError(
            f"The state store at {redact_url(url)} failed during {what}: "
            f"{str(exc.orig).strip().splitlines()[0] if exc.orig else exc}.",
            "Check that the database is up and reachable (TIDEMARK_STATE_URL); "
            "nothing was committed by this operation.",
        ) from None


def install_or_check_schema(engine: Engine, url: str) -> None:
    """Create the tables of a new database, or check an existing one is of this schema.

    1. Create the tables that are missing (another process may create them at the same moment).
    2. Record the schema version in a new database, or bring an older one up to it
       (`schema.MIGRATIONS`), or refuse one it cannot.

    Raises:
        StateStoreError: the database is unreachable, or holds another schema version.
    """
    with database_errors(url, "open"):
        try:
            schema.metadata.create_all(engine)
        except IntegrityError:
            pass  # another process created the tables at the same moment
        except SQLAlchemyError as exc:
            if "already exists" not in str(exc):
                raise
        with database_errors(url, "schema check"), engine.begin() as conn:
            found = conn.execute(select(func.max(schema.schema_version.c.version))).scalar()
            if found is None:
                conn.execute(
                    insert(schema.schema_version).values(
                        version=schema.SCHEMA_VERSION, installed_at=schema.utc_now()
                    )
                )
            elif found < schema.SCHEMA_VERSION and _migrate(conn, found):
                pass
            elif found != schema.SCHEMA_VERSION:
                raise StateStoreError(
                    f"The state store at {redact_url(url)} has schema version {found}, "
                    f"and this Tidemark uses version {schema.SCHEMA_VERSION}.",
                    "Run the Tidemark release that matches it, or point TIDEMARK_STATE_URL "
                    "at a new database.",
                )


def _migrate(conn: Connection, found: int) -> bool:
    """Bring a store of version `found` up to this schema; False when no path leads there."""
    if any(v not in schema.MIGRATIONS for v in range(found, schema.SCHEMA_VERSION)):
        return False
    versions = schema.schema_version
    # Row lock, then read again: of two processes opening an old store at once, the second
    # waits here and then finds the work done (SQLite's BEGIN IMMEDIATE already serializes).
    conn.execute(select(versions.c.version).where(versions.c.version == found).with_for_update())
    current = conn.execute(select(func.max(versions.c.version))).scalar()
    for version in range(current, schema.SCHEMA_VERSION):
        for statement in schema.MIGRATIONS[version]:
            conn.execute(text(statement))
        conn.execute(insert(versions).values(version=version + 1, installed_at=schema.utc_now()))
    return True
