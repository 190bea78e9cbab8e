#!/usr/bin/env python3
"""Mirror a DuckLake catalog's foreign-file tables into moraine.

DuckLake keeps three catalog tables for Parquet it did not write itself
(`ducklake_add_data_files`): `ducklake_column_mapping`, `ducklake_name_mapping` and
`ducklake_data_file`. This client copies them from a DuckLake catalog, kept in a DuckDB file or
in PostgreSQL, into a moraine server, one moraine transaction per DuckLake commit, through the
ADBC Flight SQL driver: inserts with `adbc_ingest`, retirements and deletes with DuckLake's own
statement shapes. Nothing else of the catalog is copied. It mirrors DuckLake catalog versions
0.3 (what DuckDB 1.4's DuckLake writes), 0.4 and 1.0 (DuckDB 1.5's) and 1.1-dev1 (DuckLake's main
branch), whose `ducklake_data_file` columns differ (`VERSIONS`), and refuses any other, naming it.
A moraine deployment serves one version's columns (`moraine serve --ducklake-version`); the
mirror stages a catalog only into a server that serves the catalog's version, and otherwise
stops before staging anything, naming both.

Command line (needs `adbc-driver-flightsql` and `pyarrow`; for a DuckDB file `duckdb`, read as
a plain DuckDB database, and for PostgreSQL `adbc-driver-postgresql`, a libpq client; never
the DuckLake extension):

    python integration/ducklake_mirror.py --catalog lake.ducklake --moraine grpc://127.0.0.1:50051
    python integration/ducklake_mirror.py --catalog 'postgres:dbname=lake host=db.internal' \
        --moraine grpc://127.0.0.1:50051
    python integration/ducklake_mirror.py --catalog lake.ducklake --moraine grpc://... --watch 5
    python integration/ducklake_mirror.py --catalog lake.ducklake --moraine grpc://... --dry-run

`postgres:` takes a libpq connection string (`host=... dbname=...` or `postgresql://...`; the
catalog's password in PGPASSWORD or ~/.pgpass), the one DuckLake's own
`ATTACH 'ducklake:postgres:...'` names; DuckLake's tables are read from the connection's
`search_path`, in one REPEATABLE READ transaction per sync.

A server started with `--auth-file` needs credentials: `--username NAME` logs in with the
password in the environment variable MORAINE_PASSWORD (never on the command line, where other
users can read it), or a pre-issued token (`moraine token create`) in MORAINE_TOKEN is sent as
a bearer token. The mirror stages writes, so the user or token needs the writer role:

    MORAINE_PASSWORD=... python integration/ducklake_mirror.py --catalog lake.ducklake \
        --moraine grpc://... --username mirror
    MORAINE_TOKEN=mrt_... python integration/ducklake_mirror.py --catalog lake.ducklake \
        --moraine grpc://...

It prints one line per moraine transaction and exits 0 (1 on an error). DuckDB locks a
database file for the process that writes it, so the command line reads a DuckDB-file catalog
no other process holds open (a PostgreSQL catalog it reads while DuckLake writes); inside the process that runs DuckLake, use the library on the attached
catalog instead:

    import duckdb
    from ducklake_mirror import DuckLakeCatalog, Mirror  # integration/ on sys.path

    con = duckdb.connect()
    con.execute("LOAD ducklake")
    con.execute("ATTACH 'ducklake:lake.ducklake' AS lake (DATA_PATH 'data/')")
    mirror = Mirror(DuckLakeCatalog.attached(con, "lake"), "grpc://127.0.0.1:50051",
                    connect_kwargs=credentials(username="mirror", password="..."))
    ...  # DuckLake commits
    result = mirror.sync()  # stages what those commits changed; result.commits lists them

Design
------
A DuckLake commit never says what it changed; the mirror reconstructs it from the catalog,
the way DuckLake's own reader finds what is new:

* Cursors. Mapping ids and data-file ids come from one counter, the snapshot's
  `next_file_id`; the mirror's file cursor is one past the largest id moraine holds, and it
  reads only the mappings and data files at or above it (`WHERE mapping_id >= cursor`, the form
  of DuckLake's lazy mapping load). Its snapshot cursor is the largest snapshot moraine's
  data-file rows mention; data files whose `end_snapshot` is above it are new retirements.
  Both cursors live in moraine itself, so there is no local state to lose; moraine gives them
  with the row counts of its two tables in two aggregate rows. A sync reads what changed since
  the last one, not the catalog: of moraine only those counts and cursors, the held files the
  catalog retired since, and the live files of tables it dropped since.
* Commits. A data file belongs to the commit of its `begin_snapshot`; a retirement to the
  commit of its `end_snapshot`; a mapping to the first snapshot whose `next_file_id` is above
  its id (where DuckLake drew it), or the first commit of a file that uses it if that is
  earlier. Each DuckLake commit becomes one moraine transaction, in snapshot order: the
  mappings (`adbc_ingest` into `ducklake_column_mapping`, then `ducklake_name_mapping`), the
  data files (`adbc_ingest` into `ducklake_data_file`, with `end_snapshot` NULL as DuckLake
  wrote them), then the retirements:
  `UPDATE ducklake_data_file SET end_snapshot = S WHERE end_snapshot IS NULL AND table_id IN (...)`
  when the commit dropped a table and retires every live file of it (DuckLake's DROP TABLE),
  else the same with `data_file_id IN (...)`.
* Removals. Rows DuckLake physically deleted (compaction, `ducklake_expire_snapshots`, newer
  DuckLake's mapping cleanup) leave no trace but their absence, and expiry writes no snapshot.
  DuckLake never adds a row below the file cursor (it draws every id when it commits), so the
  catalog's row counts below the cursor equal moraine's unless something was removed; only
  then does the mirror compare every id moraine holds with every id the catalog holds, and stage
  `DELETE FROM ducklake_data_file WHERE data_file_id IN (...)`, then for tables whose mappings
  are gone `DELETE FROM ducklake_column_mapping WHERE table_id IN (...)` followed by DuckLake's
  orphan sweep of `ducklake_name_mapping`. They open the sync's last transaction, or make one
  of their own when the sync has no other (expiry alone).
* Idempotence. Every staged row is filtered against what moraine already holds (read in the
  same moraine transaction, before staging), and each DuckLake commit commits atomically, so
  moraine always holds a prefix of the catalog's history. Running the mirror again stages
  nothing; a mirror interrupted between commits resumes at the next one. A commit the server
  refuses is re-planned from a fresh read (a bounded number of times): if another mirror
  staged it meanwhile it simply drops out of the plan, a write conflict is retried, and any
  other refusal of the same commit is raised. Each attempt opens a new moraine connection:
  after a refused commit the ADBC driver has no transaction left on the old one. `--watch`
  outlives a sync that fails this way and tries again at its next interval; only a
  `MirrorError` (a catalog it cannot mirror faithfully) stops it.
* Checks. Affected-row counts of every retirement and delete are compared with what the plan
  expects, and a catalog that changes rows in ways DuckLake never does (a retired file revived,
  part of a table's mappings deleted) stops the mirror with a `MirrorError` rather than a guess.
* Versions. The catalog's `ducklake_metadata` `version`, read in each sync's transaction,
  decides the `ducklake_data_file` columns read and staged (`DATA_FILE_COLUMNS`, in the
  version's order). Before planning, each sync reads the columns moraine serves (`SELECT *
  FROM ducklake_data_file LIMIT 0`); another version's stop it with a `MirrorError` naming
  both, before anything is staged.

Rows travel verbatim: moraine's copies of the three tables equal the catalog's (name-mapping
rows that lost their mapping are the one exception: moraine stores a mapping's name rows inside
it, so an orphan the catalog keeps until its sweep is already gone there, and DuckLake's inner
join sees neither).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

import pyarrow as pa

LOG = logging.getLogger("ducklake_mirror")

COLUMN_MAPPING = "ducklake_column_mapping"
NAME_MAPPING = "ducklake_name_mapping"
DATA_FILE = "ducklake_data_file"

_I, _S, _B = pa.int64(), pa.utf8(), pa.bool_()

# `ducklake_data_file`'s first fourteen columns, the same in every catalog version.
_DATA_FILE_HEAD: List[Tuple[str, pa.DataType]] = [
    ("data_file_id", _I),
    ("table_id", _I),
    ("begin_snapshot", _I),
    ("end_snapshot", _I),
    ("file_order", _I),
    ("path", _S),
    ("path_is_relative", _B),
    ("file_format", _S),
    ("record_count", _I),
    ("file_size_bytes", _I),
    ("footer_size", _I),
    ("row_id_start", _I),
    ("partition_id", _I),
    ("encryption_key", _S),
]

# `ducklake_data_file`'s columns in each DuckLake catalog version moraine serves, in the
# version's order (DuckLake's metadata manager: its CREATE TABLE for 0.3; MigrateV03, 0.3 to
# 0.4, appends `partial_max` and drops `partial_file_info`; MigrateV04, 0.4 to 1.0, changes
# only the version; MigrateV10, 1.0 to 1.1-dev1, appends `row_group_count`). The other two
# tables are the same in all of them.
DATA_FILE_COLUMNS: Dict[str, List[Tuple[str, pa.DataType]]] = {
    "0.3": _DATA_FILE_HEAD + [("partial_file_info", _S), ("mapping_id", _I)],
    "1.0": _DATA_FILE_HEAD + [("mapping_id", _I), ("partial_max", _I)],
    "1.1": _DATA_FILE_HEAD + [("mapping_id", _I), ("partial_max", _I),
                              ("row_group_count", _I)],
}

# The catalog versions the mirror reads, as `ducklake_metadata`'s `version` key spells them,
# and the version (of DATA_FILE_COLUMNS, and of `moraine serve --ducklake-version`) whose
# tables each has: 0.4 is 1.0's pre-release with the same tables, 1.1-dev1 is 1.1's.
VERSIONS: Dict[str, str] = {"0.3": "0.3", "0.4": "1.0", "1.0": "1.0", "1.1-dev1": "1.1",
                            "1.1": "1.1"}

# The three tables exactly as DuckLake declares them; `ducklake_data_file` as in version 0.3
# (`columns()` gives another version's).
COLUMNS: Dict[str, List[Tuple[str, pa.DataType]]] = {
    COLUMN_MAPPING: [("mapping_id", _I), ("table_id", _I), ("type", _S)],
    NAME_MAPPING: [
        ("mapping_id", _I),
        ("column_id", _I),
        ("source_name", _S),
        ("target_field_id", _I),
        ("parent_column", _I),
        ("is_partition", _B),
    ],
    DATA_FILE: DATA_FILE_COLUMNS["0.3"],
}

# DuckLake's own statement shapes.
RETIRE_FILES = ("UPDATE ducklake_data_file SET end_snapshot = {snapshot} "
                "WHERE end_snapshot IS NULL AND data_file_id IN ({ids})")
RETIRE_TABLES = ("UPDATE ducklake_data_file SET end_snapshot = {snapshot} "
                 "WHERE end_snapshot IS NULL AND table_id IN ({ids})")
DELETE_FILES = "DELETE FROM ducklake_data_file WHERE data_file_id IN ({ids})"
DELETE_MAPPINGS = "DELETE FROM ducklake_column_mapping WHERE table_id IN ({ids})"
SWEEP_NAMES = ("DELETE FROM ducklake_name_mapping tbl WHERE NOT EXISTS "
               "(SELECT 1 FROM ducklake_column_mapping m WHERE m.mapping_id = tbl.mapping_id)")

Row = Tuple[Any, ...]


def columns(table: str, version: str = "0.3") -> List[Tuple[str, pa.DataType]]:
    """`table`'s (name, type) columns in DuckLake catalog version `version` (a key of
    VERSIONS), in DuckLake's order."""
    if table == DATA_FILE:
        return DATA_FILE_COLUMNS[VERSIONS[version]]
    return COLUMNS[table]


