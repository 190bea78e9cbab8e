"""End to end with the real DuckLake extension: foreign Parquet registered by DuckLake, mirrored
into moraine by `integration/ducklake_mirror.py`, read back verbatim.

DuckLake 1.4.4 runs in this process from PyPI (`duckdb`, `duckdb-ext-ducklake`: the extension
is loaded from the package's own folder, with auto-install off, so no network is used) on a
catalog in a DuckDB file under a temporary directory. Every test's moraine server starts on an
empty store (`server_factory` with an empty dump), with authentication on: its credentials file
(`--auth-file`) holds one writer user and a writer token. The mirror logs in as that user
(`ducklake_mirror.credentials`; the command line's `--username` and MORAINE_PASSWORD); the
checks' own connections send the token (a login costs an Argon2 hash, slow in a debug build,
and the checks open a connection for each read).

The scenario tests (`test_s*`) build one lake step by step, in file order; each DuckLake commit
is mirrored at once and then checked: the mirror staged one transaction per DuckLake commit and
stages nothing when run again, and DuckLake's own mapping load (cold and with DuckLake's
cursor), DuckLake's data-file query (for every table, at each snapshot since the previous
check; at every snapshot after an expiry and at the end) and a plain read of each table give
the same rows on moraine (through ADBC) as on DuckLake's catalog (the same SQL run by DuckDB).
A step after a failed one is skipped, naming the failure. The expected rows are always the
catalog's own; nothing is hard-coded but the shape of the scenario. Other tests catch up many
commits in one sync (and resume an interrupted one) and run the mirror's command line.

DuckLake's later catalog versions (0.4, 1.0, 1.1-dev1; their `ducklake_data_file` has other
columns) come from a catalog DuckLake 1.4.4 wrote, migrated by DuckLake's own statements
(`migrate`): mirrored into a server started with that version's `--ducklake-version`, moraine's
`ducklake_data_file` is the catalog's column for column; into a server of another version, the
mirror refuses before staging anything, naming both.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import itertools
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import adbc_driver_flightsql.dbapi as flightsql
import duckdb
import pyarrow as pa
import pytest

from conftest import (
    COLUMNS,
    add_user,
    column_names,
    create_token,
    data_file_names,
    free_port,
    mapping_order_key,
    sort_key,
    sorted_rows,
)

from test_metrics import METRICS_ARGS, ROWS, metrics_url, scrape

INTEGRATION = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(INTEGRATION))
import ducklake_mirror as dm  # noqa: E402  (integration/ducklake_mirror.py)

COLUMN_MAPPING, NAME_MAPPING, DATA_FILE = dm.COLUMN_MAPPING, dm.NAME_MAPPING, dm.DATA_FILE
TABLES = (COLUMN_MAPPING, NAME_MAPPING, DATA_FILE)

# DuckLake 1.4's mapping load, verbatim; every later load adds DuckLake's cursor.
MAPPING_LOAD = """SELECT mapping_id, table_id, type, column_id, source_name, target_field_id, parent_column, is_partition
FROM ducklake_column_mapping
JOIN ducklake_name_mapping USING (mapping_id)
ORDER BY mapping_id, parent_column NULLS FIRST"""
MAPPING_LOAD_FROM = """SELECT mapping_id, table_id, type, column_id, source_name, target_field_id, parent_column, is_partition
FROM ducklake_column_mapping
JOIN ducklake_name_mapping USING (mapping_id)
WHERE mapping_id >= {cursor}
ORDER BY mapping_id, parent_column NULLS FIRST"""
MAPPING_LOAD_BOUND = MAPPING_LOAD_FROM.format(cursor="?")
JOIN_COLUMNS = ["mapping_id", "table_id", "type", "column_id", "source_name", "target_field_id",
                "parent_column", "is_partition"]
# DuckLake's data-file read of table T at snapshot S (its filter, on the table's own columns).
DATA_FILE_AT = (
    "SELECT " + ", ".join(column_names(DATA_FILE)) + " FROM ducklake_data_file "
    "WHERE table_id = ? AND ? >= begin_snapshot AND (? < end_snapshot OR end_snapshot IS NULL)"
)
# Expires every snapshot but the latest (counted, not fetched: its rows hold timestamps).
EXPIRE = "SELECT count(*) FROM ducklake_expire_snapshots('lake', older_than => now())"
SWEEP = dm.SWEEP_NAMES
DELETE_MAPPINGS = dm.DELETE_MAPPINGS

# The nested table of the scenario (the layout of the recorded fixture's table t).
S_TYPE = "STRUCT(a INTEGER, b VARCHAR, n STRUCT(x DOUBLE, y BIGINT))"
LS_TYPE = "STRUCT(p INTEGER, q VARCHAR)[]"
T_DDL = (f"CREATE TABLE lake.t(id INTEGER, s {S_TYPE}, l INTEGER[], m MAP(VARCHAR, INTEGER), "
         f"ls {LS_TYPE}, part VARCHAR)")


def full_layout(first_id: int) -> str:
    """Two rows in t's layout without `part` (it comes from the hive path)."""
    return f"""
    SELECT * FROM (VALUES
      ({first_id}::INTEGER,
       {{'a': {first_id}, 'b': 'b{first_id}', 'n': {{'x': 1.5, 'y': {first_id}::BIGINT}}}}::{S_TYPE},
       [1, 2, {first_id}]::INTEGER[],
       MAP {{'k{first_id}': {first_id}, 'z': 0}}::MAP(VARCHAR, INTEGER),
       [{{'p': {first_id}, 'q': 'q'}}, {{'p': 0, 'q': NULL}}]::{LS_TYPE}),
      ({first_id + 1}::INTEGER, NULL::{S_TYPE}, []::INTEGER[], NULL::MAP(VARCHAR, INTEGER),
       [{{'p': NULL, 'q': 'only q'}}]::{LS_TYPE})
    ) v(id, s, l, m, ls)"""


# --------------------------------------------------------------------------------------------
# DuckLake, for real.


def ducklake_extension_dir() -> Path:
    spec = importlib.util.find_spec("duckdb_ext")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(loc) / "extensions"
        if candidate.is_dir():
            return candidate
    pytest.fail("the DuckLake extension package is missing: pip install "
                "duckdb-ext-ducklake (pinned in integration/python/requirements.txt)",
                pytrace=False)


def sql_text(value: Any) -> str:
    return "'" + str(value).replace("'", "''") + "'"


class Lake:
    """A DuckLake catalog attached as `name` by the real extension, with its data under
    `root`: in a DuckDB file under `root`, or with `postgres` (a libpq connection string) in
    that PostgreSQL database. `meta` is a connection of its own to DuckLake's metadata
    database (for PostgreSQL, through DuckDB's postgres extension)."""

    def __init__(self, root: Path, name: str = "lake", postgres: Optional[str] = None):
        self.root, self.name, self.postgres = root, name, postgres
        self.catalog_path = root / "catalog.ducklake"
        self.meta_db = f"__ducklake_metadata_{name}"
        self.con = duckdb.connect()
        self.con.execute(f"SET extension_directory = {sql_text(ducklake_extension_dir())}")
        self.con.execute("SET autoinstall_known_extensions = false")
        self.con.execute("SET autoload_known_extensions = false")
        self.con.execute("LOAD ducklake")
        if postgres is not None:
            self.con.execute("LOAD postgres")
        self.con.execute(f"ATTACH {sql_text('ducklake:' + self.catalog_spec)} AS {name} "
                         f"(DATA_PATH {sql_text(str(root / 'data') + '/')})")
        self.meta = self.con.cursor()
        self.meta.execute(f"USE {self.meta_db}")
        self.closed = False

    @property
    def catalog_spec(self) -> str:
        """The catalog as the mirror's `--catalog` names it (and DuckLake, after `ducklake:`)."""
        return f"postgres:{self.postgres}" if self.postgres is not None else str(self.catalog_path)

    def mirror_catalog(self) -> dm.Catalog:
        """The mirror's reader of this catalog: PostgreSQL directly (no DuckDB), or the
        attached DuckDB file."""
        if self.postgres is not None:
            return dm.PostgresCatalog(self.postgres)
        return dm.DuckLakeCatalog.attached(self.con, self.name)

    def sql(self, text: str, params: Sequence[Any] = ()) -> List[Tuple[Any, ...]]:
        return [tuple(r) for r in self.con.execute(text, list(params)).fetchall()]

    def catalog(self, text: str, params: Sequence[Any] = ()) -> List[Tuple[Any, ...]]:
        """`text` run by DuckDB on DuckLake's own metadata tables (unqualified names)."""
        return [tuple(r) for r in self.meta.execute(text, list(params)).fetchall()]

    def write_parquet(self, select: str, rel: str) -> Path:
        """Plain `COPY ... TO` (no field ids)."""
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        self.con.execute(f"COPY ({select}) TO {sql_text(path)} (FORMAT parquet)")
        return path

    def add_files(self, table: str, path, **options: bool) -> None:
        opts = "".join(f", {k} => {'true' if v else 'false'}" for k, v in options.items())
        self.con.execute(f"CALL ducklake_add_data_files({sql_text(self.name)}, {sql_text(table)}, "
                         f"{sql_text(path)}{opts})")

    def snapshot(self) -> Tuple[int, int]:
        """(snapshot_id, next_file_id) of the latest snapshot."""
        return self.catalog("SELECT snapshot_id, next_file_id FROM ducklake_snapshot "
                            "ORDER BY snapshot_id DESC LIMIT 1")[0]

    def table_id(self, name: str) -> int:
        return self.catalog("SELECT table_id FROM ducklake_table WHERE table_name = ? "
                            "ORDER BY table_id DESC LIMIT 1", [name])[0][0]

    def close(self) -> None:
        self.meta.close()
        self.con.close()
        self.closed = True


