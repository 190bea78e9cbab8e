"""moraine through the ADBC Flight SQL driver's DB-API, with its default settings.

`adbc_driver_flightsql.dbapi.connect(uri)` prepares every statement (CreatePreparedStatement,
GetFlightInfo, DoGet), so every query here also exercises the prepared-statement path. The
expected rows come from replaying the DuckLake fixture in Python (conftest.expected_rows()).
"""

from __future__ import annotations

import collections
import warnings
from pathlib import Path

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
import pytest
from adbc_driver_manager import AdbcStatusCode

from conftest import (
    CATALOG,
    COLUMNS,
    COLUMN_MAPPING,
    DATA_FILE,
    NAME_MAPPING,
    SCHEMA,
    TABLES,
    column_names,
    describe_schema,
    expected_schema,
    mapping_order_key,
    snapshots_in_fixture,
    sorted_rows,
)

# DuckLake 1.4's mapping load, verbatim (first load of a process).
MAPPING_LOAD = """SELECT mapping_id, table_id, type, column_id, source_name, target_field_id, parent_column, is_partition
FROM ducklake_column_mapping
JOIN ducklake_name_mapping USING (mapping_id)
ORDER BY mapping_id, parent_column NULLS FIRST"""

# Every later load: the same with DuckLake's cursor.
MAPPING_LOAD_FROM = """SELECT mapping_id, table_id, type, column_id, source_name, target_field_id, parent_column, is_partition
FROM ducklake_column_mapping
JOIN ducklake_name_mapping USING (mapping_id)
WHERE mapping_id >= {cursor}
ORDER BY mapping_id, parent_column NULLS FIRST"""

JOIN_COLUMNS = [
    "mapping_id", "table_id", "type", "column_id", "source_name", "target_field_id",
    "parent_column", "is_partition",
]


def connect(uri: str):
    with warnings.catch_warnings():
        # The read tests do not care whether the server advertises transactions (the DB-API
        # warns when it cannot disable autocommit); test_writes_adbc.py checks that it does.
        warnings.simplefilter("ignore")
        return flightsql.connect(uri)


@pytest.fixture(scope="module")
def conn(moraine_uri):
    c = connect(moraine_uri)
    yield c
    c.close()


def query(conn, sql, params=None) -> pa.Table:
    with conn.cursor() as cur:
        if params is None:
            cur.execute(sql)
        else:
            cur.execute(sql, params)
        return cur.fetch_arrow_table()


def rows(table: pa.Table):
    return [tuple(r.values()) for r in table.to_pylist()]


def assert_same_rows(got, want, what):
    got, want = sorted_rows(got), sorted_rows(want)
    if got != want:
        g, w = collections.Counter(got), collections.Counter(want)
        missing = list((w - g).elements())
        extra = list((g - w).elements())
        pytest.fail(
            f"{what}: {len(got)} rows, expected {len(want)}\n"
            f"  missing ({len(missing)}): {missing[:20]}\n"
            f"  unexpected ({len(extra)}): {extra[:20]}",
            pytrace=False,
        )


def assert_columns(table: pa.Table, names, types=None, what="result"):
    assert table.schema.names == list(names), f"{what}: column names"
    if types is not None:
        got = [str(f.type) for f in table.schema]
        assert got == [str(t) for t in types], f"{what}: column types {list(zip(names, got))}"


def check_mapping_load(conn, sql, want, what):
    table = query(conn, sql)
    types = dict(COLUMNS[COLUMN_MAPPING] + COLUMNS[NAME_MAPPING])
    assert_columns(table, JOIN_COLUMNS, [types[c] for c in JOIN_COLUMNS], what)
    got = rows(table)
    assert_same_rows(got, want, what)
    # The ordering contract: mapping_id, then parent_column NULLS FIRST. Siblings' order is
    # unspecified, so only the (mapping_id, parent_column) key has to be non-decreasing.
    keys = [mapping_order_key(r) for r in got]
    for i in range(1, len(keys)):
        if keys[i] < keys[i - 1]:
            pytest.fail(
                f"{what}: not ordered by mapping_id, parent_column NULLS FIRST at row {i}: "
                f"{got[i - 1]} before {got[i]}",
                pytrace=False,
            )
    # What DuckLake relies on: within each mapping, every parent arrives before its children.
    seen = set()
    for r in got:
        mapping_id, column_id, parent = r[0], r[3], r[6]
        if parent is not None:
            assert (mapping_id, parent) in seen, f"{what}: {r} arrives before its parent"
        seen.add((mapping_id, column_id))