def column_names(table: str, version: str = "0.3") -> List[str]:
    return [name for name, _ in columns(table, version)]


# Positions in a data-file row of the columns the plan reads: the same in every version
# (mapping_id's moves, so it is looked up per version: `_file_mapping`).
_END = column_names(DATA_FILE).index("end_snapshot")
_BEGIN = column_names(DATA_FILE).index("begin_snapshot")
_FILE_TABLE = column_names(DATA_FILE).index("table_id")
assert all(column_names(DATA_FILE, v)[:_END + 1] == column_names(DATA_FILE)[:_END + 1]
           for v in VERSIONS)


def _file_mapping(version: str) -> int:
    return column_names(DATA_FILE, version).index("mapping_id")


class MirrorError(Exception):
    """The catalog or the server did something the mirror cannot reproduce faithfully."""


# --------------------------------------------------------------------------------------------
# The DuckLake side.


@dataclass
class Held:
    """What moraine holds, summed up by one aggregate per table: the counts, and the
    cursors a sync starts from."""

    mappings: int  # ducklake_column_mapping rows
    files: int  # ducklake_data_file rows
    file_cursor: int  # one past the largest mapping or data-file id (ids share next_file_id)
    snapshot_cursor: int  # the largest snapshot any data-file row mentions, -1 for none

    @classmethod
    def read(cls, conn) -> "Held":
        with conn.cursor() as cur:
            cur.execute("SELECT count(*), max(mapping_id) FROM ducklake_column_mapping")
            mappings, max_mapping = cur.fetchone()
            cur.execute("SELECT count(*), max(data_file_id), max(begin_snapshot), "
                        "max(end_snapshot) FROM ducklake_data_file")
            files, max_file, max_begin, max_end = cur.fetchone()
        ids = [i for i in (max_mapping, max_file) if i is not None]
        snaps = [s for s in (max_begin, max_end) if s is not None]
        return cls(mappings, files, max(ids) + 1 if ids else 0, max(snaps) if snaps else -1)