# --------------------------------------------------------------------------------------------
# moraine, through ADBC.


@contextlib.contextmanager
def moraine(uri: str, auth: Dict[str, Any]) -> Iterator[Any]:
    """A fresh ADBC connection (so its transaction sees every commit so far), logged in with
    `auth` (`dm.credentials(...)`)."""
    conn = dm.connect(uri, **auth)
    try:
        yield conn
    finally:
        conn.close()


def fetch(conn, sql: str, params: Optional[Sequence[Any]] = None) -> pa.Table:
    with conn.cursor() as cur:
        if params is None:
            cur.execute(sql)
        else:
            cur.execute(sql, list(params))
        return cur.fetch_arrow_table()


def rows_of(table: pa.Table) -> List[Tuple[Any, ...]]:
    return [tuple(r.values()) for r in table.to_pylist()]


def assert_types(table: pa.Table, names: Sequence[str], what: str) -> None:
    types = dict(COLUMNS[COLUMN_MAPPING] + COLUMNS[NAME_MAPPING] + COLUMNS[DATA_FILE])
    got = [(f.name, str(f.type)) for f in table.schema]
    want = [(n, str(types[n])) for n in names]
    assert got == want, f"{what}: result columns {got}, expected {want}"


def assert_same_rows(got, want, what: str) -> None:
    got, want = sorted_rows(got), sorted_rows(want)
    if got != want:
        g, w = collections.Counter(got), collections.Counter(want)
        pytest.fail(
            f"{what}: moraine has {len(got)} rows, the DuckLake catalog {len(want)}\n"
            f"  only in the catalog: {list((w - g).elements())[:20]}\n"
            f"  only in moraine:     {list((g - w).elements())[:20]}",
            pytrace=False,
        )


def ordered_groups(rows) -> List[Tuple[Any, List[Tuple[Any, ...]]]]:
    """`ORDER BY mapping_id, parent_column NULLS FIRST` fixes the order of these groups; the
    order inside a group (siblings) is unspecified."""
    out: List[Tuple[Any, List[Tuple[Any, ...]]]] = []
    for r in rows:
        key = mapping_order_key(r)
        if out and out[-1][0] == key:
            out[-1][1].append(tuple(r))
        else:
            out.append((key, [tuple(r)]))
    return [(k, sorted(g, key=sort_key)) for k, g in out]


def assert_mapping_load(got: pa.Table, want, what: str) -> None:
    assert_types(got, JOIN_COLUMNS, what)
    got_rows = rows_of(got)
    assert_same_rows(got_rows, want, what)
    g, w = ordered_groups(got_rows), ordered_groups(want)
    if [k for k, _ in g] != [k for k, _ in w] or g != w:
        pytest.fail(f"{what}: rows not in DuckLake's order (mapping_id, parent_column NULLS "
                    f"FIRST)\n  moraine: {got_rows}\n  catalog: {list(want)}", pytrace=False)


# --------------------------------------------------------------------------------------------
# The harness: mirror each commit, then compare.


# The mirror's user: a writer, the one user of each server's credentials file.
MIRROR_USER = "mirror"
MIRROR_PASSWORD = "mirror: DuckLake e2e"


@dataclass
class Secured:
    """A moraine server whose calls need credentials, and how to log in to it."""

    uri: str
    auth: Dict[str, Any]  # dm.connect's keyword arguments: the mirror's user login
    token: str  # a pre-issued writer token
    running: Any  # conftest's Running: the server process

    @property
    def checks(self) -> Dict[str, Any]:
        """dm.connect's keyword arguments for the checks: the token."""
        return dm.credentials(token=self.token)


def start_secured(server_factory, root: Path, name: str, extra_args: Sequence[Any] = (),
                  ducklake_version: Optional[str] = None) -> Secured:
    """A server on an empty store with `--auth-file` listing the mirror's writer user and a
    writer token (and `extra_args`). The server is checked to refuse a connection without
    credentials. With `ducklake_version` it serves that DuckLake version's catalog
    (`--ducklake-version`), on a store `moraine serve` creates (a store `moraine import`
    made records the default, 0.3, when it first opens it); without, on an empty import's."""
    auth_file = root / "credentials"
    add_user(auth_file, MIRROR_USER, "writer", MIRROR_PASSWORD)
    token = create_token(auth_file, "mirror-token", "writer")
    version_args = ["--ducklake-version", ducklake_version] if ducklake_version else []
    running = server_factory(name, empty_dump(root) if ducklake_version is None else None,
                             extra_args=["--auth-file", auth_file, *version_args, *extra_args])
    with pytest.raises(flightsql.Error) as refused:
        with moraine(running.uri, {}) as conn:
            fetch(conn, "SELECT 1")
    assert "Unauthenticated" in str(refused.value), refused.value
    return Secured(running.uri, dm.credentials(username=MIRROR_USER, password=MIRROR_PASSWORD),
                   token, running)


def empty_dump(root: Path) -> Path:
    """A dump of no commits, for `moraine import` (a server on an empty store)."""
    path = root / "empty-steps.json"
    path.write_text(json.dumps({"source": "empty: the DuckLake e2e tests start from nothing",
                                "table_t": {}, "steps": {}}))
    return path


class Harness:
    def __init__(self, lake: Lake, server: Secured):
        self.lake, self.uri, self.auth, self.checks = lake, server.uri, server.auth, server.checks
        self.catalog = lake.mirror_catalog()
        self.mirror = dm.Mirror(self.catalog, self.uri, connect_kwargs=self.auth)
        self.cursor: Optional[int] = None  # DuckLake's: next_file_id at the previous load
        self.checked: Optional[int] = None  # the snapshot of the previous check
        self.table_ids = set()
        self.failed: Optional[str] = None
        self.marks: Dict[str, Any] = {}

    # One DuckLake commit (or several, `expect` naming the snapshots that change the three
    # tables, None for a removal-only transaction), mirrored and checked.
    def sync(self, expect: Sequence[Optional[int]], *, catalog_orphans: bool = False,
             every_snapshot: bool = False) -> dm.SyncResult:
        result = self.mirror.sync()
        got = [c.snapshot_id for c in result.commits]
        assert got == list(expect), (
            f"the mirror staged transactions for {got}, expected one per DuckLake commit "
            f"{list(expect)}: " + "; ".join(c.describe() for c in result.commits))
        again = self.mirror.sync()
        assert again.commits == [], (
            "re-running the mirror staged " + "; ".join(c.describe() for c in again.commits))
        assert dm.Mirror(self.lake.mirror_catalog(), self.uri,
                         connect_kwargs=self.auth).plan() == [], \
            "a fresh mirror still finds work"
        self.check(catalog_orphans=catalog_orphans, every_snapshot=every_snapshot)
        return result

    def check(self, *, catalog_orphans: bool = False, every_snapshot: bool = False) -> None:
        """moraine against the catalog: the three tables, DuckLake's mapping load (with its
        cursor, then cold), DuckLake's data-file query for every table at each snapshot since
        the previous check (the one before included; all of them with `every_snapshot`)."""
        lake = self.lake
        snapshot, next_file_id = lake.snapshot()
        self.table_ids |= {r[0] for r in lake.catalog("SELECT table_id FROM ducklake_table")}
        self.table_ids |= {r[0] for r in lake.catalog(
            "SELECT DISTINCT table_id FROM ducklake_data_file")}
        with moraine(self.uri, self.checks) as conn:
            # The three tables row for row.
            for table in TABLES:
                cols = ", ".join(column_names(table))
                got = fetch(conn, f"SELECT {cols} FROM {table}")
                assert_types(got, column_names(table), f"SELECT of {table}")
                want = lake.catalog(f"SELECT {cols} FROM {table}")
                if table == NAME_MAPPING and catalog_orphans:
                    # moraine keeps a mapping's name rows inside it: the catalog's orphans
                    # (waiting for their sweep) have no counterpart there.
                    want = lake.catalog(
                        f"SELECT {cols} FROM {table} n WHERE EXISTS (SELECT 1 FROM "
                        "ducklake_column_mapping m WHERE m.mapping_id = n.mapping_id)")
                assert_same_rows(rows_of(got), want, f"{table} at snapshot {snapshot}")
            # DuckLake's mapping load with DuckLake's cursor: the next_file_id of the snapshot
            # at the previous load (as DuckLake sends it: a literal), and the same bound.
            if self.cursor is not None:
                want = lake.catalog(MAPPING_LOAD_FROM.format(cursor=self.cursor))
                assert_mapping_load(fetch(conn, MAPPING_LOAD_FROM.format(cursor=self.cursor)),
                                    want, f"mapping load from cursor {self.cursor}")
                assert_mapping_load(fetch(conn, MAPPING_LOAD_BOUND, [self.cursor]), want,
                                    f"mapping load from bound cursor {self.cursor}")
            # DuckLake's data-file query, for every table (and one that never existed).
            first = 0 if every_snapshot or self.checked is None else self.checked
            for table_id in sorted(self.table_ids | {max(self.table_ids, default=0) + 1}):
                for s in range(first, snapshot + 2):
                    want = lake.catalog(DATA_FILE_AT, [table_id, s, s])
                    got = fetch(conn, DATA_FILE_AT, [table_id, s, s])
                    assert_same_rows(rows_of(got), want,
                                     f"data files of table {table_id} at snapshot {s}")
        # The cold load: the first request of a new connection.
        with moraine(self.uri, self.checks) as conn:
            assert_mapping_load(fetch(conn, MAPPING_LOAD), lake.catalog(MAPPING_LOAD),
                                f"cold mapping load at snapshot {snapshot}")
        self.cursor = next_file_id
        self.checked = snapshot

    # Steps of a scenario run in order; one that follows a failure is skipped.
    @contextlib.contextmanager
    def step(self, name: str):
        if self.failed:
            pytest.skip(f"an earlier step failed: {self.failed}")
        try:
            yield
        except BaseException:
            self.failed = name
            raise

    def moraine_mapping(self, mapping_id: int) -> List[Tuple[Any, ...]]:
        with moraine(self.uri, self.checks) as conn:
            rows = rows_of(fetch(conn, MAPPING_LOAD_FROM.format(cursor=mapping_id)))
        return [r for r in rows if r[0] == mapping_id]

    def moraine_files(self, table_id: int, snapshot: int) -> List[Dict[str, Any]]:
        with moraine(self.uri, self.checks) as conn:
            return fetch(conn, DATA_FILE_AT, [table_id, snapshot, snapshot]).to_pylist()