# --------------------------------------------------------------------------------------------
# The expectation itself (no server): the Python replay reproduces DuckLake's final state.


def test_fixture_replay_matches_ducklake(expected):
    assert [r[0] for r in expected[COLUMN_MAPPING]] == [0, 3, 5, 7, 10, 13, 16]
    assert {r[2] for r in expected[COLUMN_MAPPING]} == {"map_by_name"}
    per_map = collections.Counter(r[0] for r in expected[NAME_MAPPING])
    assert per_map == {0: 17, 3: 17, 5: 10, 7: 2, 10: 4, 13: 3, 16: 5}
    ids = [r[0] for r in expected[DATA_FILE]]
    assert ids == [1, 2, 4, 6, 8, 9, 11, 12, 14, 15, 17, 18, 19, 21]
    # S18 ended file 2 at snapshot 15 (end transition) and wrote file 21 from 15 on.
    f2 = dict(zip(column_names(DATA_FILE), expected[DATA_FILE][1]))
    assert (f2["begin_snapshot"], f2["end_snapshot"]) == (3, 15)
    assert [r[0] for r in expected.data_files_at(1, 14)] == [1, 2, 4, 6, 8, 9, 11, 12, 17, 18, 19]
    assert [r[0] for r in expected.data_files_at(1, 15)] == [1, 4, 6, 8, 9, 11, 12, 17, 18, 19, 21]


# --------------------------------------------------------------------------------------------
# DuckLake's own queries.


def test_mapping_load_cold(server_factory, expected):
    """The very first request of a fresh server process is DuckLake's mapping load."""
    fresh = server_factory("cold")
    c = connect(fresh.uri)
    try:
        check_mapping_load(c, MAPPING_LOAD, expected.mapping_join(), "cold mapping load")
    finally:
        c.close()


def test_mapping_load(conn, expected):
    check_mapping_load(conn, MAPPING_LOAD, expected.mapping_join(), "mapping load")


@pytest.mark.parametrize("cursor", [0, 3, 10, 11, 16, 17, 1000])
def test_mapping_load_with_cursor(conn, expected, cursor):
    want = expected.mapping_join(min_mapping_id=cursor)
    check_mapping_load(conn, MAPPING_LOAD_FROM.format(cursor=cursor), want,
                       f"mapping load from cursor {cursor}")


DATA_FILE_AT = (
    "SELECT " + ", ".join(column_names(DATA_FILE)) + " FROM ducklake_data_file "
    "WHERE table_id = {table_id} AND {snapshot} >= begin_snapshot "
    "AND ({snapshot} < end_snapshot OR end_snapshot IS NULL)"
)

# Table 1 at 14 still has file 2 (ended at 15) and not file 21 (begins at 15); at 15 the
# reverse; 2 is the first file only; table 2 at 9 (created, no files yet) is empty, at 10 it
# has both files with a partition_id. 1 is before anything.
SNAPSHOT_CASES = [(1, 14), (1, 15), (1, 2), (1, 12), (2, 9), (2, 10), (2, 15), (1, 1), (3, 15)]