@dataclass
class CatalogRead:
    """What one read of the DuckLake catalog returns (one read transaction)."""

    version: str  # ducklake_metadata's `version`, as the catalog spells it (a key of VERSIONS)
    snapshots: List[Tuple[int, int]]  # (snapshot_id, next_file_id), ascending
    # Every mapping_id in the catalog -> its table_id, and every data_file_id; read only when
    # the catalog's count of rows below the file cursor differs from moraine's (something
    # was removed), else None: nothing was.
    mapping_tables: Optional[Dict[int, int]]
    file_ids: Optional[Set[int]]
    mappings: List[Row]  # ducklake_column_mapping rows with mapping_id >= the file cursor
    names: List[Row]  # their ducklake_name_mapping rows
    # Data files with id >= the file cursor or end_snapshot > snapshot cursor, with the
    # columns of the catalog's version (`column_names(DATA_FILE, version)`), in its order.
    files: List[Row]
    dropped_tables: Dict[int, int]  # table_id -> the snapshot after the cursor that dropped it

    @property
    def removed_some(self) -> bool:
        return self.mapping_tables is not None


# The DuckLake catalog versions the mirror reads, as catalogs spell them.
SUPPORTED_VERSIONS = tuple(VERSIONS)


class Catalog:
    """Read access to the metadata tables of a DuckLake catalog: `read()` runs every query
    of one sync in one read transaction of the catalog's database, so what it returns is one
    consistent state even while DuckLake commits. Subclasses say how to open that transaction
    (`_transaction`, yielding a function that runs one query and returns its rows) and how to
    name a metadata table (`_table`)."""

    def _transaction(self):
        raise NotImplementedError

    def _table(self, name: str) -> str:
        return name

    def read(self, held: Held) -> CatalogRead:
        """What changed since what moraine holds (`held`): the rows at or above its file
        cursor, the files retired after its snapshot cursor, and (only when the counts below
        the cursor say something was removed) every id, to find what.

        DuckLake draws every id from its snapshot's `next_file_id` when it commits, so rows
        below the cursor are only ever removed, never added: equal counts mean nothing was."""
        t = self._table
        file_cursor, snapshot_cursor = held.file_cursor, held.snapshot_cursor
        with self._transaction() as q:
            versions = [v for (v,) in q(
                f"SELECT value FROM {t('ducklake_metadata')} WHERE key = 'version'")]
            version = check_version(versions)
            cols = lambda table: ", ".join(column_names(table, version))  # noqa: E731
            snapshots = [tuple(r) for r in q(
                f"SELECT snapshot_id, next_file_id FROM {t('ducklake_snapshot')} "
                "WHERE next_file_id > ? ORDER BY snapshot_id", [file_cursor])]
            (mappings_below,), = q(f"SELECT count(*) FROM {t(COLUMN_MAPPING)} "
                                   "WHERE mapping_id < ?", [file_cursor])
            (files_below,), = q(f"SELECT count(*) FROM {t(DATA_FILE)} "
                                "WHERE data_file_id < ?", [file_cursor])
            mapping_tables: Optional[Dict[int, int]] = None
            file_ids: Optional[Set[int]] = None
            if (mappings_below, files_below) != (held.mappings, held.files):
                mapping_tables = {m: tb for m, tb in q(
                    f"SELECT mapping_id, table_id FROM {t(COLUMN_MAPPING)} "
                    "WHERE mapping_id IS NOT NULL")}
                file_ids = {r[0] for r in q(f"SELECT data_file_id FROM {t(DATA_FILE)}")}
            mappings = [tuple(r) for r in q(
                f"SELECT {cols(COLUMN_MAPPING)} FROM {t(COLUMN_MAPPING)} "
                "WHERE mapping_id >= ? ORDER BY mapping_id", [file_cursor])]
            names = [tuple(r) for r in q(
                f"SELECT {cols(NAME_MAPPING)} FROM {t(NAME_MAPPING)} WHERE mapping_id >= ? "
                "ORDER BY mapping_id, column_id", [file_cursor])]
            files = [tuple(r) for r in q(
                f"SELECT {cols(DATA_FILE)} FROM {t(DATA_FILE)} "
                "WHERE data_file_id >= ? OR end_snapshot > ? ORDER BY data_file_id",
                [file_cursor, snapshot_cursor])]
            dropped = {tb: s for tb, s in q(
                f"SELECT table_id, end_snapshot FROM {t('ducklake_table')} "
                "WHERE end_snapshot > ?", [snapshot_cursor])}
        return CatalogRead(version, snapshots, mapping_tables, file_ids, mappings, names, files,
                           dropped)