# Where DuckLake keeps the catalog: a DuckDB file, or a database of the session's private
# PostgreSQL cluster (`postgres_cluster`; skipped where the PostgreSQL binaries are missing).
BACKENDS = ("duckdb", "postgres")
_DATABASES = itertools.count(1)


def make_lake(request, root: Path, backend: str) -> Lake:
    if backend == "postgres":
        cluster = request.getfixturevalue("postgres_cluster")
        return Lake(root, postgres=cluster.create_database(f"lake_{next(_DATABASES)}"))
    return Lake(root)


@contextlib.contextmanager
def secured_lake(request, server_factory, tmp_path_factory, name: str, backend: str,
                 extra_args: Sequence[Any] = (), ducklake_version: Optional[str] = None
                 ) -> Iterator[Tuple[Path, Secured, Lake]]:
    """A directory, a secured server on an empty store (`start_secured`, serving DuckLake
    `ducklake_version` if given) and a lake on `backend` in that directory, closed at the end
    (unless the test closed it)."""
    root = tmp_path_factory.mktemp(name)
    running = start_secured(server_factory, root, name, extra_args, ducklake_version)
    lake = make_lake(request, root, backend)
    try:
        yield root, running, lake
    finally:
        if not lake.closed:
            lake.close()


@pytest.fixture(scope="module", params=BACKENDS)
def scenario(request, server_factory, tmp_path_factory) -> Iterator[Harness]:
    root = tmp_path_factory.mktemp(f"ducklake-e2e-{request.param}")
    server = start_secured(server_factory, root, f"ducklake-e2e-{request.param}")
    lake = make_lake(request, root, request.param)
    try:
        yield Harness(lake, server)
    finally:
        lake.close()


# --------------------------------------------------------------------------------------------
# What DuckLake reads from a registered file against what moraine's mapping says.


def parquet_tree(lake: Lake, path: str) -> Dict[str, Any]:
    """The file's Parquet schema as nested {name: children}."""
    flat = lake.sql(f"SELECT name, num_children FROM parquet_schema({sql_text(path)})")
    pos = 0

    def node() -> Tuple[str, Dict[str, Any]]:
        nonlocal pos
        name, n = flat[pos]
        pos += 1
        children = dict(node() for _ in range(n or 0))
        return name, children

    return node()[1]


def parquet_child(tree: Dict[str, Any], name: str) -> Optional[Dict[str, Any]]:
    """`name` among a Parquet group's children, looking through one repeated wrapper group
    (LIST's `list`/`element`, MAP's `key_value`) the way a mapping tree leaves them out."""
    if name in tree:
        return tree[name]
    if len(tree) == 1:
        (inner,) = tree.values()
        if name in inner:
            return inner[name]
    return None


class Column:
    def __init__(self, column_id, name, ctype, parent):
        self.id, self.name, self.type, self.parent = column_id, name, ctype, parent
        self.children: List["Column"] = []


def table_columns(lake: Lake, table_id: int, snapshot: int) -> Dict[int, Column]:
    cols = {r[0]: Column(*r) for r in lake.catalog(
        "SELECT column_id, column_name, column_type, parent_column FROM ducklake_column "
        "WHERE table_id = ? AND ? >= begin_snapshot AND (? < end_snapshot OR end_snapshot IS NULL) "
        "ORDER BY column_order", [table_id, snapshot, snapshot])}
    for c in cols.values():
        if c.parent is not None:
            cols[c.parent].children.append(c)
    return cols


class MapNode:
    def __init__(self, row):
        (_, _, _, self.column_id, self.source_name, self.target, self.parent,
         self.is_partition) = row
        self.children: List["MapNode"] = []


def mapping_tree(rows) -> List[MapNode]:
    nodes = {r[3]: MapNode(r) for r in rows}
    roots = []
    for n in nodes.values():
        (nodes[n.parent].children if n.parent is not None else roots).append(n)
    return roots


def expected_value(value: Any, node: MapNode, col: Column) -> Any:
    """What DuckLake must read for table column `col` from the file value `value` of the
    mapped column `node`."""
    if value is None:
        return None
    if col.type == "struct":
        by_target = {c.target: c for c in node.children}
        return {c.name: (expected_value(value.get(by_target[c.id].source_name),
                                        by_target[c.id], c)
                         if c.id in by_target else None)
                for c in col.children}
    if col.type == "list":
        (elem,) = col.children
        (child,) = node.children
        return [expected_value(v, child, elem) for v in value]
    if col.type == "map":
        key_col, value_col = col.children
        by_target = {c.target: c for c in node.children}
        return {expected_value(k, by_target[key_col.id], key_col):
                expected_value(v, by_target[value_col.id], value_col)
                for k, v in value.items()}
    return value


def check_file_against_mapping(h: Harness, table: str, table_id: int, file: Dict[str, Any]):
    """One registered file: moraine's mapping for it names real table fields, real Parquet
    columns and real key=value path segments, and explains every value DuckLake reads."""
    lake = h.lake
    snapshot = lake.snapshot()[0]
    path = file["path"]
    rows = h.moraine_mapping(file["mapping_id"])
    assert rows, f"{path}: moraine has no mapping {file['mapping_id']}"
    assert {r[1] for r in rows} == {table_id}, f"{path}: mapping of another table: {rows}"
    cols = table_columns(lake, table_id, snapshot)
    tree = parquet_tree(lake, path)
    segments = Path(path).parts
    roots = mapping_tree(rows)
    partition_values = {}

    def walk(node: MapNode, parent_col: Optional[Column], parquet: Optional[Dict[str, Any]]):
        assert node.target in cols, (
            f"{path}: mapping column {node.column_id} ({node.source_name}) targets field "
            f"{node.target}, which table {table} does not have")
        col = cols[node.target]
        assert col.parent == (parent_col.id if parent_col else None), (
            f"{path}: {node.source_name} -> {col.name} crosses the table's nesting")
        if node.is_partition:
            assert parent_col is None and not node.children, f"{path}: nested partition column"
            seg = [s for s in segments if s.startswith(node.source_name + "=")]
            assert seg, f"{path}: partition column {node.source_name} is no key=value segment"
            partition_values[col.id] = seg[-1].split("=", 1)[1]
            return
        assert parquet is not None
        sub = parquet_child(parquet, node.source_name)
        assert sub is not None, (
            f"{path}: source_name {node.source_name!r} is not in the file's Parquet schema "
            f"(at its place in the tree)")
        for child in node.children:
            walk(child, col, sub)

    for root in roots:
        walk(root, None, tree)

    # The data: every row of the file, as DuckLake returns it, is the file's row mapped by
    # moraine's mapping (unmapped table columns read NULL, partition columns the path value).
    by_target = {n.target: n for n in roots}
    id_col = next(c for c in cols.values() if c.parent is None and c.name == "id")
    id_source = by_target[id_col.id].source_name
    cur = lake.con.execute(
        f"SELECT * FROM read_parquet({sql_text(path)}, hive_partitioning = false)")
    names = [d[0] for d in cur.description]
    file_rows = [dict(zip(names, r)) for r in cur.fetchall()]
    ids = [r[id_source] for r in file_rows]
    cur = lake.con.execute(f"SELECT * FROM lake.{table} WHERE id IN ({', '.join(map(str, ids))})")
    names = [d[0] for d in cur.description]
    read = {r[0]: dict(zip(names, r)) for r in cur.fetchall()}
    assert sorted(read) == sorted(ids), f"{path}: DuckLake reads ids {sorted(read)}, file has {ids}"
    top = [c for c in cols.values() if c.parent is None]
    for frow in file_rows:
        want = {}
        for c in top:
            node = by_target.get(c.id)
            if node is None:
                want[c.name] = None
            elif node.is_partition:
                want[c.name] = partition_values[c.id]
            else:
                want[c.name] = expected_value(frow[node.source_name], node, c)
        assert read[frow[id_source]] == want, (
            f"{path}: DuckLake reads {read[frow[id_source]]}, moraine's mapping says {want}")