@pytest.mark.parametrize("table_id,snapshot", SNAPSHOT_CASES)
def test_data_files_at_snapshot(conn, expected, table_id, snapshot):
    table = query(conn, DATA_FILE_AT.format(table_id=table_id, snapshot=snapshot))
    assert_columns(table, column_names(DATA_FILE), [t for _, t in COLUMNS[DATA_FILE]],
                   "data files at snapshot")
    assert_same_rows(rows(table), expected.data_files_at(table_id, snapshot),
                     f"data files of table {table_id} at snapshot {snapshot}")


def test_data_file_snapshot_cases_cover_every_snapshot(conn, expected):
    """Each snapshot DuckLake committed, for both tables, in one pass (cheap, catches
    off-by-one in the end_snapshot comparison)."""
    for snapshot in snapshots_in_fixture():
        for table_id in (1, 2):
            table = query(conn, DATA_FILE_AT.format(table_id=table_id, snapshot=snapshot))
            assert_same_rows(rows(table), expected.data_files_at(table_id, snapshot),
                             f"data files of table {table_id} at snapshot {snapshot}")


# --------------------------------------------------------------------------------------------
# Parameters.


@pytest.mark.parametrize("table_id", [1, 2, 99])
def test_bound_parameter(conn, expected, table_id):
    table = query(conn, "SELECT mapping_id FROM ducklake_column_mapping WHERE table_id = ?",
                  (table_id,))
    assert table.schema.names == ["mapping_id"]
    want = [(r[0],) for r in expected[COLUMN_MAPPING] if r[1] == table_id]
    assert_same_rows(rows(table), want, f"mapping ids of table {table_id}")


def test_prepared_statement_reused_with_new_parameters(conn, expected):
    """The DB-API reuses the prepared handle when the SQL repeats; each execution must see its
    own parameters."""
    sql = "SELECT data_file_id FROM ducklake_data_file WHERE table_id = ? AND mapping_id = ?"
    with conn.cursor() as cur:
        for table_id, mapping_id in [(1, 0), (2, 13), (1, 7), (1, 99)]:
            cur.execute(sql, (table_id, mapping_id))
            got = rows(cur.fetch_arrow_table())
            want = [(r[0],) for r in expected[DATA_FILE] if r[1] == table_id and r[15] == mapping_id]
            assert_same_rows(got, want, f"files of table {table_id} with mapping {mapping_id}")


def test_two_parameters_and_null_result(conn, expected):
    table = query(
        conn,
        "SELECT data_file_id, mapping_id FROM ducklake_data_file "
        "WHERE begin_snapshot >= ? AND mapping_id IS NULL",
        (13,),
    )
    want = [(r[0], r[15]) for r in expected[DATA_FILE] if r[2] >= 13 and r[15] is None]
    assert want, "the fixture has DuckLake-written files (mapping_id NULL)"
    assert_same_rows(rows(table), want, "files without a mapping")


# --------------------------------------------------------------------------------------------
# Whole tables.


@pytest.mark.parametrize("table", TABLES)
def test_select_star(conn, expected, table):
    got = query(conn, f"SELECT * FROM {table}")
    assert_columns(got, column_names(table), [t for _, t in COLUMNS[table]], table)
    assert_same_rows(rows(got), expected[table], f"SELECT * FROM {table}")


@pytest.mark.parametrize("name", [f"{SCHEMA}.{NAME_MAPPING}", f"{CATALOG}.{SCHEMA}.{NAME_MAPPING}"])
def test_qualified_names(conn, expected, name):
    got = query(conn, f"SELECT * FROM {name}")
    assert_same_rows(rows(got), expected[NAME_MAPPING], f"SELECT * FROM {name}")


def test_count_per_table(conn, expected):
    for table in TABLES:
        got = query(conn, f"SELECT count(*) AS n FROM {table}")
        assert rows(got) == [(len(expected[table]),)], table


# --------------------------------------------------------------------------------------------
# Metadata.