def check_version(versions: Sequence[str]) -> str:
    """The catalog's DuckLake version (`ducklake_metadata`'s `version` key, one of
    VERSIONS); refuses one whose tables the mirror does not know, naming it."""
    if len(versions) != 1:
        raise MirrorError(f"the catalog's ducklake_metadata has {len(versions)} `version` "
                          "rows, expected one")
    version = str(versions[0]).strip()
    if version not in VERSIONS:
        raise MirrorError(
            f"the catalog is DuckLake catalog version {version}; the mirror reads the tables "
            f"of versions {', '.join(SUPPORTED_VERSIONS)}")
    return version


def describe_version(version: str) -> str:
    """`DuckLake 1.0`, or `DuckLake 0.4 (1.0's tables)` for a spelling of another."""
    served = VERSIONS[version]
    return f"DuckLake {version}" + (f" ({served}'s tables)" if served != version else "")


def served_version(conn) -> str:
    """The DuckLake version (a value of VERSIONS) whose `ducklake_data_file` moraine serves,
    from the columns of its result schema (names and order are what differ)."""
    with conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {DATA_FILE} LIMIT 0")
        names = cur.fetch_arrow_table().schema.names
    for version, cols in DATA_FILE_COLUMNS.items():
        if names == [n for n, _ in cols]:
            return version
    raise MirrorError(f"moraine serves {DATA_FILE} with the columns {', '.join(names)}, "
                      "those of no DuckLake version the mirror knows")


def check_served(conn, catalog_version: str) -> None:
    """Refuses to stage a catalog into a moraine that serves another DuckLake version's
    `ducklake_data_file`, naming both."""
    served = served_version(conn)
    if served != VERSIONS[catalog_version]:
        raise MirrorError(
            f"the catalog is {describe_version(catalog_version)}; moraine serves DuckLake "
            f"{served}'s {DATA_FILE} (start it with --ducklake-version "
            f"{VERSIONS[catalog_version]} on a fresh data directory)")


class DuckLakeCatalog(Catalog):
    """A DuckLake catalog stored in a DuckDB file.

    `open(path)` reads the file itself (a fresh read-only connection per read, so a
    long-running mirror sees new commits); `attached(con, name)` reads the catalog that
    DuckLake attached as `name` in a live DuckDB connection, through a connection of its own
    to the same database (DuckLake exposes it as `__ducklake_metadata_<name>`)."""

    def __init__(self, *, path: Optional[Path] = None, connection: Any = None,
                 database: str = "ducklake_meta"):
        self._path = path
        self._connection = connection
        self._db = database

    @classmethod
    def open(cls, path) -> "DuckLakeCatalog":
        path = Path(path)
        if not path.is_file():
            raise MirrorError(f"no DuckLake catalog file at {path}")
        return cls(path=path)

    @classmethod
    def attached(cls, con, name: str) -> "DuckLakeCatalog":
        return cls(connection=con, database=f"__ducklake_metadata_{name}")

    def _table(self, name: str) -> str:
        return f"{self._db}.{name}"

    def _cursor(self):
        if self._connection is not None:
            return self._connection.cursor()
        import duckdb  # only here: the moraine side of the mirror does not need it

        con = duckdb.connect(":memory:")
        quoted = str(self._path).replace("'", "''")
        con.execute(f"ATTACH '{quoted}' AS {self._db} (TYPE duckdb, READ_ONLY)")
        return con

    @contextlib.contextmanager
    def _transaction(self):
        cur = self._cursor()
        try:
            cur.execute("BEGIN TRANSACTION")
            yield lambda sql, params=(): cur.execute(sql, list(params)).fetchall()
            cur.execute("COMMIT")
        finally:
            cur.close()