def registered_files(h: Harness, table_id: int) -> List[Dict[str, Any]]:
    return [f for f in h.moraine_files(table_id, h.lake.snapshot()[0])
            if f["mapping_id"] is not None]


# --------------------------------------------------------------------------------------------
# The scenario, one DuckLake commit (or a few) per step.


def test_s01_nested_table_with_hive_file(scenario):
    h, lake = scenario, scenario.lake
    with h.step("nested table with a hive file"):
        lake.sql(T_DDL)
        h.sync([])  # CREATE TABLE touches none of the three tables
        f1 = lake.write_parquet(full_layout(10), "ext/part=x/f1.parquet")
        lake.add_files("t", f1, hive_partitioning=True)
        snap = lake.snapshot()[0]
        result = h.sync([snap])
        h.marks["f1"] = (snap, str(f1))
        (c,) = result.commits
        assert len(c.mappings) == 1 and len(c.files) == 1, c.describe()
        mapping_id = c.files[0][-1]
        rows = h.moraine_mapping(mapping_id)
        names = {r[4] for r in rows}
        assert {"s", "n", "x", "list", "key", "value", "p", "q"} <= names, rows
        assert [r[4] for r in rows if r[7]] == ["part"], "one is_partition column"
        assert any(r[6] is not None and r[4] == "n" for r in rows), "STRUCT inside STRUCT"


def test_s02_same_layout_reuses_mapping(scenario):
    h, lake = scenario, scenario.lake
    with h.step("second file, same layout"):
        f2 = lake.write_parquet(full_layout(20), "ext/part=y/f2.parquet")
        lake.add_files("t", f2, hive_partitioning=True)
        snap = lake.snapshot()[0]
        (c,) = h.sync([snap]).commits
        assert not c.mappings and len(c.files) == 1, "DuckLake reuses the mapping"
        mapping_of = {f["path"]: f["mapping_id"] for f in h.moraine_files(lake.table_id("t"), snap)}
        assert mapping_of[str(f2)] == mapping_of[h.marks["f1"][1]]
        h.marks["f2"] = (snap, str(f2), mapping_of[str(f2)])


def test_s03_reordered_upper_case_columns(scenario):
    h, lake = scenario, scenario.lake
    with h.step("reordered columns and upper-case names"):
        f3 = lake.write_parquet(
            "SELECT [{'q': 'q3', 'p': 3}]::STRUCT(q VARCHAR, p INTEGER)[] ls, "
            "MAP {'k': 3}::MAP(VARCHAR, INTEGER) m, [3]::INTEGER[] l, "
            "{'N': {'Y': 3::BIGINT, 'X': 3.5}, 'B': 'z', 'A': 3}"
            "::STRUCT(\"N\" STRUCT(\"Y\" BIGINT, \"X\" DOUBLE), \"B\" VARCHAR, \"A\" INTEGER) S, "
            "'in the file' part, 30::INTEGER \"ID\"",
            "ext/plain/f3.parquet")
        lake.add_files("t", f3)
        snap = lake.snapshot()[0]
        (c,) = h.sync([snap]).commits
        assert len(c.mappings) == 1, "a new layout is a new mapping"
        rows = h.moraine_mapping(c.mappings[0][0])
        assert {"ID", "S", "N", "X"} <= {r[4] for r in rows}, rows
        assert not any(r[7] for r in rows), "no hive path, no partition column"


def test_s04_missing_and_extra_columns(scenario):
    h, lake = scenario, scenario.lake
    with h.step("missing and extra columns"):
        f4 = lake.write_parquet(
            "SELECT 40::INTEGER id, {'a': 40, 'b': 'w'}::STRUCT(a INTEGER, b VARCHAR) s, "
            "[4]::INTEGER[] l, 'ignored' extra_col", "ext/part=z/f4.parquet")
        lake.add_files("t", f4, hive_partitioning=True, allow_missing=True,
                       ignore_extra_columns=True)
        snap = lake.snapshot()[0]
        (c,) = h.sync([snap]).commits
        rows = h.moraine_mapping(c.mappings[0][0])
        names = {r[4] for r in rows}
        assert "extra_col" not in names and "m" not in names and "n" not in names, rows


def test_s05_ducklake_partitioned_table(scenario):
    h, lake = scenario, scenario.lake
    with h.step("DuckLake-partitioned table"):
        lake.sql("CREATE TABLE lake.t2(id INTEGER, v VARCHAR, part VARCHAR)")
        lake.sql("ALTER TABLE lake.t2 SET PARTITIONED BY (part)")
        h.sync([])
        lake.write_parquet("SELECT 50::INTEGER id, 'g1' v", "ext2/part=p1/g1.parquet")
        lake.write_parquet("SELECT 60::INTEGER id, 'g2' v", "ext2/part=p2/g2.parquet")
        lake.add_files("t2", lake.root / "ext2" / "*" / "*.parquet", hive_partitioning=True)
        snap = lake.snapshot()[0]
        (c,) = h.sync([snap]).commits
        assert len(c.mappings) == 1 and len(c.files) == 2, c.describe()
        files = h.moraine_files(lake.table_id("t2"), snap)
        assert all(f["partition_id"] is not None for f in files), files
        assert [r[4] for r in h.moraine_mapping(c.mappings[0][0]) if r[7]] == ["part"]


def test_s06_normal_insert(scenario):
    h, lake = scenario, scenario.lake
    with h.step("normal INSERT"):
        lake.sql("INSERT INTO lake.t(id, l, part) VALUES (100, [7], 'ins')")
        snap = lake.snapshot()[0]
        (c,) = h.sync([snap]).commits
        assert not c.mappings and len(c.files) == 1
        (f,) = [f for f in h.moraine_files(lake.table_id("t"), snap) if f["begin_snapshot"] == snap]
        assert f["mapping_id"] is None and f["path_is_relative"] is True, f


def test_s07_select_agrees_with_moraine_mappings(scenario):
    h, lake = scenario, scenario.lake
    with h.step("SELECT through DuckLake against moraine's mappings"):
        seen = 0
        for table in ("t", "t2"):
            table_id = lake.table_id(table)
            for f in registered_files(h, table_id):
                check_file_against_mapping(h, table, table_id, f)
                seen += 1
        assert seen == 6, f"{seen} registered files checked, expected f1-f4, g1, g2"
        total = lake.sql("SELECT count(*) FROM lake.t")[0][0]
        assert total == 2 + 2 + 1 + 1 + 1


def test_s08_time_travel(scenario):
    h, lake = scenario, scenario.lake
    with h.step("time travel"):
        f2_snap, f2_path, f2_mapping = h.marks["f2"]
        f1_snap, f1_path = h.marks["f1"]
        table_id = lake.table_id("t")
        lake.sql("DELETE FROM lake.t WHERE id IN (20, 21)")  # all of f2: DuckLake retires it
        snap = lake.snapshot()[0]
        (c,) = h.sync([snap]).commits
        assert [(r.by, len(r.ids)) for r in c.retirements] == [("data_file_id", 1)], c.describe()
        assert lake.sql("SELECT id FROM lake.t WHERE id IN (20, 21)") == []
        assert sorted(lake.sql(f"SELECT id FROM lake.t AT (VERSION => {f2_snap}) "
                               "WHERE id IN (20, 21)")) == [(20,), (21,)]
        assert sorted(lake.sql(f"SELECT id FROM lake.t AT (VERSION => {f1_snap})")) == [(10,), (11,)]
        at_f2 = {f["path"]: f for f in h.moraine_files(table_id, f2_snap)}
        assert at_f2[f2_path]["mapping_id"] == f2_mapping
        assert at_f2[f2_path]["end_snapshot"] == snap
        assert str(f2_path) not in {f["path"] for f in h.moraine_files(table_id, snap)}
        at_f1 = h.moraine_files(table_id, f1_snap)
        assert [f["path"] for f in at_f1] == [f1_path] and at_f1[0]["mapping_id"] is not None


def test_s09_drop_table(scenario):
    h, lake = scenario, scenario.lake
    with h.step("DROP TABLE"):
        h.marks["t2_id"] = lake.table_id("t2")
        lake.sql("DROP TABLE lake.t2")
        snap = lake.snapshot()[0]
        (c,) = h.sync([snap]).commits
        assert [(r.by, r.ids) for r in c.retirements] == [("table_id", [h.marks["t2_id"]])], (
            "DROP TABLE retires through DuckLake's table_id shape")