def test_get_objects(conn):
    objects = conn.adbc_get_objects().read_all().to_pylist()
    catalogs = {c["catalog_name"]: c for c in objects}
    assert CATALOG in catalogs, f"catalogs: {sorted(map(str, catalogs))}"
    schemas = {s["db_schema_name"]: s for s in catalogs[CATALOG]["catalog_db_schemas"] or []}
    assert SCHEMA in schemas, f"schemas of {CATALOG}: {sorted(map(str, schemas))}"
    tables = {t["table_name"]: t for t in schemas[SCHEMA]["db_schema_tables"] or []}
    assert sorted(tables) == sorted(TABLES)
    for name, t in tables.items():
        cols = sorted(t["table_columns"] or [], key=lambda c: c["ordinal_position"])
        assert [c["column_name"] for c in cols] == column_names(name), name
        assert [c["ordinal_position"] for c in cols] == list(range(1, len(cols) + 1)), name


def test_get_table_types(conn):
    types = conn.adbc_get_table_types()
    assert types, "no table types"
    objects = conn.adbc_get_objects(depth="tables").read_all().to_pylist()
    used = {
        t["table_type"]
        for c in objects
        for s in c["catalog_db_schemas"] or []
        for t in s["db_schema_tables"] or []
    }
    assert used <= set(types), f"tables use types {used}, GetTableTypes says {types}"


@pytest.mark.parametrize("table", TABLES)
def test_get_table_schema(conn, table):
    got = conn.adbc_get_table_schema(table)
    assert describe_schema(got) == describe_schema(expected_schema(table))


def test_get_table_schema_qualified(conn):
    got = conn.adbc_get_table_schema(DATA_FILE, catalog_filter=CATALOG, db_schema_filter=SCHEMA)
    assert describe_schema(got) == describe_schema(expected_schema(DATA_FILE))


def test_get_table_schema_unknown_table(conn):
    with pytest.raises(flightsql.Error):
        conn.adbc_get_table_schema("no_such_table")


def test_get_info(conn):
    info = conn.adbc_get_info()
    # vendor_* come from the server's SqlInfo (GetSqlInfo); driver_* from the driver itself.
    assert info.get("vendor_name"), f"GetSqlInfo gave no server name: {info}"
    assert info.get("driver_name")


# --------------------------------------------------------------------------------------------
# Errors.


@pytest.mark.parametrize(
    "sql",
    [
        "SELEC 1",
        "SELECT * FROM no_such_table",
        "SELECT no_such_column FROM ducklake_data_file",
        "SELECT mapping_id FROM ducklake_column_mapping WHERE",
    ],
)
def test_bad_sql_is_a_programming_error(conn, sql):
    with conn.cursor() as cur:
        with pytest.raises(flightsql.ProgrammingError) as e:
            cur.execute(sql)
            cur.fetch_arrow_table()
    assert str(e.value).strip()
    # The connection still works afterwards.
    assert rows(query(conn, "SELECT count(*) FROM ducklake_column_mapping"))[0][0] > 0


@pytest.fixture(scope="module")
def scratch(server_factory):
    """A separate server for statements that must be refused: if one were wrongly executed,
    the shared server's data stays intact for the other tests."""
    running = server_factory("scratch")
    c = connect(running.uri)
    yield c
    c.close()