class PostgresCatalog(Catalog):
    """A DuckLake catalog stored in PostgreSQL (`ATTACH 'ducklake:postgres:...'`), read
    directly through ADBC's PostgreSQL driver (libpq), without DuckDB. `conninfo` is a libpq
    connection string, either form (`host=... dbname=...` or `postgresql://...`); DuckLake's
    tables are found on the connection's `search_path` (`public` by default). Each read is one
    `REPEATABLE READ READ ONLY` transaction on a connection of its own."""

    def __init__(self, conninfo: str):
        self.conninfo = conninfo

    @contextlib.contextmanager
    def _transaction(self):
        import adbc_driver_postgresql.dbapi as pg  # only here: the DuckDB path does not need it

        try:
            conn = pg.connect(self.conninfo, autocommit=True)
        except Exception as err:  # noqa: BLE001 - libpq's message names host, port and cause
            raise MirrorError(f"cannot connect to the PostgreSQL catalog: {err}") from err
        try:
            with conn.cursor() as cur:
                cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")

                def q(sql: str, params: Sequence[Any] = ()) -> List[Row]:
                    if params:
                        cur.execute(_numbered(sql), list(params))
                    else:
                        cur.execute(sql)
                    return cur.fetchall()

                yield q
                cur.execute("COMMIT")
        finally:
            conn.close()


def _numbered(sql: str) -> str:
    """`?` placeholders as PostgreSQL's `$1, $2, ...` (the mirror's SQL has no other `?`)."""
    parts = sql.split("?")
    return parts[0] + "".join(f"${i}{part}" for i, part in enumerate(parts[1:], start=1))


def open_catalog(spec: str) -> Catalog:
    """The catalog a command line names: `postgres:CONNINFO` (also DuckLake's own
    `ducklake:postgres:CONNINFO`) or a DuckDB file (`PATH` or `ducklake:PATH`)."""
    rest = spec[len("ducklake:"):] if spec.startswith("ducklake:") else spec
    if rest.startswith("postgres:"):
        conninfo = rest[len("postgres:"):]
        if not conninfo.strip():
            raise MirrorError("`postgres:` needs a libpq connection string, e.g. "
                              "postgres:dbname=lake host=127.0.0.1")
        return PostgresCatalog(conninfo)
    return DuckLakeCatalog.open(rest)


# --------------------------------------------------------------------------------------------
# The moraine side.


@dataclass
class MoraineState:
    """What moraine holds of the rows a plan touches: what it is filtered against."""

    mappings: Dict[int, int] = field(default_factory=dict)  # mapping_id -> table_id
    # data_file_id -> (table_id, begin_snapshot, end_snapshot)
    files: Dict[int, Tuple[Optional[int], Optional[int], Optional[int]]] = field(
        default_factory=dict)

    @classmethod
    def read(cls, conn) -> "MoraineState":
        """Everything: every mapping and every data file (to find what the catalog removed)."""
        with conn.cursor() as cur:
            cur.execute("SELECT mapping_id, table_id FROM ducklake_column_mapping")
            mappings = {m: t for m, t in cur.fetchall()}
            cur.execute(f"SELECT {_FILE_STATE} FROM ducklake_data_file")
            files = {f: (t, b, e) for f, t, b, e in cur.fetchall()}
        return cls(mappings, files)

    @classmethod
    def read_for(cls, conn, catalog: CatalogRead, held: Held) -> "MoraineState":
        """What `plan` needs of moraine for `catalog`: all of it when the catalog removed
        something; else only the held files the catalog retired since the snapshot cursor,
        and the live files of the tables it dropped since (their retirement's shape depends
        on them). Rows at or above the file cursor moraine does not hold, by definition."""
        if catalog.removed_some:
            return cls.read(conn)
        files: Dict[int, Tuple[Optional[int], Optional[int], Optional[int]]] = {}
        with conn.cursor() as cur:
            retired = [r[0] for r in catalog.files if r[0] < held.file_cursor]
            for where in _in_lists("data_file_id", retired):
                cur.execute(f"SELECT {_FILE_STATE} FROM ducklake_data_file WHERE {where}")
                files.update({f: (t, b, e) for f, t, b, e in cur.fetchall()})
            for where in _in_lists("table_id", sorted(catalog.dropped_tables)):
                cur.execute(f"SELECT {_FILE_STATE} FROM ducklake_data_file "
                            f"WHERE end_snapshot IS NULL AND {where}")
                files.update({f: (t, b, e) for f, t, b, e in cur.fetchall()})
        return cls({}, files)