def test_s10_expire_snapshots(scenario):
    h, lake = scenario, scenario.lake
    with h.step("ducklake_expire_snapshots (1.4.4: mappings survive)"):
        mappings_before = lake.catalog("SELECT count(*) FROM ducklake_column_mapping")
        lake.sql(EXPIRE)
        (c,) = h.sync([None], every_snapshot=True).commits
        assert len(c.delete_files) == 3 and not c.delete_mapping_tables, c.describe()
        assert lake.catalog("SELECT count(*) FROM ducklake_column_mapping") == mappings_before


def test_s11_newer_expiry_same_transaction(scenario):
    h, lake = scenario, scenario.lake
    with h.step("newer DuckLake's mapping cleanup, sweep in the same transaction"):
        t2 = h.marks["t2_id"]
        lake.meta.execute("BEGIN TRANSACTION")
        lake.meta.execute(DELETE_MAPPINGS.format(ids=t2))
        lake.meta.execute(SWEEP)
        lake.meta.execute("COMMIT")
        (c,) = h.sync([None]).commits
        assert c.delete_mapping_tables == [t2] and c.deleted_mappings == 1, c.describe()


def test_s12_newer_expiry_sweep_later(scenario):
    h, lake = scenario, scenario.lake
    with h.step("newer DuckLake's mapping cleanup, sweep in a later transaction"):
        lake.sql("CREATE TABLE lake.t3(id INTEGER, v VARCHAR)")
        h.sync([])
        h1 = lake.write_parquet("SELECT 70::INTEGER id, 'h' v", "ext3/h1.parquet")
        lake.add_files("t3", h1)
        h.sync([lake.snapshot()[0]])
        t3 = lake.table_id("t3")
        lake.sql("DROP TABLE lake.t3")
        h.sync([lake.snapshot()[0]])
        # Expiry with the mapping DELETE in its transaction, the sweep not yet.
        lake.sql("BEGIN TRANSACTION")
        lake.sql(EXPIRE)
        lake.sql(f"DELETE FROM {lake.meta_db}.ducklake_column_mapping WHERE table_id IN ({t3})")
        lake.sql("COMMIT")
        orphans = lake.catalog("SELECT count(*) FROM ducklake_name_mapping n WHERE NOT EXISTS "
                               "(SELECT 1 FROM ducklake_column_mapping m "
                               "WHERE m.mapping_id = n.mapping_id)")[0][0]
        assert orphans == 2, "the catalog keeps t3's name rows until the sweep"
        (c,) = h.sync([None], catalog_orphans=True).commits
        assert c.delete_files and c.delete_mapping_tables == [t3], c.describe()
        # DuckLake's statements again in a later moraine transaction: nothing left to remove.
        with moraine(h.uri, h.checks) as conn:
            with conn.cursor() as cur:
                cur.execute(DELETE_MAPPINGS.format(ids=t3))
                assert cur.rowcount == 0, f"repeated mapping DELETE affected {cur.rowcount}"
                cur.execute(SWEEP)
                assert cur.rowcount == 0, f"the sweep affected {cur.rowcount} rows"
            conn.commit()
        h.check(catalog_orphans=True)
        # The catalog's own sweep, later: now the rows agree exactly.
        lake.meta.execute(SWEEP)
        h.sync([])


def test_s13_final_state(scenario):
    h, lake = scenario, scenario.lake
    with h.step("final state"):
        h.check(every_snapshot=True)
        for f in registered_files(h, lake.table_id("t")):
            check_file_against_mapping(h, "t", lake.table_id("t"), f)


# --------------------------------------------------------------------------------------------
# Catching up: many DuckLake commits, one sync; and a sync interrupted between commits.


@pytest.mark.parametrize("backend", BACKENDS)
def test_catch_up_and_resume(request, server_factory, tmp_path_factory, backend):
    root = tmp_path_factory.mktemp(f"ducklake-catchup-{backend}")
    running = start_secured(server_factory, root, f"ducklake-catchup-{backend}")
    lake = make_lake(request, root, backend)
    try:
        h = Harness(lake, running)
        commits = []
        lake.sql(T_DDL)
        for i, part in enumerate(("a", "b"), start=1):
            lake.add_files("t", lake.write_parquet(full_layout(10 * i), f"x/part={part}/k{i}.parquet"),
                           hive_partitioning=True)
            commits.append(lake.snapshot()[0])
        lake.sql("CREATE TABLE lake.d(id INTEGER, v VARCHAR, w VARCHAR)")
        lake.add_files("d", lake.write_parquet("SELECT 1::INTEGER id, 'v' v", "y/d1.parquet"),
                       allow_missing=True)
        commits.append(lake.snapshot()[0])
        lake.sql("INSERT INTO lake.t(id, part) VALUES (99, 'c')")
        commits.append(lake.snapshot()[0])
        lake.sql("DELETE FROM lake.t WHERE id IN (20, 21)")  # retires k2
        commits.append(lake.snapshot()[0])
        lake.sql("DROP TABLE lake.d")
        commits.append(lake.snapshot()[0])

        # Interrupted: only the first two DuckLake commits reach moraine.
        with moraine(running.uri, running.auth) as conn:
            planned = dm.plan_sync(conn, h.catalog)
            assert [c.snapshot_id for c in planned] == commits
            for c in planned[:2]:
                dm.apply(conn, c)
            # The first commit again (a stale plan): refused as a whole, nothing changes.
            before = {t: sorted_rows(rows_of(fetch(conn, f"SELECT * FROM {t}"))) for t in TABLES}
            with pytest.raises(flightsql.ProgrammingError, match="already exists"):
                dm.apply(conn, planned[0])
            after = {t: sorted_rows(rows_of(fetch(conn, f"SELECT * FROM {t}"))) for t in TABLES}
            assert after == before, "a refused commit left rows behind"
        h.sync(commits[2:], every_snapshot=True)

        # Newer DuckLake's expiry: file deletes and the mapping cleanup in one transaction.
        d = lake.table_id("d")
        lake.sql("BEGIN TRANSACTION")
        lake.sql(EXPIRE)
        lake.sql(f"DELETE FROM {lake.meta_db}.ducklake_column_mapping WHERE table_id IN ({d})")
        lake.sql(f"DELETE FROM {lake.meta_db}.ducklake_name_mapping tbl WHERE NOT EXISTS (SELECT 1 "
                 f"FROM {lake.meta_db}.ducklake_column_mapping m WHERE m.mapping_id = tbl.mapping_id)")
        lake.sql("COMMIT")
        (c,) = h.sync([None], every_snapshot=True).commits
        assert len(c.delete_files) == 2 and c.delete_mapping_tables == [d], c.describe()
    finally:
        lake.close()


# --------------------------------------------------------------------------------------------
# The command line, on a catalog file no DuckLake holds open.


@pytest.mark.parametrize("backend", BACKENDS)
def test_command_line(request, server_factory, tmp_path_factory, backend):
    root = tmp_path_factory.mktemp(f"ducklake-cli-{backend}")
    running = start_secured(server_factory, root, f"ducklake-cli-{backend}")
    lake = make_lake(request, root, backend)
    catalog = lake.catalog_spec
    try:
        lake.sql(T_DDL)
        lake.add_files("t", lake.write_parquet(full_layout(1), "e/part=q/c1.parquet"),
                       hive_partitioning=True)
        lake.sql("INSERT INTO lake.t(id, part) VALUES (5, 'r')")
        snapshots = [s for (s,) in lake.catalog("SELECT snapshot_id FROM ducklake_snapshot "
                                                "ORDER BY snapshot_id")][-2:]
    finally:
        lake.close()  # DuckDB locks the file for the process that has it open
    base = [sys.executable, str(INTEGRATION / "ducklake_mirror.py"), "--catalog", catalog,
            "--moraine", running.uri]

    login = ["--username", MIRROR_USER]

    def mirror(*extra: str, env: Dict[str, str]) -> subprocess.CompletedProcess:
        """The command line, with only `env`'s credentials in its environment."""
        environ = {k: v for k, v in os.environ.items()
                   if k not in ("MORAINE_PASSWORD", "MORAINE_TOKEN")}
        return subprocess.run(base + list(extra), capture_output=True, text=True, timeout=90,
                              stdin=subprocess.DEVNULL, env={**environ, **env})

    def run(*extra: str, env: Dict[str, str]) -> str:
        done = mirror(*extra, env=env)
        assert done.returncode == 0, f"{extra}: exit {done.returncode}\n{done.stdout}{done.stderr}"
        return done.stdout

    # Without credentials the server refuses the mirror; a login needs its password.
    anonymous = mirror(env={})
    assert anonymous.returncode == 1 and "Unauthenticated" in anonymous.stderr, anonymous
    no_password = mirror(*login, env={})
    assert no_password.returncode == 2 and "MORAINE_PASSWORD" in no_password.stderr, no_password

    dry = run("--dry-run", env={"MORAINE_TOKEN": running.token})
    assert [line.split(":")[0] for line in dry.splitlines()] == [
        f"would stage snapshot {s}" for s in snapshots], dry
    out = run(*login, env={"MORAINE_PASSWORD": MIRROR_PASSWORD})
    assert [line.split(":")[0] for line in out.splitlines()] == [
        f"staged snapshot {s}" for s in snapshots], out
    assert run(*login, env={"MORAINE_PASSWORD": MIRROR_PASSWORD}).strip() == \
        "moraine is up to date"

    assert_mirrored(lake, running, "after the command line")

    if backend == "postgres":
        missing, complaint = (f"postgres:host=127.0.0.1 port={free_port()} dbname=none "
                              "connect_timeout=5", "cannot connect to the PostgreSQL catalog")
    else:
        missing, complaint = str(root / "missing.ducklake"), "no DuckLake catalog file"
    bad = subprocess.run(base[:3] + [missing, "--moraine", running.uri], capture_output=True,
                         text=True, timeout=60, stdin=subprocess.DEVNULL,
                         env={**os.environ, "MORAINE_TOKEN": running.token})
    assert bad.returncode == 1 and complaint in bad.stderr, bad