def refused_statements(tmp: Path):
    """(sql, file it must not write, the exceptions it may raise, the ADBC status it must
    carry or None). Writes DuckLake issues (INSERT, DELETE, the end_snapshot UPDATE) are real
    writes now (test_writes_adbc.py); what stays refused is DDL, COPY, and UPDATEs DuckLake
    never issues, which are constraint violations (INVALID_ARGUMENT)."""
    out = tmp / "copy-out.parquet"
    csv = tmp / "copy-out.csv"
    either = (flightsql.ProgrammingError, flightsql.NotSupportedError)
    invalid = (flightsql.ProgrammingError,)
    bad = AdbcStatusCode.INVALID_ARGUMENT
    return [
        ("DROP TABLE ducklake_data_file", None, either, None),
        ("DROP TABLE main.ducklake_column_mapping", None, either, None),
        (f"COPY ducklake_data_file TO '{out}'", out, either, None),
        (f"COPY (SELECT * FROM ducklake_name_mapping) TO '{out}'", out, either, None),
        (f"COPY ducklake_column_mapping TO '{csv}'", csv, either, None),
        (f"COPY ducklake_column_mapping TO '{csv}' STORED AS CSV", csv, either, None),
        ("CREATE TABLE x (a BIGINT)", None, either, None),
        ("CREATE TABLE x AS SELECT * FROM ducklake_data_file", None, either, None),
        ("UPDATE ducklake_column_mapping SET type = 'map_by_id' WHERE mapping_id = 0",
         None, invalid, bad),
        ("UPDATE ducklake_column_mapping SET table_id = 2", None, invalid, bad),
        ("UPDATE ducklake_name_mapping SET source_name = 'x' WHERE mapping_id = 0",
         None, invalid, bad),
        ("UPDATE ducklake_data_file SET path = '/elsewhere.parquet' WHERE data_file_id = 1",
         None, invalid, bad),
        ("UPDATE ducklake_data_file SET path = '/elsewhere.parquet', end_snapshot = 99 "
         "WHERE end_snapshot IS NULL AND data_file_id IN (1)", None, invalid, bad),
    ]


def test_deep_expressions_are_refused_and_the_server_goes_on(scratch, expected):
    """Left-deep chains of a few thousand terms once overflowed a worker's stack inside the
    query engine and aborted the whole process. They are refused, naming the limit, with
    nothing staged; the server and the connection go on."""
    deep = [
        "SELECT " + "+".join(["1"] * 2000),
        "SELECT " + "+".join(["(1)"] * 20000),
        "DELETE FROM ducklake_data_file WHERE "
        + " OR ".join(f"data_file_id = {i}" for i in range(3000)),
    ]
    for sql in deep:
        with scratch.cursor() as cur:
            with pytest.raises(flightsql.ProgrammingError) as e:
                cur.execute(sql)
                cur.fetch_arrow_table()
        assert e.value.status_code == AdbcStatusCode.INVALID_ARGUMENT, repr(e.value)
        assert "256 tokens" in str(e.value), str(e.value)
    # Just within the limit (SELECT, 127 terms, 126 operators, AS, n: 256 tokens), the same
    # shape runs, on the debug build's larger stack frames too.
    got = query(scratch, "SELECT " + "+".join(["1"] * 127) + " AS n")
    assert got.column("n").to_pylist() == [127]
    for table in TABLES:
        got = query(scratch, f"SELECT * FROM {table}")
        assert_same_rows(rows(got), expected[table], f"{table} after the refused statements")


def test_ddl_copy_and_foreign_updates_are_refused(scratch, expected, tmp_path):
    for sql, out, errors, status in refused_statements(tmp_path):
        with scratch.cursor() as cur:
            with pytest.raises(errors) as e:
                cur.execute(sql)
                cur.fetch_arrow_table()
            assert str(e.value).strip(), f"{sql}: empty error message"
            if status is not None:
                assert e.value.status_code == status, f"{sql}: {e.value!r}"
        if out is not None:
            assert not out.exists(), f"{sql}: wrote {out}"
        # Everything is still there, unchanged (in this connection's own view too, which
        # would show anything the statement had staged).
        for table in TABLES:
            got = query(scratch, f"SELECT * FROM {table}")
            assert_same_rows(rows(got), expected[table], f"{table} after `{sql}`")
    scratch.commit()
    for table in TABLES:
        got = query(scratch, f"SELECT * FROM {table}")
        assert_same_rows(rows(got), expected[table], f"{table} after the commit")
    objects = scratch.adbc_get_objects(depth="tables").read_all().to_pylist()
    names = {
        t["table_name"]
        for c in objects if c["catalog_name"] == CATALOG
        for s in c["catalog_db_schemas"] or [] if s["db_schema_name"] == SCHEMA
        for t in s["db_schema_tables"] or []
    }
    assert names == set(TABLES)