_FILE_STATE = "data_file_id, table_id, begin_snapshot, end_snapshot"
# Ids per `IN (...)` list of the mirror's own reads, well inside the server's SQL limits.
_IN_LIST = 1000


def _in_lists(column: str, ids: Sequence[int]) -> Iterator[str]:
    for i in range(0, len(ids), _IN_LIST):
        yield f"{column} IN ({_ids(ids[i:i + _IN_LIST])})"


def plan_sync(conn, catalog: "Catalog") -> List[StagedCommit]:
    """The moraine transactions that bring what `conn` reads of moraine to `catalog`, from
    one read of each that costs in proportion to what changed since the last sync."""
    held = Held.read(conn)
    read = catalog.read(held)
    check_served(conn, read.version)
    return plan(read, MoraineState.read_for(conn, read, held))


@dataclass
class Retirement:
    snapshot: int
    by: str  # "data_file_id" or "table_id"
    ids: List[int]
    expected_rows: int


@dataclass
class StagedCommit:
    """One moraine transaction: one DuckLake commit (`snapshot_id`), or the removals of a sync
    that has no commit to carry them (`snapshot_id` None)."""

    snapshot_id: Optional[int]
    version: str = "0.3"  # the catalog's DuckLake version: the columns of `files`
    delete_files: List[int] = field(default_factory=list)
    delete_mapping_tables: List[int] = field(default_factory=list)
    deleted_mappings: int = 0
    mappings: List[Row] = field(default_factory=list)
    names: List[Row] = field(default_factory=list)
    files: List[Row] = field(default_factory=list)
    retirements: List[Retirement] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not (self.delete_files or self.delete_mapping_tables or self.mappings
                    or self.names or self.files or self.retirements)

    def describe(self) -> str:
        head = (f"snapshot {self.snapshot_id}" if self.snapshot_id is not None
                else "removals")
        parts = []
        if self.mappings:
            parts.append(f"+{len(self.mappings)} mapping(s) ({len(self.names)} name rows)")
        if self.files:
            parts.append(f"+{len(self.files)} data file(s)")
        retired = sum(len(r.ids) if r.by == "data_file_id" else r.expected_rows
                      for r in self.retirements)
        if retired:
            parts.append(f"{retired} data file(s) retired")
        if self.delete_files:
            parts.append(f"-{len(self.delete_files)} data file(s)")
        if self.delete_mapping_tables:
            parts.append(f"-{self.deleted_mappings} mapping(s) of table(s) "
                         f"{self.delete_mapping_tables}")
        return f"{head}: " + ", ".join(parts)