def assert_mirrored(lake: Lake, running: Secured, when: str, version: str = "0.3") -> None:
    """moraine's three tables and DuckLake's mapping load on it equal the catalog's (its
    `ducklake_data_file` with the columns of DuckLake `version`, of DATA_FILE_VERSIONS)."""
    with catalog_query(lake) as meta, moraine(running.uri, running.checks) as conn:
        for table in TABLES:
            names = data_file_names(version) if table == DATA_FILE else column_names(table)
            cols = ", ".join(names)
            assert_same_rows(rows_of(fetch(conn, f"SELECT {cols} FROM {table}")),
                             meta(f"SELECT {cols} FROM {table}"), f"{table} {when}")
        assert_mapping_load(fetch(conn, MAPPING_LOAD), meta(MAPPING_LOAD),
                            f"mapping load {when}")


@contextlib.contextmanager
def catalog_query(lake: Lake) -> Iterator[Any]:
    """A function running SQL on the lake's catalog tables, by the catalog's own engine:
    PostgreSQL through its ADBC driver, or DuckDB (the lake's own connection while it is
    open, the file read-only once it is closed)."""
    if lake.postgres is None and not lake.closed:
        yield lake.catalog
    elif lake.postgres is not None:
        import adbc_driver_postgresql.dbapi as pg

        with pg.connect(lake.postgres, autocommit=True) as conn, conn.cursor() as cur:
            def run(sql: str) -> List[Tuple[Any, ...]]:
                cur.execute(sql)
                return [tuple(r) for r in cur.fetchall()]

            yield run
    else:
        meta = duckdb.connect(str(lake.catalog_path), read_only=True)
        try:
            yield lambda sql: [tuple(r) for r in meta.execute(sql).fetchall()]
        finally:
            meta.close()


def assert_moraine_empty(running: Secured, what: str) -> None:
    with moraine(running.uri, running.checks) as conn:
        for table in TABLES:
            n = fetch(conn, f"SELECT count(*) AS n FROM {table}").column(0)[0].as_py()
            assert n == 0, f"{table} got {n} rows {what}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_other_catalog_version_refused(request, server_factory, tmp_path_factory, backend):
    """A catalog of a DuckLake version the mirror does not know (its tables may have other
    columns) is refused, naming the version, and nothing reaches moraine."""
    with secured_lake(request, server_factory, tmp_path_factory,
                      f"ducklake-version-{backend}", backend) as (root, running, lake):
        lake.sql(T_DDL)
        lake.add_files("t", lake.write_parquet(full_layout(1), "v/part=a/v1.parquet"),
                       hive_partitioning=True)
        mirror = dm.Mirror(lake.mirror_catalog(), running.uri, connect_kwargs=running.auth)
        for version in ("0.2", "2.0"):
            lake.meta.execute("UPDATE ducklake_metadata SET value = ? WHERE key = 'version'",
                              [version])
            named = rf"DuckLake catalog version {re.escape(version)};"
            with pytest.raises(dm.MirrorError, match=named):
                mirror.sync()
            with pytest.raises(dm.MirrorError, match=named):
                mirror.plan()
            assert_moraine_empty(running, f"from a refused catalog of version {version}")


# --------------------------------------------------------------------------------------------
# DuckLake's later catalog versions. DuckDB 1.4.4's DuckLake (the one installable here)
# writes version 0.3; a catalog of 0.4, 1.0 or 1.1-dev1 is made from one it wrote by
# DuckLake's own migration statements, as a newer DuckLake runs them when it attaches it.

# From duckdb/ducklake's src/storage/ducklake_metadata_manager.cpp (main), verbatim but for
# what the mirror never reads: the `ducklake_data_file` statements and the version update of
# DuckLakeMetadataManager::MigrateV03 (0.3 to 0.4), MigrateV04 (0.4 to 1.0: only the version)
# and MigrateV10 (1.0 to 1.1-dev1). Their placeholders are filled as ExecuteMigration does
# without allow_failures ({IF_NOT_EXISTS}, {IF_EXISTS} empty) and {METADATA_CATALOG} names
# the metadata database; DuckLake runs them as DuckDB SQL on it (Execute(string), through
# ExecuteRaw) on either backend.
MIGRATE_V03 = r"""
ALTER TABLE {METADATA_CATALOG}.ducklake_data_file ADD COLUMN {IF_NOT_EXISTS} partial_max BIGINT;
CREATE TEMP TABLE {IF_NOT_EXISTS} __ducklake_partial_max_migration AS
SELECT data_file_id, TRY_CAST(regexp_extract(partial_file_info, 'partial_max:(\d+)', 1) AS BIGINT) AS partial_max
FROM {METADATA_CATALOG}.ducklake_data_file
WHERE partial_file_info IS NOT NULL AND partial_file_info LIKE '%partial_max:%';
ALTER TABLE {METADATA_CATALOG}.ducklake_data_file DROP COLUMN {IF_EXISTS} partial_file_info;
UPDATE {METADATA_CATALOG}.ducklake_data_file AS df
SET partial_max = m.partial_max
FROM __ducklake_partial_max_migration m
WHERE df.data_file_id = m.data_file_id;
DROP TABLE IF EXISTS __ducklake_partial_max_migration;
UPDATE {METADATA_CATALOG}.ducklake_metadata SET value = '0.4' WHERE key = 'version';
"""
MIGRATE_V04 = r"""
UPDATE {METADATA_CATALOG}.ducklake_metadata SET value = '1.0' WHERE key = 'version';
"""
MIGRATE_V10 = r"""
ALTER TABLE {METADATA_CATALOG}.ducklake_data_file ADD COLUMN {IF_NOT_EXISTS} row_group_count BIGINT;
UPDATE {METADATA_CATALOG}.ducklake_metadata SET value = '1.1-dev1' WHERE key = 'version';
"""
# A catalog version (as ducklake_metadata spells it) -> the migrations from 0.3 to it, and
# the version a moraine serving its tables is started with (`--ducklake-version`).
MIGRATIONS = {"0.3": [], "0.4": [MIGRATE_V03], "1.0": [MIGRATE_V03, MIGRATE_V04],
              "1.1-dev1": [MIGRATE_V03, MIGRATE_V04, MIGRATE_V10]}
SERVED_AS = {"0.3": "0.3", "0.4": "1.0", "1.0": "1.0", "1.1-dev1": "1.1"}


def migrate(lake: Lake, version: str) -> None:
    """Migrates the lake's 0.3 catalog to `version` with DuckLake's statements, one at a time
    (DuckDB's postgres extension refuses to commit an UPDATE of a table that an ALTER of the
    same transaction changed; DuckLake's own run is one transaction, which DuckDB files take).
    Checks the version the catalog then records."""
    for migration in MIGRATIONS[version]:
        sql = (migration.replace("{METADATA_CATALOG}", lake.meta_db)
               .replace("{IF_NOT_EXISTS} ", "").replace("{IF_EXISTS} ", ""))
        assert "{" not in sql, f"a placeholder left in {sql}"
        for statement in (s.strip() for s in sql.split(";\n")):
            if statement:
                lake.meta.execute(statement)
    assert lake.catalog("SELECT value FROM ducklake_metadata WHERE key = 'version'") == \
        [(version,)]


def write_versioned_lake(lake: Lake) -> None:
    """DuckLake 1.4.4's commits of every kind the mirror stages, on a 0.3 catalog: foreign
    files (mappings, a hive partition, a mapping reused), an INSERT, a DELETE that retires a
    file, a DROP TABLE, and rows inlined in the catalog then flushed to one file, for which
    DuckLake writes `partial_file_info` 'partial_max:N' (what MigrateV03 turns into
    `partial_max`)."""
    lake.sql(T_DDL)
    for i, part in enumerate(("a", "b"), start=1):
        path = lake.write_parquet(full_layout(10 * i), f"v/part={part}/f{i}.parquet")
        lake.add_files("t", path, hive_partitioning=True)
    lake.sql("CREATE TABLE lake.d(id INTEGER, v VARCHAR, w VARCHAR)")
    lake.add_files("d", lake.write_parquet("SELECT 1::INTEGER id, 'v' v", "v/d1.parquet"),
                   allow_missing=True)
    lake.sql("INSERT INTO lake.t(id, part) VALUES (99, 'c')")
    lake.sql("DELETE FROM lake.t WHERE id IN (20, 21)")  # all of f2: DuckLake retires it
    lake.sql("DROP TABLE lake.d")
    lake.sql(f"CALL {lake.name}.set_option('data_inlining_row_limit', 10)")
    lake.sql("CREATE TABLE lake.w(id INTEGER, v VARCHAR)")
    for i in range(3):
        lake.sql(f"INSERT INTO lake.w VALUES ({i}, 'inlined')")
    lake.sql(f"CALL ducklake_flush_inlined_data({sql_text(lake.name)})")
    flushed = lake.catalog("SELECT partial_file_info FROM ducklake_data_file "
                           "WHERE partial_file_info LIKE 'partial_max:%'")
    assert len(flushed) == 1, (
        f"DuckLake's flush of inlined rows wrote partial_file_info {flushed}, expected one "
        "'partial_max:N'")