def plan(catalog: CatalogRead, state: MoraineState) -> List[StagedCommit]:
    """The moraine transactions that bring `state` to the catalog, in order."""
    commits: Dict[int, StagedCommit] = {}
    file_mapping = _file_mapping(catalog.version)

    def commit(snapshot: int) -> StagedCommit:
        if snapshot not in commits:
            commits[snapshot] = StagedCommit(snapshot, catalog.version)
        return commits[snapshot]

    # New data files (begin commit) and retirements (end commit).
    new_files: List[Row] = []
    ends: Dict[int, List[Row]] = {}
    for row in catalog.files:
        file_id, end = row[0], row[_END]
        held = state.files.get(file_id)
        if held is None:
            if row[_BEGIN] is None:
                raise MirrorError(f"data file {file_id} has no begin_snapshot")
            new_files.append(row)
            if end is not None:
                ends.setdefault(end, []).append(row)
        elif held[2] is None and end is not None:
            ends.setdefault(end, []).append(row)
        elif held[2] != end:
            raise MirrorError(
                f"data file {file_id}: moraine has end_snapshot {held[2]}, the catalog {end}; "
                "DuckLake never changes a retired file")
    for row in new_files:
        commit(row[_BEGIN]).files.append(row[:_END] + (None,) + row[_END + 1:])

    # New mappings: where DuckLake drew the id, or earlier if a file needs it earlier.
    first_use: Dict[int, int] = {}
    for row in new_files:
        m = row[file_mapping]
        if m is not None:
            first_use[m] = min(first_use.get(m, row[_BEGIN]), row[_BEGIN])
    names_of: Dict[int, List[Row]] = {}
    for n in catalog.names:
        names_of.setdefault(n[0], []).append(n)
    for m in catalog.mappings:
        mapping_id = m[0]
        if mapping_id in state.mappings:
            continue
        drawn = next((s for s, nxt in catalog.snapshots
                      if nxt is not None and nxt > mapping_id), None)
        candidates = [s for s in (drawn, first_use.get(mapping_id)) if s is not None]
        if not candidates:
            raise MirrorError(f"mapping {mapping_id}: no snapshot of the catalog drew its id "
                              "and no data file uses it")
        c = commit(min(candidates))
        c.mappings.append(m)
        c.names.extend(names_of.get(mapping_id, []))

    # Retirements, with the live files per table as they are when each commit lands.
    live: Dict[Any, Set[int]] = {}
    for file_id, (table_id, _, end) in state.files.items():
        if end is None:
            live.setdefault(table_id, set()).add(file_id)
    for snapshot in sorted(set(commits) | set(ends)):
        c = commit(snapshot)
        for row in c.files:
            live.setdefault(row[_FILE_TABLE], set()).add(row[0])
        if snapshot not in ends:
            continue
        by_table: Dict[Any, List[int]] = {}
        for row in ends[snapshot]:
            by_table.setdefault(row[_FILE_TABLE], []).append(row[0])
        per_file: List[int] = []
        whole_tables: List[int] = []
        whole_rows = 0
        for table_id, ids in sorted(by_table.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
            if (table_id is not None and catalog.dropped_tables.get(table_id) == snapshot
                    and set(ids) == live.get(table_id, set())):
                whole_tables.append(table_id)
                whole_rows += len(ids)
            else:
                per_file.extend(ids)
            live[table_id] = live.get(table_id, set()) - set(ids)
        if whole_tables:
            c.retirements.append(Retirement(snapshot, "table_id", whole_tables, whole_rows))
        if per_file:
            c.retirements.append(Retirement(snapshot, "data_file_id", sorted(per_file),
                                            len(per_file)))

    # Removals: what moraine holds and the catalog no longer does.
    out = [commits[s] for s in sorted(commits) if not commits[s].is_empty()]
    if catalog.mapping_tables is None or catalog.file_ids is None:
        return out  # the counts say nothing was removed
    gone_files = sorted(f for f in state.files if f not in catalog.file_ids)
    gone_maps = {m: t for m, t in state.mappings.items() if m not in catalog.mapping_tables}
    gone_tables = sorted({t for t in gone_maps.values()}, key=lambda t: (t is None, t or 0))
    for table_id in gone_tables:
        kept = sorted(m for m, t in catalog.mapping_tables.items() if t == table_id)
        if table_id is None or kept:
            raise MirrorError(
                f"the catalog deleted some mappings of table {table_id} and kept {kept}; "
                "DuckLake only deletes all mappings of a dropped table")
    deleted_mappings = sum(1 for t in state.mappings.values() if t in set(gone_tables))
    if gone_files or gone_tables:
        carrier = out[-1] if out else StagedCommit(None, catalog.version)
        carrier.delete_files = gone_files
        carrier.delete_mapping_tables = gone_tables
        carrier.deleted_mappings = deleted_mappings
        if not out:
            out.append(carrier)
    return out


def _ids(ids: Iterable[int]) -> str:
    return ", ".join(str(int(i)) for i in ids)


def _arrow(table: str, rows: Sequence[Row], version: str = "0.3") -> pa.Table:
    return pa.table({
        name: pa.array([r[i] for r in rows], type=typ)
        for i, (name, typ) in enumerate(columns(table, version))
    })


def _execute(cur, sql: str, expected: Optional[int]) -> int:
    cur.execute(sql)  # the server runs DML when the statement executes; rowcount is its count
    count = cur.rowcount
    if expected is not None and count is not None and count >= 0 and count != expected:
        raise MirrorError(f"`{sql}` affected {count} rows, expected {expected}")
    return count


def apply(conn, commit: StagedCommit) -> None:
    """Stages `commit` in the connection's open transaction and commits it; on any error the
    transaction is rolled back and the error re-raised."""
    try:
        with conn.cursor() as cur:
            if commit.delete_files:
                _execute(cur, DELETE_FILES.format(ids=_ids(commit.delete_files)),
                         len(commit.delete_files))
            if commit.delete_mapping_tables:
                _execute(cur, DELETE_MAPPINGS.format(ids=_ids(commit.delete_mapping_tables)),
                         commit.deleted_mappings)
                _execute(cur, SWEEP_NAMES, None)
            if commit.mappings:
                cur.adbc_ingest(COLUMN_MAPPING, _arrow(COLUMN_MAPPING, commit.mappings),
                                mode="append")
            if commit.names:
                cur.adbc_ingest(NAME_MAPPING, _arrow(NAME_MAPPING, commit.names), mode="append")
            if commit.files:
                cur.adbc_ingest(DATA_FILE, _arrow(DATA_FILE, commit.files, commit.version),
                                mode="append")
            for r in commit.retirements:
                shape = RETIRE_TABLES if r.by == "table_id" else RETIRE_FILES
                _execute(cur, shape.format(snapshot=int(r.snapshot), ids=_ids(r.ids)),
                         r.expected_rows)
        conn.commit()
    except BaseException:
        try:
            conn.rollback()
        except Exception:  # noqa: BLE001 - the original error matters more
            LOG.debug("rollback after a failed commit failed too", exc_info=True)
        raise


def connect(uri: str, **kwargs):
    """An ADBC Flight SQL DB-API connection (autocommit off: one server transaction open)."""
    import adbc_driver_flightsql.dbapi as flightsql

    with warnings.catch_warnings():
        # A server without transactions makes the driver warn that autocommit stays on; the
        # first staged write then fails with the server's own error, which says more.
        warnings.simplefilter("ignore")
        return flightsql.connect(uri, **kwargs)


def credentials(username: Optional[str] = None, password: Optional[str] = None,
                token: Optional[str] = None) -> Dict[str, Any]:
    """`connect()` keyword arguments that authenticate to a server started with
    `--auth-file`: a user's login (the driver's `username`/`password` options: a Basic login,
    whose session token the driver then sends on every call), or a pre-issued token sent as
    `authorization: Bearer ...`. None of them: no credentials (an unauthenticated server)."""
    if username is not None and token is not None:
        raise ValueError("a username or a token, not both")
    if username is not None:
        if not password:
            raise ValueError(f"no password for user {username}")
        return {"db_kwargs": {"username": username, "password": password}}
    if token is not None:
        from adbc_driver_flightsql import DatabaseOptions

        return {"db_kwargs": {DatabaseOptions.AUTHORIZATION_HEADER.value: f"Bearer {token}"}}
    return {}


def _is_conflict(err: BaseException) -> bool:
    import adbc_driver_manager.dbapi as dbapi

    return isinstance(err, dbapi.OperationalError) and "conflict" in str(err).lower()


@dataclass
class SyncResult:
    commits: List[StagedCommit]  # the transactions committed, in order
    attempts: int


class Mirror:
    """Mirrors one DuckLake catalog into one moraine server; `sync()` as often as wanted."""

    def __init__(self, catalog: Catalog, moraine_uri: str, *, max_attempts: int = 5,
                 connect_kwargs: Optional[Dict[str, Any]] = None):
        self.catalog = catalog
        self.uri = moraine_uri
        self.max_attempts = max_attempts
        self.connect_kwargs = dict(connect_kwargs or {})

    def plan(self) -> List[StagedCommit]:
        """What `sync()` would stage now, without staging it."""
        conn = connect(self.uri, **self.connect_kwargs)
        try:
            return plan_sync(conn, self.catalog)
        finally:
            conn.close()

    def sync(self, on_staged: Optional[Callable[[StagedCommit], None]] = None) -> SyncResult:
        """Stages every DuckLake commit moraine does not hold yet, one transaction each,
        calling `on_staged` after each commit.

        Raises `MirrorError` for a catalog it cannot mirror faithfully, the DB-API's errors
        for what the server refuses. A commit that fails is re-planned from a fresh read of
        moraine: gone from the plan (another mirror staged it first) it is not an error; a
        write conflict is retried; any other refusal of the same commit is raised."""
        done: List[StagedCommit] = []
        failed: Optional[Tuple[StagedCommit, BaseException]] = None
        for attempt in range(1, self.max_attempts + 1):
            conn = connect(self.uri, **self.connect_kwargs)
            try:
                commits = plan_sync(conn, self.catalog)
                if (failed is not None and commits and commits[0] == failed[0]
                        and not _is_conflict(failed[1])):
                    raise failed[1]
                failed = None
                for c in commits:
                    try:
                        apply(conn, c)
                    except Exception as err:  # noqa: BLE001 - re-planned below
                        _note(err, f"while staging {c.describe()}")
                        failed = (c, err)
                        break
                    LOG.info("staged %s", c.describe())
                    done.append(c)
                    if on_staged is not None:
                        on_staged(c)
                else:
                    return SyncResult(done, attempt)
            finally:
                try:
                    conn.close()
                except Exception:  # noqa: BLE001 - nothing is staged on a closed connection
                    pass
            LOG.warning("attempt %d: %s; re-planning", attempt, failed[1])
            time.sleep(min(0.05 * 2 ** attempt, 1.0))
        assert failed is not None
        raise failed[1]


def _note(err: BaseException, text: str) -> None:
    if hasattr(err, "add_note"):  # Python 3.11+
        err.add_note(text)


# --------------------------------------------------------------------------------------------
# Command line.


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description="Mirror a DuckLake catalog's mapping and data-file tables into moraine.")
    parser.add_argument("--catalog", required=True,
                        help="the DuckLake catalog: a DuckDB file (e.g. lake.ducklake) or "
                             "postgres:CONNINFO, a libpq connection string (e.g. "
                             "'postgres:dbname=lake host=db.internal user=mirror'; a password "
                             "belongs in PGPASSWORD or ~/.pgpass, not on the command line)")
    parser.add_argument("--moraine", required=True,
                        help="the moraine server, e.g. grpc://127.0.0.1:50051")
    parser.add_argument("--username",
                        help="log in as this moraine user (a writer), with the password in "
                             "the environment variable MORAINE_PASSWORD; without it, a token "
                             "in MORAINE_TOKEN is used if set")
    parser.add_argument("--watch", type=float, metavar="SECONDS",
                        help="keep syncing, every SECONDS, until interrupted")
    parser.add_argument("--dry-run", action="store_true",
                        help="print what would be staged, stage nothing")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    if args.username is not None:
        password = os.environ.get("MORAINE_PASSWORD")
        if not password:
            parser.error("--username needs the password in MORAINE_PASSWORD")
        auth = credentials(username=args.username, password=password)
    else:
        auth = credentials(token=os.environ.get("MORAINE_TOKEN") or None)
    try:
        mirror = Mirror(open_catalog(args.catalog), args.moraine, connect_kwargs=auth)
        if args.dry_run:
            for c in mirror.plan():
                print(f"would stage {c.describe()}", flush=True)
            return 0
        on_staged = lambda c: print(f"staged {c.describe()}", flush=True)  # noqa: E731
        while True:
            try:
                result = mirror.sync(on_staged=on_staged)
            except MirrorError:
                raise
            except Exception as err:  # noqa: BLE001 - a watcher outlives a failed sync
                if not args.watch:
                    raise
                print(f"warning: this sync failed, the next in {args.watch} s: {err}",
                      file=sys.stderr, flush=True)
            else:
                if not result.commits and not args.watch:
                    print("moraine is up to date", flush=True)
            if not args.watch:
                return 0
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0
    except Exception as err:  # noqa: BLE001 - a command line reports, it does not trace
        notes = "".join(f" ({n})" for n in getattr(err, "__notes__", []))
        print(f"error: {err}{notes}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