Described = Tuple[List[str], List[Tuple[Any, ...]]]  # a result's column names and rows


@contextlib.contextmanager
def catalog_select(lake: Lake) -> Iterator[Callable[[str], Described]]:
    """Like `catalog_query` on a closed lake, but each query gives its result's column names
    too."""
    assert lake.closed, "the lake's own connection has the catalog's DuckDB file open"
    if lake.postgres is not None:
        import adbc_driver_postgresql.dbapi as pg

        with pg.connect(lake.postgres, autocommit=True) as conn, conn.cursor() as cur:
            def run(sql: str) -> Described:
                cur.execute(sql)
                rows = [tuple(r) for r in cur.fetchall()]
                return [d[0] for d in cur.description], rows

            yield run
    else:
        meta = duckdb.connect(str(lake.catalog_path), read_only=True)
        try:
            def run(sql: str) -> Described:
                cur = meta.execute(sql)
                rows = [tuple(r) for r in cur.fetchall()]
                return [d[0] for d in cur.description], rows

            yield run
        finally:
            meta.close()


def catalog_execute(lake: Lake, sql: str) -> None:
    """Runs the statement `sql` on the closed lake's catalog tables, by the catalog's own
    engine (what a newer DuckLake's commit would do there)."""
    assert lake.closed, "the lake's own connection has the catalog's DuckDB file open"
    if lake.postgres is not None:
        import adbc_driver_postgresql.dbapi as pg

        with pg.connect(lake.postgres, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(sql)
    else:
        meta = duckdb.connect(str(lake.catalog_path))
        try:
            meta.execute(sql)
        finally:
            meta.close()


ALL_DATA_FILES = "SELECT * FROM ducklake_data_file ORDER BY data_file_id"


def assert_data_files_copied(lake: Lake, running: Secured, version: str, when: str) -> None:
    """moraine's `SELECT *` of ducklake_data_file is the catalog's, column for column and
    row for row, and so is a read of the version's own columns; then the other tables too."""
    with catalog_select(lake) as meta, moraine(running.uri, running.checks) as conn:
        want_names, want = meta(ALL_DATA_FILES)
        got = fetch(conn, ALL_DATA_FILES)
        assert got.schema.names == want_names, (
            f"{when}: moraine's ducklake_data_file has the columns {got.schema.names}, the "
            f"catalog's {want_names}")
        assert want_names == data_file_names(version), (
            f"{when}: DuckLake's migrated catalog has the columns {want_names}, not DuckLake "
            f"{version}'s {data_file_names(version)}")
        assert rows_of(got) == want, (
            f"{when}: moraine's ducklake_data_file differs from the catalog's\n"
            f"  moraine: {rows_of(got)}\n  catalog: {want}")
        later = [n for n in ("partial_max", "row_group_count") if n in want_names]
        sql = (f"SELECT data_file_id, {', '.join(later)} FROM ducklake_data_file WHERE "
               + " OR ".join(f"{n} IS NOT NULL" for n in later) + " ORDER BY data_file_id")
        assert rows_of(fetch(conn, sql)) == meta(sql)[1], f"{when}: `{sql}`"
        sql = (f"SELECT {', '.join(reversed(want_names))} FROM ducklake_data_file "
               "ORDER BY data_file_id")
        assert rows_of(fetch(conn, sql)) == meta(sql)[1], f"{when}: `{sql}`"
    assert_mirrored(lake, running, when, version)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("version", ["0.4", "1.0", "1.1-dev1"])
def test_later_catalog_version_mirrored(request, server_factory, tmp_path_factory, version,
                                        backend):
    """A catalog DuckLake migrated to 0.4, 1.0 or 1.1-dev1, mirrored into a moraine serving
    that version's tables: one transaction per DuckLake commit, and moraine's
    ducklake_data_file is the catalog's, with its columns in its order (partial_max from
    DuckLake's own 'partial_max:N', row_group_count where set); then a removal the catalog
    makes afterwards is mirrored too, and a sync after each stages nothing."""
    served = SERVED_AS[version]
    with secured_lake(request, server_factory, tmp_path_factory,
                      f"ducklake-v{version}-{backend}", backend,
                      ducklake_version=served) as (root, running, lake):
        write_versioned_lake(lake)
        migrate(lake, version)
        if served == "1.1":
            # No DuckLake here writes row_group_count: set it on the foreign files.
            lake.meta.execute("UPDATE ducklake_data_file SET row_group_count = "
                              "data_file_id + 1 WHERE mapping_id IS NOT NULL")
        partial = lake.catalog("SELECT data_file_id, partial_max FROM ducklake_data_file "
                               "WHERE partial_max IS NOT NULL")
        assert len(partial) == 1, f"MigrateV03 filled partial_max of {partial}, expected one"
        spans = lake.catalog("SELECT begin_snapshot, end_snapshot FROM ducklake_data_file")
        commits = sorted({b for b, _ in spans} | {e for _, e in spans if e is not None})
        mapped = lake.catalog("SELECT count(*) FROM ducklake_column_mapping")[0][0]
        lake.close()  # DuckLake 1.4.4 does not open what it cannot write; the mirror reads it

        mirror = dm.Mirror(dm.open_catalog(lake.catalog_spec), running.uri,
                           connect_kwargs=running.auth)
        result = mirror.sync()
        assert [c.snapshot_id for c in result.commits] == commits, (
            "one moraine transaction per DuckLake commit: "
            + "; ".join(c.describe() for c in result.commits))
        assert sum(len(c.mappings) for c in result.commits) == mapped == 2, \
            [c.describe() for c in result.commits]
        assert_data_files_copied(lake, running, served, f"DuckLake {version}, mirrored")
        assert mirror.sync().commits == [], "a second sync found work"

        # What expiry does to the retired files, as the catalog's own DELETE: one removal.
        with catalog_select(lake) as meta:
            retired = [i for (i,) in meta("SELECT data_file_id FROM ducklake_data_file "
                                          "WHERE end_snapshot IS NOT NULL "
                                          "ORDER BY data_file_id")[1]]
        assert len(retired) == 2, f"f2 and d1 retired, the catalog has {retired}"
        catalog_execute(lake, "DELETE FROM ducklake_data_file WHERE end_snapshot IS NOT NULL")
        (removal,) = mirror.sync().commits
        assert removal.snapshot_id is None and removal.delete_files == retired, \
            removal.describe()
        assert_data_files_copied(lake, running, served, f"DuckLake {version}, after a removal")
        assert mirror.sync().commits == [], "a sync after the removal found work"


# (catalog version, the version moraine serves, backend): each pair refused by name.
MISMATCHES = [("1.0", "0.3", "duckdb"), ("1.0", "0.3", "postgres"), ("0.3", "1.0", "duckdb"),
              ("1.1-dev1", "1.0", "duckdb"), ("0.4", "1.1", "postgres")]


@pytest.mark.parametrize("version,served,backend", MISMATCHES,
                         ids=[f"{v}-into-{s}-{b}" for v, s, b in MISMATCHES])
def test_catalog_version_other_than_served_refused(request, server_factory, tmp_path_factory,
                                                   version, served, backend):
    """A catalog of one DuckLake version mirrored into a moraine that serves another's
    ducklake_data_file: the library and the command line (--dry-run too) refuse it before
    staging anything, naming both versions and the flag that would serve the catalog."""
    with secured_lake(request, server_factory, tmp_path_factory,
                      f"ducklake-mismatch-{version}-{served}-{backend}", backend,
                      ducklake_version=served if served != "0.3" else None) as (root, running,
                                                                                lake):
        lake.sql(T_DDL)
        lake.add_files("t", lake.write_parquet(full_layout(1), "m/part=a/m1.parquet"),
                       hive_partitioning=True)
        migrate(lake, version)
        lake.close()
        with moraine(running.uri, running.checks) as conn:
            assert fetch(conn, "SELECT * FROM ducklake_data_file LIMIT 0").schema.names == \
                data_file_names(served), f"the server does not serve DuckLake {served}"
        named = (rf"the catalog is DuckLake {re.escape(version)}\b.*; moraine serves "
                 rf"DuckLake {re.escape(served)}'s ducklake_data_file \(start it with "
                 rf"--ducklake-version {re.escape(SERVED_AS[version])} on a fresh data "
                 r"directory\)")
        mirror = dm.Mirror(dm.open_catalog(lake.catalog_spec), running.uri,
                           connect_kwargs=running.auth)
        with pytest.raises(dm.MirrorError, match=named):
            mirror.sync()
        with pytest.raises(dm.MirrorError, match=named):
            mirror.plan()
        for extra in (["--dry-run"], []):
            done = subprocess.run(
                [sys.executable, str(INTEGRATION / "ducklake_mirror.py"), "--catalog",
                 lake.catalog_spec, "--moraine", running.uri, *extra],
                capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL,
                env={**{k: v for k, v in os.environ.items() if k != "MORAINE_PASSWORD"},
                     "MORAINE_TOKEN": running.token})
            assert done.returncode == 1 and re.search("error: " + named, done.stderr) \
                and not done.stdout, (extra, done)
        assert_moraine_empty(running, f"from a DuckLake {version} catalog refused by a "
                                      f"DuckLake {served} server")


# --------------------------------------------------------------------------------------------
# Tailing: a sync costs what changed; `--watch` keeps up with a busy writer; a killed mirror
# resumes.


def write_commits(lake: Lake, count: int) -> List[int]:
    """`count` DuckLake commits to a new table `w`, each changing `ducklake_data_file`: most
    INSERT one row (one data file of DuckLake's own), every 10th registers a foreign file,
    every 25th deletes the only row of an earlier INSERT (retiring its file). Returns the
    commits' snapshot ids, in order."""
    lake.sql("CREATE TABLE lake.w(id INTEGER, v VARCHAR)")
    snapshots, inserted = [], []
    for i in range(count):
        if i % 10 == 9:
            path = lake.write_parquet(f"SELECT {i}::INTEGER id, 'foreign' v", f"w/f{i}.parquet")
            lake.add_files("w", path)
        elif i % 25 == 24 and inserted:
            lake.sql(f"DELETE FROM lake.w WHERE id = {inserted.pop(0)}")
        else:
            lake.sql(f"INSERT INTO lake.w VALUES ({i}, 'row {i}')")
            inserted.append(i)
        snapshots.append(lake.snapshot()[0])
    return snapshots


class MirrorProcess:
    """The mirror's command line on `lake`'s catalog, authenticated by the server's token,
    its stdout read line by line as it comes."""

    def __init__(self, lake: Lake, running: Secured, *extra: str):
        env = {k: v for k, v in os.environ.items() if k != "MORAINE_PASSWORD"}
        env["MORAINE_TOKEN"] = running.token
        self.proc = subprocess.Popen(
            [sys.executable, str(INTEGRATION / "ducklake_mirror.py"), "--catalog",
             lake.catalog_spec, "--moraine", running.uri, *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            stdin=subprocess.DEVNULL)
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self.seen: List[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, prefix: str, timeout: float) -> None:
        """Until a line starting with `prefix` is printed; fails if the process ends or
        `timeout` passes first."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no `{prefix}` line in {timeout} s; printed so far: {self.seen}",
                            pytrace=False)
            if line is None:
                pytest.fail(f"the mirror exited ({self.proc.wait()}) before `{prefix}`: "
                            f"{self.seen}\n{self.proc.stderr.read()}", pytrace=False)
            self.seen.append(line)
            if line.startswith(prefix):
                return

    def finish(self) -> Tuple[int, str]:
        """Its exit code and stderr, once it ends; every stdout line is in `seen`."""
        code = self.proc.wait(timeout=60)
        self._reader.join(timeout=60)
        while True:
            line = self.lines.get_nowait() if not self.lines.empty() else None
            if line is None:
                break
            self.seen.append(line)
        return code, self.proc.stderr.read()

    def staged(self) -> List[int]:
        """The snapshots of its `staged snapshot N: ...` lines, in the order printed."""
        return [int(line.split()[2].rstrip(":")) for line in self.seen
                if line.startswith("staged snapshot ")]


@pytest.mark.parametrize("backend", BACKENDS)
def test_sync_reads_only_what_changed(request, server_factory, tmp_path_factory, backend):
    """A sync after one more DuckLake commit reads a few aggregate rows of moraine, not the
    ids of everything it holds (the server's own count of rows it streamed says so)."""
    with secured_lake(request, server_factory, tmp_path_factory,
                      f"ducklake-incremental-{backend}", backend,
                      METRICS_ARGS) as (root, running, lake):
        held = 200
        lake.sql("CREATE TABLE lake.w(id INTEGER, v VARCHAR)")
        for i in range(held):
            lake.write_parquet(f"SELECT {i}::INTEGER id, 'v' v", f"w/f{i:03}.parquet")
        lake.add_files("w", root / "w" / "*.parquet")
        mirror = dm.Mirror(lake.mirror_catalog(), running.uri, connect_kwargs=running.checks)
        (first,) = mirror.sync().commits
        assert len(first.files) == held, first.describe()
        url = metrics_url(running.running)
        before = scrape(url).scalar(ROWS)
        lake.sql("INSERT INTO lake.w VALUES (1000, 'new')")
        assert [c.snapshot_id for c in mirror.sync().commits] == [lake.snapshot()[0]]
        streamed = scrape(url).scalar(ROWS) - before
        assert streamed < 10, (
            f"the sync after one commit streamed {streamed} rows from moraine, which holds "
            f"{held} data files: it read what moraine holds, not what changed")
        assert_mirrored(lake, running, "after the incremental sync")


def test_watch_follows_a_busy_writer(request, server_factory, tmp_path_factory):
    """`--watch` on a PostgreSQL catalog while DuckLake commits 200 snapshots: each is
    staged once, in order, and moraine ends equal to the catalog."""
    with secured_lake(request, server_factory, tmp_path_factory,
                      "ducklake-watch", "postgres") as (root, running, lake):
        watcher = MirrorProcess(lake, running, "--watch", "0.05")
        snapshots = write_commits(lake, 200)
        watcher.wait_for(f"staged snapshot {snapshots[-1]}:", timeout=90)
        watcher.proc.send_signal(signal.SIGINT)
        code, err = watcher.finish()
        assert code == 0 and "error" not in err, (code, err)
        staged = watcher.staged()
        assert staged == snapshots, (
            f"staged {len(staged)} snapshots for {len(snapshots)} commits; missing "
            f"{sorted(set(snapshots) - set(staged))}, twice "
            f"{sorted(s for s, n in collections.Counter(staged).items() if n > 1)}, "
            f"in order: {staged == sorted(staged)}")
        assert_mirrored(lake, running, "after watching the writer")


def test_killed_mirror_resumes(request, server_factory, tmp_path_factory):
    """A mirror killed (SIGKILL) while it stages 60 DuckLake commits, run again: it stages
    exactly the commits moraine did not get, and moraine ends equal to the catalog."""
    with secured_lake(request, server_factory, tmp_path_factory,
                      "ducklake-killed", "postgres") as (root, running, lake):
        snapshots = write_commits(lake, 60)
        first = MirrorProcess(lake, running)
        first.wait_for("staged snapshot ", timeout=60)
        first.proc.kill()
        first.finish()
        with moraine(running.uri, running.checks) as conn:
            held = dm.Held.read(conn)
        assert snapshots[0] <= held.snapshot_cursor < snapshots[-1], (
            f"moraine holds up to snapshot {held.snapshot_cursor} of "
            f"{snapshots[0]}..{snapshots[-1]}: the mirror was not killed mid-run")
        again = MirrorProcess(lake, running)
        code, err = again.finish()
        assert code == 0, (code, err)
        assert again.staged() == [s for s in snapshots if s > held.snapshot_cursor], again.seen
        assert_mirrored(lake, running, "after the resumed run")


def test_racing_mirrors_stage_each_commit_once(request, server_factory, tmp_path_factory):
    """Two mirrors of one PostgreSQL catalog syncing at the same time into one server: a
    commit the other mirror staged first is refused or conflicts, is re-planned on a new
    connection and drops out, so every DuckLake commit is staged by exactly one of them."""
    with secured_lake(request, server_factory, tmp_path_factory,
                      "ducklake-race", "postgres") as (root, running, lake):
        snapshots = write_commits(lake, 60)
        staged: Dict[str, List[int]] = {"a": [], "b": []}
        errors: List[BaseException] = []
        start = threading.Barrier(2)

        def run(name: str) -> None:
            mirror = dm.Mirror(lake.mirror_catalog(), running.uri, max_attempts=200,
                               connect_kwargs=running.checks)
            try:
                start.wait(timeout=30)
                mirror.sync(on_staged=lambda c: staged[name].append(c.snapshot_id))
            except BaseException as err:  # noqa: BLE001 - reported below
                errors.append(err)

        threads = [threading.Thread(target=run, args=(n,), daemon=True) for n in staged]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=90)
        assert not any(t.is_alive() for t in threads), "a mirror did not finish"
        assert not errors, errors
        both = staged["a"] + staged["b"]
        assert sorted(both) == snapshots, (
            f"staged twice: {sorted(set(staged['a']) & set(staged['b']))}; missing: "
            f"{sorted(set(snapshots) - set(both))}")
        assert all(s == sorted(s) for s in staged.values()), staged
        assert_mirrored(lake, running, "after two racing mirrors")
