"""moraine's write path through the ADBC Flight SQL driver's DB-API, with its default settings.

The server advertises transactions (SqlInfo 8), so `connect()` turns autocommit off and the
driver keeps one server transaction open per connection: BeginTransaction at connect and again
after every `commit()`/`rollback()`. `cursor.adbc_ingest(...)` carries no transaction id; the
server binds it to the connection's open transaction through the session token it hands out in
the headers of the connection's first response, which the driver replays on every call. Statements (`cursor.execute`) are prepared and carry the transaction id; DML runs at
GetFlightInfo and answers the affected-row count.

No test hard-codes a result: each reads the committed store first (DoGet, or a new DB-API
connection) and computes what it must hold afterwards from that and the rows it wrote
(conftest's CatalogState helpers); what a connection sees inside its own transaction is read
through that connection. Ids come from conftest.Ids, far from the fixture's, so tests that share
a server never touch each other's rows.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
import pytest
from adbc_driver_manager import AdbcStatusCode

from conftest import (
    COLUMN_MAPPING,
    COLUMNS,
    DATA_FILE,
    DATA_FILE_VERSIONS,
    NAME_MAPPING,
    TABLES,
    CatalogState,
    Ids,
    Mapping,
    arrow_rows,
    FIXTURE,
    Server,
    _child_env,
    autocommit_cursor,
    column_names,
    data_file,
    data_file_in,
    data_file_names,
    diff_states,
    flat_mapping,
    mapping_like,
    load_fixture,
    mentions_id,
    moraine_bin,
    run_import,
    snapshots_in_fixture,
    sorted_rows,
    state_from_tables,
)
from test_adbc import (
    DATA_FILE_AT,
    MAPPING_LOAD,
    MAPPING_LOAD_FROM,
    assert_same_rows,
    check_mapping_load,
    query,
    rows,
)
from test_writes_pyarrow import read_committed

# DuckLake's statements, verbatim in shape (contract: "Writes" and the newer expiry cleanup).
END_BY_TABLE = ("UPDATE ducklake_data_file SET end_snapshot = {snapshot} "
                "WHERE end_snapshot IS NULL AND table_id IN ({ids})")
END_BY_FILE = ("UPDATE ducklake_data_file SET end_snapshot = {snapshot} "
               "WHERE end_snapshot IS NULL AND data_file_id IN ({ids})")
DELETE_FILES = "DELETE FROM ducklake_data_file WHERE data_file_id IN ({ids})"
DELETE_MAPPINGS = "DELETE FROM ducklake_column_mapping WHERE table_id IN ({ids})"
ORPHAN_SWEEP = ("DELETE FROM ducklake_name_mapping tbl WHERE NOT EXISTS "
                "(SELECT 1 FROM ducklake_column_mapping m WHERE m.mapping_id = tbl.mapping_id)")

ISSUE = AdbcStatusCode  # short alias for the expected status codes

# Every id the tests write is at least this (conftest.Ids); the fixture's are far below.
FIRST_TEST_ID = 1_000_000

# The idle-timeout test's server is started with IDLE_TIMEOUT_S, and waits at most
# REAP_WAIT_S for the server's reaper to say it rolled back an idle transaction (REAPED).
# That a busy transaction outlives the timeout is checked exactly, on a manual clock, by the
# Rust suite (flight_writes::an_idle_transaction_expires_and_late_calls_say_so).
IDLE_TIMEOUT_S = 1
REAP_WAIT_S = 60
REAPED = "rolled back idle transactions"


# --------------------------------------------------------------------------------------------
# Connections and reads.


def connect(uri: str):
    """A DB-API connection with autocommit off. If the server did not advertise transactions,
    the DB-API would warn and leave autocommit on, and `commit()`/`rollback()` would silently
    do nothing: that fails the test here rather than later in a confusing way."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        conn = flightsql.connect(uri)
    refused = [str(w.message) for w in caught if "autocommit" in str(w.message).lower()]
    if refused or not getattr(conn, "_commit_supported", True):
        conn.close()
        pytest.fail(
            "the server advertises no transactions (SqlInfo 8): the DB-API cannot disable "
            f"autocommit ({refused}), so commit() and rollback() would do nothing",
            pytrace=False,
        )
    return conn


@contextlib.contextmanager
def connection(uri: str):
    conn = connect(uri)
    try:
        yield conn
    finally:
        conn.close()


def state_of(conn) -> CatalogState:
    """The three tables as this connection sees them (its transaction's view)."""
    return state_from_tables({t: query(conn, f"SELECT * FROM {t}") for t in TABLES})


def read_state_adbc(uri: str) -> CatalogState:
    """The three tables as committed, read through a new DB-API connection."""
    with connection(uri) as conn:
        return state_of(conn)


def read_state(uri: str) -> CatalogState:
    """The three tables as committed (DoGet, faster than a new DB-API connection)."""
    return read_committed(uri)


def assert_state(got: CatalogState, want: CatalogState, what: str) -> None:
    diff = diff_states(got, want)
    if diff:
        pytest.fail(f"{what}:\n{diff}", pytrace=False)


def assert_stored(uri: str, want: CatalogState, what: str) -> None:
    assert_state(read_state(uri), want, f"{what} (as committed)")


# --------------------------------------------------------------------------------------------
# Writes.


def ingest(conn, table: str, data: Union[pa.Table, Sequence[tuple]]) -> int:
    if not isinstance(data, pa.Table):
        data = arrow_rows(table, data)
    with conn.cursor() as cur:
        return cur.adbc_ingest(table, data, mode="append")


def ingest_ok(conn, table: str, data: Union[pa.Table, Sequence[tuple]]) -> None:
    n = len(data) if not isinstance(data, pa.Table) else data.num_rows
    got = ingest(conn, table, data)
    assert got == n, f"ingest of {n} rows into {table} answered {got} rows staged"


def stage_mapping(conn, m: Mapping) -> None:
    """DuckLake's order: the column-mapping row, then its name rows."""
    ingest_ok(conn, COLUMN_MAPPING, [m.column_row])
    ingest_ok(conn, NAME_MAPPING, m.name_rows)


def dml(conn, sql: str, params=None) -> int:
    """Runs one DML statement; checks that `rowcount` and the one-row Int64 `count` result
    agree, and returns the count."""
    with conn.cursor() as cur:
        if params is None:
            cur.execute(sql)
        else:
            cur.execute(sql, params)
        n = cur.rowcount
        result = cur.fetch_arrow_table()
    assert [(f.name, str(f.type)) for f in result.schema] == [("count", "int64")], \
        f"`{sql}`: result schema {result.schema}"
    assert result.column(0).to_pylist() == [n], \
        f"`{sql}`: rowcount {n}, but the result holds {result.column(0).to_pylist()}"
    return n


def sql_literal(v) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, int):
        return str(v)
    return "'" + str(v).replace("'", "''") + "'"


def insert_sql(table: str, rows: Sequence[tuple], columns: Optional[List[str]] = None) -> str:
    """DuckLake's INSERT: positional multi-row VALUES (or with a column list, values in its
    order, taken from declared-order rows)."""
    names = column_names(table)
    pick = [names.index(c) for c in columns] if columns else list(range(len(names)))
    values = ", ".join("(" + ", ".join(sql_literal(r[i]) for i in pick) + ")" for r in rows)
    target = f"{table} ({', '.join(columns)})" if columns else table
    return f"INSERT INTO {target} VALUES {values}"


def in_list(ids) -> str:
    return ", ".join(str(i) for i in ids)


def check_error(err: BaseException, cls, *, statuses: Sequence[AdbcStatusCode] = (),
                ids: Sequence[int] = (), words: Sequence[str] = (), what: str = "") -> None:
    """The error is a `cls` with one of `statuses`, naming every id and word."""
    msg = str(err)
    assert isinstance(err, cls), \
        f"{what}: expected {cls.__name__}, got {type(err).__name__}: {msg}"
    if statuses:
        got = getattr(err, "status_code", None)
        assert got in statuses, \
            f"{what}: status {got!r}, expected one of {[s.name for s in statuses]}: {msg}"
    for i in ids:
        assert mentions_id(msg, i), f"{what}: the message does not name {i}: {msg}"
    for w in words:
        assert w.lower() in msg.lower(), f"{what}: the message does not say {w!r}: {msg}"


# --------------------------------------------------------------------------------------------
# Servers.


@pytest.fixture(scope="module")
def lake(server_factory):
    """The module's server, on the imported fixture; tests write under ids of their own."""
    return server_factory("writes")


@pytest.fixture(scope="module")
def ids() -> Ids:
    return Ids()


@pytest.fixture
def uri(lake) -> str:
    return lake.uri


def fixture_mapping_keys(state: CatalogState) -> List[Tuple[int, int]]:
    """(table_id, mapping_id) of the mappings DuckLake wrote (not the tests')."""
    keys = [k for k in state.mapping_keys() if k[1] < FIRST_TEST_ID]
    assert keys, "the fixture has mappings"
    return keys


# --------------------------------------------------------------------------------------------
# Transactions and ingest.


def test_commit_and_rollback_of_empty_transactions(uri):
    """connect() disables autocommit (the server advertises transactions); empty transactions
    commit and roll back, again and again, and change nothing."""
    before = read_state(uri)
    with connection(uri) as conn:
        for _ in range(3):
            conn.commit()
            conn.rollback()
        assert_state(state_of(conn), before, "own view after empty transactions")
    assert_stored(uri, before, "after empty transactions")


def test_ingest_is_visible_to_others_only_after_commit(uri, ids):
    before = read_state(uri)
    t = ids.table()
    m = mapping_like(before, 0, ids.file(), t)  # DuckLake's nested tree with a partition column
    files = [data_file(ids.file(), t, m.mapping_id), data_file(ids.file(), t, m.mapping_id)]
    want = m.added_to(before).with_rows(DATA_FILE, files)
    with connection(uri) as writer, connection(uri) as other:
        assert ingest(writer, COLUMN_MAPPING, [m.column_row]) == 1
        assert ingest(writer, NAME_MAPPING, m.name_rows) == len(m.name_rows)
        assert ingest(writer, DATA_FILE, files) == len(files)
        assert_state(state_of(writer), want, "the writer reads its own staged rows")
        assert_state(state_of(other), before, "another connection before the commit")
        assert_stored(uri, before, "before the commit")
        writer.commit()
        other.rollback()  # ends the other connection's read transaction, whatever it pinned
        assert_state(state_of(other), want, "another connection after the commit")
        assert_state(state_of(writer), want, "the writer's next transaction")
    assert_stored(uri, want, "after the commit")
    assert_state(read_state_adbc(uri), want, "a new connection after the commit")


def test_rollback_discards_staged_rows(uri, ids):
    before = read_state(uri)
    t = ids.table()
    m = flat_mapping(ids.file(), t, 4)
    f = data_file(ids.file(), t, m.mapping_id)
    want = m.added_to(before).with_rows(DATA_FILE, [f])
    with connection(uri) as conn:
        stage_mapping(conn, m)
        ingest_ok(conn, DATA_FILE, [f])
        assert_state(state_of(conn), want, "staged, before the rollback")
        conn.rollback()
        assert_state(state_of(conn), before, "own view after the rollback")
        assert_stored(uri, before, "after the rollback")
        # The same keys are free again: the next transaction writes them and commits.
        stage_mapping(conn, m)
        ingest_ok(conn, DATA_FILE, [f])
        conn.commit()
    assert_stored(uri, want, "the same rows committed after a rollback")


def test_close_without_commit_discards_staged_rows(uri, ids):
    """close() sends no EndTransaction: the abandoned transaction must store nothing and hold
    no key."""
    before = read_state(uri)
    m = flat_mapping(ids.file(), ids.table(), 2)
    conn = connect(uri)
    try:
        stage_mapping(conn, m)
    finally:
        conn.close()
    assert_stored(uri, before, "after closing with staged rows")
    with connection(uri) as conn:
        stage_mapping(conn, m)
        conn.commit()
    assert_stored(uri, m.added_to(before), "the same mapping committed by another connection")


def test_many_transactions_on_one_connection(uri, ids):
    state = read_state(uri)
    t = ids.table()
    with connection(uri) as conn:
        for i in range(4):
            m = flat_mapping(ids.file(), t, i + 1)
            f = data_file(ids.file(), t, m.mapping_id)
            stage_mapping(conn, m)
            ingest_ok(conn, DATA_FILE, [f])
            conn.commit()
            state = m.added_to(state).with_rows(DATA_FILE, [f])
            assert_stored(uri, state, f"after commit {i + 1}")


def test_ingest_joins_its_own_connections_transaction(uri, ids):
    """Two connections with open transactions: each untagged ingest lands in the transaction
    of the connection that sent it (bound through the session token), not in the other."""
    before = read_state(uri)
    t = ids.table()
    ma, mb = flat_mapping(ids.file(), t, 2), flat_mapping(ids.file(), t, 3)
    with connection(uri) as a, connection(uri) as b:
        stage_mapping(a, ma)
        stage_mapping(b, mb)
        assert_state(state_of(a), ma.added_to(before), "connection A's view")
        assert_state(state_of(b), mb.added_to(before), "connection B's view")
        a.commit()
        b.rollback()
    assert_stored(uri, ma.added_to(before), "A committed, B rolled back")


def test_ingest_of_several_batches(uri, ids):
    before = read_state(uri)
    t = ids.table()
    files = [data_file(ids.file(), t, None) for _ in range(150)]
    table = arrow_rows(DATA_FILE, files)
    reader = pa.RecordBatchReader.from_batches(table.schema, table.to_batches(max_chunksize=40))
    with connection(uri) as conn:
        with conn.cursor() as cur:
            assert cur.adbc_ingest(DATA_FILE, reader, mode="append") == len(files)
        conn.commit()
    assert_stored(uri, before.with_rows(DATA_FILE, files), "after an ingest of 4 batches")


def test_ingest_of_a_batch_over_4_mib(server_factory):
    """One ingest message well over tonic's default 4 MiB decode limit (ADBC sends up to
    16 MiB)."""
    running = server_factory("big-ingest", extra_args=[
        "--txn-max-rows", "1000000", "--txn-max-bytes", str(1 << 30)])
    before = read_state(running.uri)
    ids = Ids()
    t = ids.table()
    files = [data_file(ids.file(), t, None, path="/lake/big/" + "p" * 1000 + f"/{i}.parquet")
             for i in range(5000)]
    table = arrow_rows(DATA_FILE, files).combine_chunks()
    assert table.nbytes > 5 << 20 and len(table.to_batches()) == 1, "one batch over 5 MiB"
    with connection(running.uri) as conn:
        assert ingest(conn, DATA_FILE, table) == len(files)
        conn.commit()
    assert_stored(running.uri, before.with_rows(DATA_FILE, files), "after the big ingest")


# --------------------------------------------------------------------------------------------
# What an ingest accepts.


def test_ingest_casts_narrower_integers_and_null_columns(uri, ids):
    before = read_state(uri)
    t = ids.table()
    nested = Mapping(ids.file(), t, [(0, "s", 1, None, False), (1, "a", 2, 0, False),
                                     (2, "b", 3, 0, False), (3, "p", 4, None, True)])
    flat = flat_mapping(ids.file(), t, 3)
    # flat's name rows: parent_column all NULL, sent as a null-typed column.
    flat_names = pa.table({
        "mapping_id": pa.array([r[0] for r in flat.name_rows], pa.int32()),
        "column_id": pa.array([r[1] for r in flat.name_rows], pa.uint8()),
        "source_name": pa.array([r[2] for r in flat.name_rows], pa.utf8()),
        "target_field_id": pa.array([r[3] for r in flat.name_rows], pa.int16()),
        "parent_column": pa.nulls(len(flat.name_rows)),
        "is_partition": pa.array([r[5] for r in flat.name_rows], pa.bool_()),
    })
    narrow_names = [("mapping_id", pa.uint32()), ("column_id", pa.int16()),
                    ("source_name", pa.utf8()), ("target_field_id", pa.int32()),
                    ("parent_column", pa.int8()), ("is_partition", pa.bool_())]
    maps = arrow_rows(COLUMN_MAPPING, [nested.column_row, flat.column_row],
                      [("mapping_id", pa.int32()), ("table_id", pa.uint16()), ("type", pa.utf8())])
    f = data_file(ids.file(), t, nested.mapping_id)
    narrow_file, null_cols = [], set()
    for (name, typ), v in zip(COLUMNS[DATA_FILE], f):
        if v is None:
            narrow_file.append((name, pa.null()))
            null_cols.add(name)
        elif typ == pa.int64():
            narrow_file.append((name, pa.uint32() if name == "data_file_id" else pa.int32()))
        else:
            narrow_file.append((name, typ))
    assert null_cols >= {"end_snapshot", "encryption_key"}, "null-typed int and utf8 columns"
    want = nested.added_to(flat.added_to(before)).with_rows(DATA_FILE, [f])
    with connection(uri) as conn:
        ingest_ok(conn, COLUMN_MAPPING, maps)
        ingest_ok(conn, NAME_MAPPING, arrow_rows(NAME_MAPPING, nested.name_rows, narrow_names))
        ingest_ok(conn, NAME_MAPPING, flat_names)
        ingest_ok(conn, DATA_FILE, arrow_rows(DATA_FILE, [f], narrow_file))
        conn.commit()
    assert_stored(uri, want, "rows ingested with narrower integer and null-typed columns")


WRONG_TYPES = [
    # (table, column, the type sent, a value of it)
    (COLUMN_MAPPING, "table_id", pa.utf8(), "1"),
    (COLUMN_MAPPING, "type", pa.int64(), 1),
    (NAME_MAPPING, "target_field_id", pa.float64(), 1.0),
    (NAME_MAPPING, "is_partition", pa.int64(), 0),
    (DATA_FILE, "record_count", pa.float64(), 3.0),
    (DATA_FILE, "path", pa.int64(), 7),
]


@pytest.mark.parametrize("table,column,typ,value", WRONG_TYPES,
                         ids=[f"{t}.{c}-{ty}" for t, c, ty, _ in WRONG_TYPES])
def test_ingest_of_a_wrong_type_is_refused(uri, ids, table, column, typ, value):
    before = read_state(uri)
    t = ids.table()
    m = flat_mapping(ids.file(), t, 2)
    row = {COLUMN_MAPPING: m.column_row, NAME_MAPPING: m.name_rows[0],
           DATA_FILE: data_file(ids.file(), t, None)}[table]
    cols = [(n, typ if n == column else ty) for n, ty in COLUMNS[table]]
    row = tuple(value if n == column else v for (n, _), v in zip(COLUMNS[table], row))
    with connection(uri) as conn:
        with pytest.raises(flightsql.Error) as e:
            ingest(conn, table, arrow_rows(table, [row], cols))
        check_error(e.value, flightsql.ProgrammingError, statuses=[ISSUE.INVALID_ARGUMENT],
                    words=[column], what=f"{column} sent as {typ}")
        conn.rollback()
    assert_stored(uri, before, f"after refusing {column} as {typ}")


COLUMN_NAME_CASES = {
    "missing": (["mapping_id", "table_id"], "type"),
    "extra": (["mapping_id", "table_id", "type", "bogus"], "bogus"),
    "misspelled": (["mapping_id", "table_idd", "type"], "table_idd"),
}


@pytest.mark.parametrize("case", sorted(COLUMN_NAME_CASES))
def test_ingest_columns_must_match_the_table(uri, ids, case):
    names, culprit = COLUMN_NAME_CASES[case]
    before = read_state(uri)
    values = {"mapping_id": ids.file(), "table_id": ids.table(), "table_idd": 1,
              "type": "map_by_name", "bogus": 1}
    table = pa.table({n: [values[n]] for n in names})
    with connection(uri) as conn:
        with pytest.raises(flightsql.Error) as e:
            ingest(conn, COLUMN_MAPPING, table)
        check_error(e.value, flightsql.ProgrammingError, words=[culprit],
                    what=f"ingest with columns {names}")
        conn.rollback()
    assert_stored(uri, before, f"after refusing columns {names}")


def test_ingest_into_an_unknown_table_is_not_found(uri):
    before = read_state(uri)
    with connection(uri) as conn:
        with pytest.raises(flightsql.Error) as e:
            ingest(conn, "ducklake_no_such_table", pa.table({"mapping_id": [1]}))
        check_error(e.value, flightsql.ProgrammingError, statuses=[ISSUE.NOT_FOUND],
                    words=["ducklake_no_such_table"], what="ingest into an unknown table")
    assert_stored(uri, before, "after an ingest into an unknown table")


def test_ingest_mode_create_is_already_exists(uri, ids):
    before = read_state(uri)
    m = flat_mapping(ids.file(), ids.table(), 1)
    with connection(uri) as conn:
        with conn.cursor() as cur:
            with pytest.raises(flightsql.Error) as e:
                cur.adbc_ingest(COLUMN_MAPPING, arrow_rows(COLUMN_MAPPING, [m.column_row]),
                                mode="create")
        check_error(e.value, flightsql.ProgrammingError, statuses=[ISSUE.ALREADY_EXISTS],
                    what="ingest with mode='create'")
        conn.commit()
    assert_stored(uri, before, "after an ingest with mode='create'")


def test_ingest_mode_replace_is_refused_and_replaces_nothing(uri, ids):
    before = read_state(uri)
    f = data_file(ids.file(), ids.table(), None)
    with connection(uri) as conn:
        with conn.cursor() as cur:
            with pytest.raises((flightsql.ProgrammingError, flightsql.NotSupportedError)) as e:
                cur.adbc_ingest(DATA_FILE, arrow_rows(DATA_FILE, [f]), mode="replace")
        assert str(e.value).strip()
        conn.commit()
    assert_stored(uri, before, "after an ingest with mode='replace' (the table is intact)")


# --------------------------------------------------------------------------------------------
# DuckLake catalog versions: a deployment serves and accepts the ducklake_data_file columns of
# the one version it records (`serve --ducklake-version`, 0.3 by default); an ingest with
# another version's columns is refused naming the column and both versions.


@pytest.fixture(scope="module")
def lake_1_0(server_factory):
    """A server of DuckLake 1.0's catalog tables, on an empty store."""
    return server_factory("writes-ducklake-1.0", steps_file=None,
                          extra_args=["--ducklake-version", "1.0"])


def stored_tables(uri: str) -> Dict[str, Tuple[List[str], List[tuple]]]:
    """Each table's column names and sorted rows as committed (`SELECT *`, whatever columns
    the server's version has)."""
    out = {}
    with autocommit_cursor(uri) as cur:
        for table in TABLES:
            cur.execute(f"SELECT * FROM {table}")
            got = cur.fetch_arrow_table()
            out[table] = (got.schema.names, sorted_rows(tuple(r.values()) for r in got.to_pylist()))
    return out


def versioned_file(version: str, ids: Ids) -> tuple:
    """A data file with `version`'s columns, its later columns set."""
    later = {n: v for n, v in (("partial_max", 5), ("row_group_count", 2))
             if n in data_file_names(version)}
    return data_file_in(version, data_file(ids.file(), ids.table(), None), **later)


# case -> (the version the server serves, the version whose columns are sent, the column the
# refusal names, the version it names as that column's).
VERSION_REFUSALS = {
    "1.0-into-0.3": ("0.3", "1.0", "partial_max", "1.0"),
    "0.3-into-1.0": ("1.0", "0.3", "partial_file_info", "0.3"),
    "1.1-into-1.0": ("1.0", "1.1", "row_group_count", "1.1"),
}


@pytest.mark.parametrize("case", sorted(VERSION_REFUSALS))
def test_ingest_of_another_versions_data_file_is_refused(request, ids, case):
    served, sent, column, its = VERSION_REFUSALS[case]
    uri = request.getfixturevalue("lake" if served == "0.3" else "lake_1_0").uri
    before = stored_tables(uri)
    assert before[DATA_FILE][0] == data_file_names(served), "the server's version"
    batch = arrow_rows(DATA_FILE, [versioned_file(sent, ids)], DATA_FILE_VERSIONS[sent])
    with connection(uri) as conn:
        with pytest.raises(flightsql.Error) as e:
            ingest(conn, DATA_FILE, batch)
        check_error(e.value, flightsql.ProgrammingError, statuses=[ISSUE.INVALID_ARGUMENT],
                    words=[f"column {column} ", f"DuckLake {its}'s", f"DuckLake {served}'s"],
                    what=f"DuckLake {sent}'s data file into a DuckLake {served} server")
        conn.commit()  # the transaction holds nothing of the refused ingest
    assert stored_tables(uri) == before, f"a refused DuckLake {sent} ingest wrote rows"


def test_ingest_of_the_served_versions_data_files(lake_1_0, ids):
    """DuckLake 1.0's ducklake_data_file rows, ingested into a 1.0 server, read back with
    its columns in its order, partial_max included."""
    uri = lake_1_0.uri
    table_id = ids.table()
    files = [data_file_in("1.0", data_file(ids.file(), table_id, None), partial_max=p)
             for p in (None, 23)]
    with connection(uri) as conn:
        got = ingest(conn, DATA_FILE, arrow_rows(DATA_FILE, files, DATA_FILE_VERSIONS["1.0"]))
        assert got == len(files), f"ingest answered {got} rows staged"
        conn.commit()
    with autocommit_cursor(uri) as cur:
        cur.execute(f"SELECT * FROM ducklake_data_file WHERE table_id = {table_id} "
                    "ORDER BY data_file_id")
        read = cur.fetch_arrow_table()
        assert read.schema.names == data_file_names("1.0")
        assert [tuple(r.values()) for r in read.to_pylist()] == files
        cur.execute("SELECT data_file_id FROM ducklake_data_file WHERE partial_max = 23")
        assert cur.fetchall() == [(files[1][0],)]


# --------------------------------------------------------------------------------------------
# DuckLake's constraints. Each case is a list of ingests; the error arrives at one of them
# (violations no later statement can fix) or at the commit (violations a later statement of
# the same transaction could still fix). Either way the store gains nothing.

Step = Tuple[str, List[tuple]]


@dataclass
class Case:
    steps: List[Step]
    fails_at: Union[int, str]  # index of the failing ingest, or "commit"
    statuses: Sequence[AdbcStatusCode]
    ids: Sequence[int] = ()
    words: Sequence[str] = ()


INVALID = [ISSUE.INVALID_ARGUMENT]


def _statement_cases() -> Dict[str, Callable[[Ids, CatalogState], Case]]:
    def dup_column_id_in_one_ingest(ids, state):
        m = flat_mapping(ids.file(), ids.table(), 3)
        dup = (m.mapping_id, 1, "again", 9, None, False)
        return Case([(COLUMN_MAPPING, [m.column_row]), (NAME_MAPPING, m.name_rows + [dup])],
                    1, INVALID, [m.mapping_id])

    def dup_column_id_across_ingests(ids, state):
        m = flat_mapping(ids.file(), ids.table(), 3)
        dup = (m.mapping_id, 1, "again", 9, None, False)
        return Case([(COLUMN_MAPPING, [m.column_row]), (NAME_MAPPING, m.name_rows),
                     (NAME_MAPPING, [dup])], 2, INVALID, [m.mapping_id])

    def parent_equal_to_column_id(ids, state):
        m = Mapping(ids.file(), ids.table(), [(0, "s", 1, None, False), (1, "a", 2, 1, False)])
        return Case([(COLUMN_MAPPING, [m.column_row]), (NAME_MAPPING, m.name_rows)],
                    1, INVALID, [m.mapping_id])

    def parent_after_column_id(ids, state):
        m = Mapping(ids.file(), ids.table(), [(0, "s", 1, None, False), (1, "a", 2, 2, False),
                                              (2, "n", 3, 0, False)])
        return Case([(COLUMN_MAPPING, [m.column_row]), (NAME_MAPPING, m.name_rows)],
                    1, INVALID, [m.mapping_id])

    def null_column(table, column):
        def build(ids, state):
            m = flat_mapping(ids.file(), ids.table(), 2)
            pos = column_names(table).index(column)
            if table == DATA_FILE:
                bad = list(data_file(ids.file(), m.table_id, None))
                bad[pos] = None
                return Case([(DATA_FILE, [tuple(bad)])], 0, INVALID, words=[column])
            if table == COLUMN_MAPPING:
                bad = list(m.column_row)
                bad[pos] = None
                return Case([(COLUMN_MAPPING, [tuple(bad)])], 0, INVALID, words=[column])
            bad = list(m.name_rows[1])
            bad[pos] = None
            return Case([(COLUMN_MAPPING, [m.column_row]),
                         (NAME_MAPPING, [m.name_rows[0], tuple(bad)])], 1, INVALID,
                        words=[column])
        return build

    def mapping_already_stored(ids, state):
        table_id, mapping_id = fixture_mapping_keys(state)[-1]
        names = flat_mapping(mapping_id, table_id, 2)
        return Case([(COLUMN_MAPPING, [names.column_row]), (NAME_MAPPING, names.name_rows)],
                    0, [ISSUE.ALREADY_EXISTS], [mapping_id], ["already exists"])

    def same_mapping_twice_in_one_ingest(ids, state):
        m = flat_mapping(ids.file(), ids.table(), 2)
        return Case([(COLUMN_MAPPING, [m.column_row, m.column_row])], 0,
                    [ISSUE.INVALID_ARGUMENT, ISSUE.ALREADY_EXISTS], [m.mapping_id])

    def same_mapping_twice_across_ingests(ids, state):
        m = flat_mapping(ids.file(), ids.table(), 2)
        return Case([(COLUMN_MAPPING, [m.column_row]), (NAME_MAPPING, m.name_rows),
                     (COLUMN_MAPPING, [m.column_row])], 2,
                    [ISSUE.INVALID_ARGUMENT, ISSUE.ALREADY_EXISTS], [m.mapping_id])

    return {
        "dup-column-id-in-one-ingest": dup_column_id_in_one_ingest,
        "dup-column-id-across-ingests": dup_column_id_across_ingests,
        "parent-equal-to-column-id": parent_equal_to_column_id,
        "parent-after-column-id": parent_after_column_id,
        "null-column_mapping.mapping_id": null_column(COLUMN_MAPPING, "mapping_id"),
        "null-column_mapping.table_id": null_column(COLUMN_MAPPING, "table_id"),
        "null-name_mapping.mapping_id": null_column(NAME_MAPPING, "mapping_id"),
        "null-name_mapping.column_id": null_column(NAME_MAPPING, "column_id"),
        "null-name_mapping.source_name": null_column(NAME_MAPPING, "source_name"),
        "null-name_mapping.target_field_id": null_column(NAME_MAPPING, "target_field_id"),
        "null-data_file.data_file_id": null_column(DATA_FILE, "data_file_id"),
        "mapping-already-stored": mapping_already_stored,
        "same-mapping-twice-in-one-ingest": same_mapping_twice_in_one_ingest,
        "same-mapping-twice-across-ingests": same_mapping_twice_across_ingests,
    }


def _commit_cases() -> Dict[str, Callable[[Ids, CatalogState], Case]]:
    """Each also stages a complete, valid mapping and file: the failed commit must drop them
    too."""

    def base(ids):
        good = flat_mapping(ids.file(), ids.table(), 3)
        f = data_file(ids.file(), good.table_id, good.mapping_id)
        return good, f

    def mapping_without_name_rows(ids, state):
        good, f = base(ids)
        lonely = flat_mapping(ids.file(), good.table_id, 1)
        return Case([(COLUMN_MAPPING, [good.column_row, lonely.column_row]),
                     (NAME_MAPPING, good.name_rows), (DATA_FILE, [f])],
                    "commit", INVALID, [lonely.mapping_id])

    def name_rows_without_mapping(ids, state):
        good, f = base(ids)
        orphan = flat_mapping(ids.file(), good.table_id, 2)
        return Case([(COLUMN_MAPPING, [good.column_row]),
                     (NAME_MAPPING, good.name_rows + orphan.name_rows), (DATA_FILE, [f])],
                    "commit", INVALID, [orphan.mapping_id])

    def data_file_with_unknown_mapping(ids, state):
        good, f = base(ids)
        missing = ids.file()
        bad = data_file(ids.file(), good.table_id, missing)
        return Case([(COLUMN_MAPPING, [good.column_row]), (NAME_MAPPING, good.name_rows),
                     (DATA_FILE, [f, bad])], "commit", INVALID, [missing])

    def data_file_with_another_tables_mapping(ids, state):
        good, f = base(ids)
        other_table, other_mapping = fixture_mapping_keys(state)[-1]
        assert other_table != good.table_id
        bad = data_file(ids.file(), good.table_id, other_mapping)
        return Case([(COLUMN_MAPPING, [good.column_row]), (NAME_MAPPING, good.name_rows),
                     (DATA_FILE, [f, bad])], "commit", INVALID, [other_mapping])

    return {
        "mapping-without-name-rows": mapping_without_name_rows,
        "name-rows-without-mapping": name_rows_without_mapping,
        "data-file-with-unknown-mapping": data_file_with_unknown_mapping,
        "data-file-with-another-tables-mapping": data_file_with_another_tables_mapping,
    }


STATEMENT_CASES = _statement_cases()
COMMIT_CASES = _commit_cases()


def run_case(uri: str, before: CatalogState, case: Case, what: str) -> None:
    conn = connect(uri)
    try:
        for i, (table, rows_) in enumerate(case.steps):
            if i == case.fails_at:
                with pytest.raises(flightsql.Error) as e:
                    ingest(conn, table, rows_)
                check_error(e.value, flightsql.ProgrammingError, statuses=case.statuses,
                            ids=case.ids, words=case.words, what=f"{what}, ingest {i}")
                conn.rollback()
                break
            ingest_ok(conn, table, rows_)
        else:
            assert case.fails_at == "commit"
            with pytest.raises(flightsql.Error) as e:
                conn.commit()
            check_error(e.value, flightsql.ProgrammingError, statuses=case.statuses,
                        ids=case.ids, words=case.words, what=f"{what}, at commit")
    finally:
        conn.close()
    assert_stored(uri, before, f"after {what}")


@pytest.mark.parametrize("case", list(STATEMENT_CASES))
def test_constraint_refused_at_the_statement(uri, ids, case):
    before = read_state(uri)
    run_case(uri, before, STATEMENT_CASES[case](ids, before), case)


@pytest.mark.parametrize("case", list(COMMIT_CASES))
def test_constraint_refused_at_commit(uri, ids, case):
    before = read_state(uri)
    run_case(uri, before, COMMIT_CASES[case](ids, before), case)


def test_a_later_statement_can_fix_what_commit_checks(uri, ids):
    """Name rows before their column-mapping row, a data file before its mapping: fine by
    commit time."""
    before = read_state(uri)
    t = ids.table()
    m = mapping_like(before, 0, ids.file(), t)
    f = data_file(ids.file(), t, m.mapping_id)
    with connection(uri) as conn:
        ingest_ok(conn, DATA_FILE, [f])
        ingest_ok(conn, NAME_MAPPING, m.name_rows[:5])
        ingest_ok(conn, COLUMN_MAPPING, [m.column_row])
        ingest_ok(conn, NAME_MAPPING, m.name_rows[5:])
        conn.commit()
    assert_stored(uri, m.added_to(before).with_rows(DATA_FILE, [f]), "out-of-order commit")


def test_failed_statement_leaves_the_rest_of_the_transaction(uri, ids):
    """A refused ingest stages none of its rows, not even its valid ones, and the
    transaction goes on."""
    before = read_state(uri)
    t = ids.table()
    m1, m2 = flat_mapping(ids.file(), t, 3), flat_mapping(ids.file(), t, 2)
    bad_m2 = m2.name_rows + [(m2.mapping_id, 0, "dup", 5, None, False)]
    with connection(uri) as conn:
        ingest_ok(conn, COLUMN_MAPPING, [m1.column_row, m2.column_row])
        with pytest.raises(flightsql.Error) as e:
            ingest(conn, NAME_MAPPING, m1.name_rows + bad_m2)
        check_error(e.value, flightsql.ProgrammingError, statuses=INVALID, ids=[m2.mapping_id],
                    what="name rows with a duplicate column_id")
        assert_state(state_of(conn), before.with_rows(COLUMN_MAPPING,
                                                      [m1.column_row, m2.column_row]),
                     "own view after the refused ingest")
        # Had any of m1's rows been staged, these would be duplicates.
        ingest_ok(conn, NAME_MAPPING, m1.name_rows)
        ingest_ok(conn, NAME_MAPPING, m2.name_rows)
        conn.commit()
    assert_stored(uri, m2.added_to(m1.added_to(before)), "after the transaction went on")


@pytest.mark.parametrize("same_table", [True, False], ids=["same-table", "other-table"])
def test_data_file_id_already_stored_is_refused(uri, ids, same_table):
    """data_file_id is ducklake_data_file's PRIMARY KEY: taken whatever the table."""
    before = read_state(uri)
    stored = before[DATA_FILE][0]
    again = data_file(stored[0], stored[1] if same_table else ids.table(), None)
    fresh = data_file(ids.file(), again[1], None)
    conn = connect(uri)
    try:
        try:
            ingest_ok(conn, DATA_FILE, [fresh, again])
            conn.commit()
            pytest.fail(f"data file {stored[0]} inserted again and committed")
        except flightsql.Error as e:
            check_error(e, flightsql.ProgrammingError, statuses=[ISSUE.ALREADY_EXISTS],
                        ids=[stored[0]], words=["already exists"], what="stored data_file_id")
    finally:
        conn.close()
    assert_stored(uri, before, "after a stored data_file_id inserted again")


def test_data_file_twice_in_a_transaction_is_refused(uri, ids):
    before = read_state(uri)
    f = data_file(ids.file(), ids.table(), None)
    conn = connect(uri)
    try:
        try:
            ingest_ok(conn, DATA_FILE, [f])
            ingest_ok(conn, DATA_FILE, [f])
            conn.commit()
            pytest.fail(f"data file {f[0]} inserted twice and committed")
        except flightsql.Error as e:
            check_error(e, flightsql.ProgrammingError, ids=[f[0]],
                        what="data_file_id twice in a transaction")
    finally:
        conn.close()
    assert_stored(uri, before, "after a data_file_id inserted twice")


# --------------------------------------------------------------------------------------------
# Concurrent transactions.


def test_write_conflict_one_mapping_wins(uri, ids):
    before = read_state(uri)
    t, mapping_id = ids.table(), ids.file()
    ma = Mapping(mapping_id, t, [(0, "from_a", 1, None, False)])
    mb = Mapping(mapping_id, t, [(0, "from_b", 1, None, False), (1, "also_b", 2, None, False)])
    a, b = connect(uri), connect(uri)
    try:
        stage_mapping(a, ma)
        stage_mapping(b, mb)
        a.commit()
        with pytest.raises(flightsql.Error) as e:
            b.commit()
        check_error(e.value, flightsql.OperationalError, words=["conflict"],
                    what="the second commit of the same mapping")
    finally:
        a.close()
        b.close()
    assert_stored(uri, ma.added_to(before), "the first committer's mapping, only")


def test_disjoint_transactions_both_commit(uri, ids):
    """Different mappings (and files) of the same table in two concurrent transactions do not
    conflict."""
    before = read_state(uri)
    t = ids.table()
    ma, mb = flat_mapping(ids.file(), t, 2), flat_mapping(ids.file(), t, 3)
    fa, fb = data_file(ids.file(), t, ma.mapping_id), data_file(ids.file(), t, mb.mapping_id)
    with connection(uri) as a, connection(uri) as b:
        stage_mapping(a, ma)
        stage_mapping(b, mb)
        ingest_ok(a, DATA_FILE, [fa])
        ingest_ok(b, DATA_FILE, [fb])
        b.commit()
        a.commit()
    assert_stored(uri, ma.added_to(mb.added_to(before)).with_rows(DATA_FILE, [fa, fb]),
                  "two disjoint commits")


def ended(state: CatalogState, ids: Sequence[int], end_snapshot: int) -> CatalogState:
    """`state` with the files `ids` ended at `end_snapshot`."""
    names = column_names(DATA_FILE)
    at = names.index("end_snapshot")
    rows = [r for r in state[DATA_FILE] if r[0] in ids]
    out = state.without_rows(DATA_FILE, lambda rec: rec["data_file_id"] in ids)
    return out.with_rows(DATA_FILE, [r[:at] + (end_snapshot,) + r[at + 1:] for r in rows])


def end_files_sql(end_snapshot: int, where: str) -> str:
    """DuckLake's end transition (a file fully deleted, or DROP TABLE)."""
    return (f"UPDATE {DATA_FILE} SET end_snapshot = {end_snapshot} "
            f"WHERE end_snapshot IS NULL AND {where}")


def commit_loses(conn, what: str) -> None:
    """The commit is refused as a conflict (gRPC ABORTED)."""
    with pytest.raises(flightsql.Error) as e:
        conn.commit()
    check_error(e.value, flightsql.OperationalError, words=["conflict"], what=what)


def test_concurrent_ends_of_one_file_one_wins(uri, ids):
    """Two transactions end the same file: the later commit is told the file changed, instead
    of overwriting the first one's end_snapshot."""
    t = ids.table()
    f = data_file(ids.file(), t, None)
    commit_setup(uri, files=[f])
    before = read_state(uri)
    a, b = connect(uri), connect(uri)
    try:
        assert dml(a, end_files_sql(5, f"data_file_id IN ({f[0]})")) == 1
        assert dml(b, end_files_sql(6, f"data_file_id IN ({f[0]})")) == 1
        a.commit()
        commit_loses(b, "the second end of one file")
    finally:
        a.close()
        b.close()
    assert_stored(uri, ended(before, [f[0]], 5), "the first end only")


def test_one_data_file_id_in_two_tables_one_wins(uri, ids):
    """data_file_id is unique across tables, also between concurrent transactions."""
    before = read_state(uri)
    file_id = ids.file()
    fa, fb = data_file(file_id, ids.table(), None), data_file(file_id, ids.table(), None)
    a, b = connect(uri), connect(uri)
    try:
        ingest_ok(a, DATA_FILE, [fa])
        ingest_ok(b, DATA_FILE, [fb])
        a.commit()
        commit_loses(b, "the same data_file_id in another table")
    finally:
        a.close()
        b.close()
    assert_stored(uri, before.with_rows(DATA_FILE, [fa]), "the first table's file only")


@pytest.mark.parametrize("first", ["drop", "insert", "drop-of-an-empty-table"])
def test_drop_table_and_an_insert_into_it_one_wins(uri, ids, first):
    """DROP TABLE's end of every file of a table and a concurrent insert into the table: the
    later commit loses, whichever it is, so no file stays live in a dropped table. A table
    without files yet is held all the same."""
    t = ids.table()
    old = data_file(ids.file(), t, None)
    empty = first == "drop-of-an-empty-table"
    if not empty:
        commit_setup(uri, files=[old])
    before = read_state(uri)
    new = data_file(ids.file(), t, None)
    dropper, inserter = connect(uri), connect(uri)
    try:
        assert dml(dropper, end_files_sql(9, f"table_id IN ({t})")) == (0 if empty else 1)
        ingest_ok(inserter, DATA_FILE, [new])
        if first != "insert":
            dropper.commit()
            commit_loses(inserter, "an insert into a table dropped concurrently")
            want = before if empty else ended(before, [old[0]], 9)
        else:
            inserter.commit()
            commit_loses(dropper, "a drop of a table inserted into concurrently")
            want = before.with_rows(DATA_FILE, [new])
    finally:
        dropper.close()
        inserter.close()
    assert_stored(uri, want, f"only the {first}")


# --------------------------------------------------------------------------------------------
# DML through cursor.execute.


def commit_setup(uri: str, mappings: Sequence[Mapping] = (), files: Sequence[tuple] = ()):
    with connection(uri) as conn:
        for m in mappings:
            stage_mapping(conn, m)
        if files:
            ingest_ok(conn, DATA_FILE, list(files))
        conn.commit()


def test_insert_values_in_ducklakes_commit_order(uri, ids):
    before = read_state(uri)
    t = ids.table()
    ms = [mapping_like(before, 0, ids.file(), t), flat_mapping(ids.file(), t, 2)]
    files = [data_file(ids.file(), t, ms[0].mapping_id), data_file(ids.file(), t, ms[1].mapping_id),
             data_file(ids.file(), t, None)]
    names = [r for m in ms for r in m.name_rows]
    want = ms[1].added_to(ms[0].added_to(before)).with_rows(DATA_FILE, files)
    with connection(uri) as conn, connection(uri) as other:
        assert dml(conn, insert_sql(COLUMN_MAPPING, [m.column_row for m in ms])) == 2
        assert dml(conn, insert_sql(NAME_MAPPING, names)) == len(names)
        assert dml(conn, insert_sql(DATA_FILE, files)) == len(files)
        assert_state(state_of(conn), want, "own view after the INSERTs")
        assert_state(state_of(other), before, "another connection before the commit")
        conn.commit()
    assert_stored(uri, want, "after the INSERTs")


def test_insert_with_a_column_list(uri, ids):
    before = read_state(uri)
    t = ids.table()
    m = flat_mapping(ids.file(), t, 3)
    f = data_file(ids.file(), t, m.mapping_id)
    with connection(uri) as conn:
        assert dml(conn, insert_sql(COLUMN_MAPPING, [m.column_row],
                                    list(reversed(column_names(COLUMN_MAPPING))))) == 1
        cols = ["source_name", "mapping_id", "is_partition", "parent_column", "column_id",
                "target_field_id"]
        assert sorted(cols) == sorted(column_names(NAME_MAPPING))
        assert dml(conn, insert_sql(NAME_MAPPING, m.name_rows, cols)) == len(m.name_rows)
        cols = sorted(column_names(DATA_FILE))
        assert dml(conn, insert_sql(DATA_FILE, [f], cols)) == 1
        conn.commit()
    assert_stored(uri, m.added_to(before).with_rows(DATA_FILE, [f]), "INSERTs with column lists")


def test_insert_with_parameters(uri, ids):
    before = read_state(uri)
    t = ids.table()
    m = Mapping(ids.file(), t, [(0, "s", 1, None, False), (1, "a", 2, 0, False),
                                (2, "part", 3, None, True)])
    with connection(uri) as conn:
        assert dml(conn, "INSERT INTO ducklake_column_mapping VALUES (?, ?, ?)",
                   m.column_row) == 1
        for r in m.name_rows:
            assert dml(conn, "INSERT INTO ducklake_name_mapping VALUES (?, ?, ?, ?, ?, ?)",
                       r) == 1
        conn.commit()
    assert_stored(uri, m.added_to(before), "INSERTs with bound parameters")


def test_executemany_inserts_and_deletes_row_by_row(uri, ids):
    """`executemany` sends every parameter row in one CommandPreparedStatementUpdate, applied
    as one change; rowcount is the sum."""
    before = read_state(uri)
    t = ids.table()
    m = Mapping(ids.file(), t, [(0, "s", 1, None, False), (1, "a", 2, 0, False),
                                (2, "b", 3, 0, False), (3, "part", 4, None, True)])
    with connection(uri) as conn:
        cur = conn.cursor()
        cur.execute("INSERT INTO ducklake_column_mapping VALUES (?, ?, ?)", m.column_row)
        cur.executemany("INSERT INTO ducklake_name_mapping VALUES (?, ?, ?, ?, ?, ?)",
                        m.name_rows)
        assert cur.rowcount == len(m.name_rows)
        conn.commit()
        assert_stored(uri, m.added_to(before), "executemany INSERT of every name row")

        files = [data_file(ids.file(), t, m.mapping_id) for _ in range(3)]
        cur.executemany(f"INSERT INTO {DATA_FILE} VALUES ({', '.join('?' * len(files[0]))})",
                        files)
        assert cur.rowcount == len(files)
        gone = [(files[0][0],), (files[2][0],), (ids.file(),)]
        cur.executemany("DELETE FROM ducklake_data_file WHERE data_file_id = ?", gone)
        assert cur.rowcount == 2
        conn.commit()
        cur.close()
    after = m.added_to(before).with_rows(DATA_FILE, [files[1]])
    assert_stored(uri, after, "executemany INSERT of files, then DELETE of two of them")


@pytest.mark.parametrize("autocommit", [False, True])
def test_executemany_applies_every_row_or_none(uri, ids, autocommit):
    """A multi-row prepared UPDATE whose second row is refused changes nothing: not the first
    row, and (in a transaction) not what the transaction staged before it."""
    t = ids.table()
    live, done = data_file(ids.file(), t, None), data_file(ids.file(), t, None, end_snapshot=3)
    commit_setup(uri, files=[live, done])
    before = read_state(uri)
    with connection(uri) as conn:
        if autocommit:
            conn.adbc_connection.set_autocommit(True)
        cur = conn.cursor()
        staged = data_file(ids.file(), t, None)
        if not autocommit:
            ingest_ok(conn, DATA_FILE, [staged])
        with pytest.raises(flightsql.Error) as e:
            # The second file has ended already: its row is refused.
            cur.executemany(f"UPDATE {DATA_FILE} SET end_snapshot = ? WHERE data_file_id = ?",
                            [(7, live[0]), (8, done[0])])
        check_error(e.value, flightsql.ProgrammingError, ids=[done[0]],
                    words=["already ended"], what="a refused second row")
        if not autocommit:
            assert_state(state_of(conn), before.with_rows(DATA_FILE, [staged]),
                         "the transaction after the refused executemany")
            conn.commit()
            before = before.with_rows(DATA_FILE, [staged])
        cur.close()
    assert_stored(uri, before, "after a refused executemany")


def test_insert_violating_a_constraint_is_refused(uri, ids):
    before = read_state(uri)
    m = flat_mapping(ids.file(), ids.table(), 2)
    with connection(uri) as conn:
        assert dml(conn, insert_sql(COLUMN_MAPPING, [m.column_row])) == 1
        with pytest.raises(flightsql.Error) as e:
            dml(conn, insert_sql(NAME_MAPPING, m.name_rows + [m.name_rows[0]]))
        check_error(e.value, flightsql.ProgrammingError, statuses=INVALID, ids=[m.mapping_id],
                    what="INSERT of a duplicate column_id")
        conn.rollback()
    assert_stored(uri, before, "after a refused INSERT")


def test_delete_data_files_by_id(uri, ids):
    t = ids.table()
    files = [data_file(ids.file(), t, None) for _ in range(4)]
    commit_setup(uri, files=files)
    before = read_state(uri)
    gone = [files[0][0], files[2][0]]
    want = before.without_rows(DATA_FILE, lambda r: r["data_file_id"] in gone)
    with connection(uri) as conn, connection(uri) as other:
        assert dml(conn, DELETE_FILES.format(ids=in_list(gone + [ids.file()]))) == len(gone)
        assert_state(state_of(conn), want, "own view after the DELETE")
        assert_state(state_of(other), before, "another connection before the commit")
        conn.commit()
    assert_stored(uri, want, "after DELETE ... WHERE data_file_id IN (...)")


def test_delete_with_parameters(uri, ids):
    t = ids.table()
    files = [data_file(ids.file(), t, None) for _ in range(3)]
    commit_setup(uri, files=files)
    before = read_state(uri)
    gone = [files[1][0], files[2][0]]
    with connection(uri) as conn:
        assert dml(conn, "DELETE FROM ducklake_data_file WHERE data_file_id IN (?, ?)",
                   tuple(gone)) == 2
        assert dml(conn, "DELETE FROM ducklake_data_file WHERE data_file_id = ?",
                   (files[0][0],)) == 1
        conn.commit()
    gone.append(files[0][0])
    assert_stored(uri, before.without_rows(DATA_FILE, lambda r: r["data_file_id"] in gone),
                  "after DELETEs with parameters")


def test_end_snapshot_by_table_id(uri, ids):
    """DuckLake's DROP TABLE: only the table's live files end; ended files keep their end."""
    t, other_t = ids.table(), ids.table()
    files = [data_file(ids.file(), t, None, begin_snapshot=3) for _ in range(3)]
    ended = data_file(ids.file(), t, None, begin_snapshot=2, end_snapshot=4)
    bystander = data_file(ids.file(), other_t, None, begin_snapshot=3)
    commit_setup(uri, files=files + [ended, bystander])
    before = read_state(uri)
    snapshot = 9
    want = before.with_changes(
        DATA_FILE, lambda r: r["table_id"] == t and r["end_snapshot"] is None,
        end_snapshot=snapshot)
    with connection(uri) as conn:
        n = dml(conn, END_BY_TABLE.format(snapshot=snapshot, ids=t))
        assert n == len(files)
        assert_state(state_of(conn), want, "own view after the end transition")
        # DuckLake's read at the snapshot before and at the new one, in the same transaction.
        at = query(conn, DATA_FILE_AT.format(table_id=t, snapshot=snapshot))
        assert_same_rows(rows(at), want.data_files_at(t, snapshot), f"files at {snapshot}")
        assert rows(at) == [], "no file of a dropped table is live at the drop snapshot"
        conn.commit()
    assert_stored(uri, want, "after UPDATE ... AND table_id IN (...)")
    with connection(uri) as conn:
        for s in (snapshot - 1, snapshot):
            at = query(conn, DATA_FILE_AT.format(table_id=t, snapshot=s))
            assert_same_rows(rows(at), want.data_files_at(t, s), f"files of {t} at {s}")


def test_end_snapshot_by_data_file_id(uri, ids):
    t = ids.table()
    files = [data_file(ids.file(), t, None, begin_snapshot=2) for _ in range(3)]
    ended = data_file(ids.file(), t, None, begin_snapshot=1, end_snapshot=2)
    commit_setup(uri, files=files + [ended])
    before = read_state(uri)
    target = [files[0][0], files[2][0]]
    asked = target + [ended[0], ids.file()]  # an ended file and an unknown id change nothing
    want = before.with_changes(DATA_FILE, lambda r: r["data_file_id"] in target, end_snapshot=5)
    with connection(uri) as conn:
        assert dml(conn, END_BY_FILE.format(snapshot=5, ids=in_list(asked))) == len(target)
        conn.commit()
    assert_stored(uri, want, "after UPDATE ... AND data_file_id IN (...)")


def test_end_snapshot_with_parameters(uri, ids):
    t = ids.table()
    files = [data_file(ids.file(), t, None, begin_snapshot=2) for _ in range(2)]
    commit_setup(uri, files=files)
    before = read_state(uri)
    with connection(uri) as conn:
        n = dml(conn, "UPDATE ducklake_data_file SET end_snapshot = ? "
                      "WHERE end_snapshot IS NULL AND table_id IN (?)", (6, t))
        assert n == len(files)
        conn.commit()
    assert_stored(uri, before.with_changes(DATA_FILE, lambda r: r["table_id"] == t,
                                           end_snapshot=6), "after a parameterized UPDATE")


def test_delete_mappings_of_a_table_and_the_orphan_sweep(uri, ids):
    t, kept_t = ids.table(), ids.table()
    doomed = [mapping_like(read_state(uri), 0, ids.file(), t), flat_mapping(ids.file(), t, 2)]
    kept = flat_mapping(ids.file(), kept_t, 2)
    commit_setup(uri, mappings=doomed + [kept])
    before = read_state(uri)
    doomed_ids = {m.mapping_id for m in doomed}
    want = before.without_rows(COLUMN_MAPPING, lambda r: r["table_id"] == t).without_rows(
        NAME_MAPPING, lambda r: r["mapping_id"] in doomed_ids)
    with connection(uri) as conn, connection(uri) as other:
        assert dml(conn, DELETE_MAPPINGS.format(ids=t)) == len(doomed)
        assert_state(state_of(conn), want, "own view: the mappings and their name rows gone")
        check_mapping_load(conn, MAPPING_LOAD, want.mapping_join(), "own mapping load")
        assert dml(conn, ORPHAN_SWEEP) == 0
        assert_state(state_of(other), before, "another connection before the commit")
        conn.commit()
    assert_stored(uri, want, "after DELETE ... WHERE table_id IN (...) and the sweep")
    with connection(uri) as conn:
        assert dml(conn, ORPHAN_SWEEP) == 0, "the sweep after the mappings are gone"
        conn.commit()
    assert_stored(uri, want, "after a second sweep")


def test_orphan_sweep_deletes_nothing(uri):
    before = read_state(uri)
    with connection(uri) as conn:
        assert dml(conn, ORPHAN_SWEEP) == 0
        conn.commit()
    assert_stored(uri, before, "after the orphan sweep")


def test_delete_of_a_live_mappings_name_rows_is_refused(uri, ids):
    m = flat_mapping(ids.file(), ids.table(), 3)
    commit_setup(uri, mappings=[m])
    before = read_state(uri)
    with connection(uri) as conn:
        for sql in [f"DELETE FROM ducklake_name_mapping WHERE mapping_id = {m.mapping_id}",
                    f"DELETE FROM ducklake_name_mapping WHERE mapping_id = {m.mapping_id} "
                    "AND column_id = 1"]:
            with pytest.raises(flightsql.Error) as e:
                dml(conn, sql)
            check_error(e.value, flightsql.ProgrammingError, ids=[m.mapping_id], what=sql)
        conn.commit()
    assert_stored(uri, before, "after refused DELETEs of name rows")


def test_dml_sees_the_transactions_staged_rows(uri, ids):
    """Statements evaluate against the transaction's view: they find, end and delete rows it
    staged itself, and a staged mapping deleted again is never stored."""
    before = read_state(uri)
    t = ids.table()
    m = flat_mapping(ids.file(), t, 2)
    files = [data_file(ids.file(), t, None, begin_snapshot=4) for _ in range(3)]
    with connection(uri) as conn:
        stage_mapping(conn, m)
        ingest_ok(conn, DATA_FILE, files)
        assert dml(conn, END_BY_TABLE.format(snapshot=8, ids=t)) == 3
        assert dml(conn, DELETE_FILES.format(ids=files[0][0])) == 1
        assert dml(conn, END_BY_FILE.format(snapshot=9, ids=files[1][0])) == 0, \
            "already ended in this transaction"
        assert dml(conn, DELETE_MAPPINGS.format(ids=t)) == 1
        assert dml(conn, ORPHAN_SWEEP) == 0
        conn.commit()
    want = before.with_rows(DATA_FILE, [f[:3] + (8,) + f[4:] for f in files[1:]])
    assert_stored(uri, want, "after DML over staged rows")


def test_dml_is_undone_by_rollback(uri, ids):
    t = ids.table()
    m = flat_mapping(ids.file(), t, 2)
    files = [data_file(ids.file(), t, m.mapping_id) for _ in range(2)]
    commit_setup(uri, mappings=[m], files=files)
    before = read_state(uri)
    with connection(uri) as conn:
        assert dml(conn, END_BY_TABLE.format(snapshot=7, ids=t)) == 2
        assert dml(conn, DELETE_FILES.format(ids=in_list(f[0] for f in files))) == 2
        assert dml(conn, DELETE_MAPPINGS.format(ids=t)) == 1
        conn.rollback()
        assert_state(state_of(conn), before, "own view after the rollback")
    assert_stored(uri, before, "after rolled-back DML")


# --------------------------------------------------------------------------------------------
# Reading one's own writes with DuckLake's queries.


def test_read_your_writes_with_ducklakes_queries(uri, ids):
    before = read_state(uri)
    t = ids.table()
    nested = mapping_like(before, 0, ids.file(), t)
    flat = flat_mapping(ids.file(), t, 3)
    f = data_file(ids.file(), t, nested.mapping_id, begin_snapshot=20)
    want = flat.added_to(nested.added_to(before)).with_rows(DATA_FILE, [f])
    with connection(uri) as conn, connection(uri) as other:
        stage_mapping(conn, nested)
        stage_mapping(conn, flat)
        ingest_ok(conn, DATA_FILE, [f])
        check_mapping_load(conn, MAPPING_LOAD, want.mapping_join(), "own mapping load")
        cursor = nested.mapping_id
        check_mapping_load(conn, MAPPING_LOAD_FROM.format(cursor=cursor),
                           want.mapping_join(min_mapping_id=cursor), "own mapping load, cursor")
        assert len(want.mapping_join(min_mapping_id=cursor)) == \
            len(nested.name_rows) + len(flat.name_rows)
        for s in (19, 20):
            at = query(conn, DATA_FILE_AT.format(table_id=t, snapshot=s))
            assert_same_rows(rows(at), want.data_files_at(t, s), f"own files at {s}")
        check_mapping_load(other, MAPPING_LOAD, before.mapping_join(), "another's mapping load")
        check_mapping_load(other, MAPPING_LOAD_FROM.format(cursor=cursor), [],
                           "another's mapping load, cursor")
        at = query(other, DATA_FILE_AT.format(table_id=t, snapshot=20))
        assert rows(at) == [], "another connection sees no staged file"
        conn.commit()
        other.rollback()
        check_mapping_load(other, MAPPING_LOAD_FROM.format(cursor=cursor),
                           want.mapping_join(min_mapping_id=cursor),
                           "another's mapping load after the commit")


# --------------------------------------------------------------------------------------------
# An empty store; DuckLake's retirement of a whole table on the fixture.


def test_writes_into_an_empty_store(server_factory):
    running = server_factory("empty-adbc", steps_file=None)
    empty = CatalogState(tables={t: [] for t in TABLES})
    assert_state(read_state_adbc(running.uri), empty, "a new server on an empty store")
    ids = Ids()
    t = ids.table()
    m = flat_mapping(ids.file(), t, 3)
    f = data_file(ids.file(), t, m.mapping_id)
    with connection(running.uri) as conn:
        stage_mapping(conn, m)
        ingest_ok(conn, DATA_FILE, [f])
        conn.commit()
    want = m.added_to(empty).with_rows(DATA_FILE, [f])
    assert_state(read_state_adbc(running.uri), want, "the first commit into an empty store")
    assert_stored(running.uri, want, "the first commit into an empty store")
    with connection(running.uri) as conn:
        check_mapping_load(conn, MAPPING_LOAD, sorted_rows(m.join_rows), "the mapping load")


def test_ducklake_drops_and_expires_a_fixture_table(server_factory, expected):
    """DuckLake's statements over its own rows: DROP TABLE 2 (end its live files), delete one
    file of table 1 (end it by id), then snapshot expiry (delete table 2's files and, as newer
    DuckLake does, its mappings, then the orphan sweep)."""
    running = server_factory("ducklake-expire")
    uri_ = running.uri
    state = expected
    assert_stored(uri_, state, "the imported fixture")
    dropped = 2
    drop_at = max(snapshots_in_fixture()) + 1
    live = [r for r in expected.rows_of_table_id(DATA_FILE, dropped) if r[3] is None]
    assert live, "table 2 has live files"
    with connection(uri_) as conn:
        assert dml(conn, END_BY_TABLE.format(snapshot=drop_at, ids=dropped)) == len(live)
        conn.commit()
    state = state.with_changes(
        DATA_FILE, lambda r: r["table_id"] == dropped and r["end_snapshot"] is None,
        end_snapshot=drop_at)
    assert_stored(uri_, state, "after DROP TABLE 2")

    t1 = expected.rows_of_table_id(DATA_FILE, 1)
    one_live = next(r[0] for r in t1 if r[3] is None)
    one_ended = next(r[0] for r in t1 if r[3] is not None)
    with connection(uri_) as conn:
        assert dml(conn, END_BY_FILE.format(snapshot=drop_at + 1,
                                            ids=in_list([one_live, one_ended]))) == 1
        conn.commit()
    state = state.with_changes(DATA_FILE, lambda r: r["data_file_id"] == one_live,
                               end_snapshot=drop_at + 1)
    assert_stored(uri_, state, "after a file of table 1 was deleted")
    with connection(uri_) as conn:
        for s in (drop_at - 1, drop_at, drop_at + 1):
            for table_id in (1, 2):
                at = query(conn, DATA_FILE_AT.format(table_id=table_id, snapshot=s))
                assert_same_rows(rows(at), state.data_files_at(table_id, s),
                                 f"files of table {table_id} at {s}")

    expired = [r[0] for r in state.rows_of_table_id(DATA_FILE, dropped)] + [one_ended]
    mappings = [r[0] for r in state.rows_of_table_id(COLUMN_MAPPING, dropped)]
    assert mappings, "table 2 has mappings"
    after = state.without_rows(DATA_FILE, lambda r: r["data_file_id"] in expired).without_rows(
        COLUMN_MAPPING, lambda r: r["table_id"] == dropped).without_rows(
        NAME_MAPPING, lambda r: r["mapping_id"] in mappings)
    with connection(uri_) as conn, connection(uri_) as other:
        assert dml(conn, DELETE_FILES.format(ids=in_list(expired))) == len(expired)
        assert dml(conn, DELETE_MAPPINGS.format(ids=dropped)) == len(mappings)
        assert dml(conn, ORPHAN_SWEEP) == 0
        check_mapping_load(conn, MAPPING_LOAD, after.mapping_join(), "own mapping load")
        check_mapping_load(other, MAPPING_LOAD, state.mapping_join(), "another's mapping load")
        conn.commit()
    assert_stored(uri_, after, "after the expiry")


# --------------------------------------------------------------------------------------------
# Transaction limits.


@pytest.fixture(scope="module")
def idle(server_factory):
    return server_factory("idle-timeout", extra_args=["--txn-idle-timeout", str(IDLE_TIMEOUT_S)])


def test_idle_transaction_expires(idle):
    before = read_state(idle.uri)
    ids = Ids()
    m = flat_mapping(ids.file(), ids.table(), 2)
    conn = connect(idle.uri)
    try:
        mark = idle.server.line_count
        stage_mapping(conn, m)
        # The server's reaper rolls it back once it has been idle past the timeout.
        assert idle.server.wait_for_line(REAPED, since=mark, timeout=REAP_WAIT_S), \
            f"no `{REAPED}` line; the server's output since:\n{idle.server.log(since=mark)}"
        with pytest.raises(flightsql.Error) as e:
            conn.commit()
        assert str(e.value).strip(), "an empty error message"
    finally:
        conn.close()
    assert_stored(idle.uri, before, "after committing an expired transaction")
    with connection(idle.uri) as conn:  # the key was not left locked
        stage_mapping(conn, m)
        conn.commit()
    assert_stored(idle.uri, m.added_to(before), "the same mapping in a new transaction")


def test_txn_max_rows(server_factory):
    limit = 10
    running = server_factory("max-rows", extra_args=["--txn-max-rows", str(limit)])
    u = running.uri
    state = read_state(u)
    ids = Ids()
    t = ids.table()
    batch = lambda n: [data_file(ids.file(), t, None) for _ in range(n)]  # noqa: E731

    full = batch(limit)
    with connection(u) as conn:
        ingest_ok(conn, DATA_FILE, full)
        conn.commit()
    state = state.with_rows(DATA_FILE, full)
    assert_stored(u, state, f"a transaction of exactly {limit} rows")

    too_many = batch(limit + 1)
    with connection(u) as conn:
        with pytest.raises(flightsql.Error) as e:
            ingest(conn, DATA_FILE, too_many)
        assert str(e.value).strip()
        conn.rollback()
    assert_stored(u, state, f"after one ingest of {limit + 1} rows")

    first, second = batch(6), batch(5)
    conn = connect(u)
    try:
        ingest_ok(conn, DATA_FILE, first)
        with pytest.raises(flightsql.Error) as e:
            ingest(conn, DATA_FILE, second)
        assert str(e.value).strip()
        try:  # either the refused statement alone is dropped, or the whole transaction
            conn.commit()
            state = state.with_rows(DATA_FILE, first)
        except flightsql.Error:
            pass
    finally:
        conn.close()
    assert_stored(u, state, "after a transaction that went over the row limit")

    again = batch(limit)
    with connection(u) as conn:
        ingest_ok(conn, DATA_FILE, again)
        conn.commit()
    assert_stored(u, state.with_rows(DATA_FILE, again), "the limit is per transaction")


def test_txn_max_bytes(server_factory):
    running = server_factory("max-bytes", extra_args=["--txn-max-bytes", str(64 << 10)])
    u = running.uri
    before = read_state(u)
    ids = Ids()
    t = ids.table()
    small = [data_file(ids.file(), t, None)]
    big = [data_file(ids.file(), t, None, path="/lake/" + "x" * 300 + f"/{i}.parquet")
           for i in range(2000)]
    assert arrow_rows(DATA_FILE, big).nbytes > 8 * (64 << 10)
    with connection(u) as conn:
        ingest_ok(conn, DATA_FILE, small)
        conn.commit()
    with connection(u) as conn:
        with pytest.raises(flightsql.Error) as e:
            ingest(conn, DATA_FILE, big)
        assert str(e.value).strip()
        conn.rollback()
    assert_stored(u, before.with_rows(DATA_FILE, small), "after an ingest over the byte limit")


def test_a_dump_of_a_later_version_imports_into_a_store_of_its_version(tmp_path):
    """`moraine import --data` of a dump whose rows are DuckLake 1.0's (it says so in
    "ducklake_version") makes a 1.0 store, served with 1.0's columns without any flag; a 0.3
    dump into that store is refused naming both versions, and leaves it as it was."""
    dump = json.loads(json.dumps(load_fixture()))
    partial = {}
    for step in dump["steps"].values():
        files = step.get(DATA_FILE, {})
        for which in ("added", "removed"):
            rows_1_0 = []
            for row in files.get(which, []):
                data_file_id = row[0]
                partial.setdefault(data_file_id, 1000 + data_file_id)
                rows_1_0.append(list(data_file_in("1.0", tuple(row),
                                                  partial_max=partial[data_file_id])))
            if which in files:
                files[which] = rows_1_0
    dump["ducklake_version"] = "1.0"
    dump_file = tmp_path / "steps-1.0.json"
    dump_file.write_text(json.dumps(dump), encoding="utf-8")
    data_dir = tmp_path / "data"
    run_import(moraine_bin(), data_dir, dump_file)

    refused = subprocess.run(
        [str(moraine_bin()), "import", "--data", str(data_dir), str(FIXTURE)],
        capture_output=True, text=True, env=_child_env(), stdin=subprocess.DEVNULL, timeout=120,
    )
    assert refused.returncode != 0, refused.stderr
    assert "DuckLake 1.0" in refused.stderr and "0.3" in refused.stderr, refused.stderr

    server = Server(moraine_bin(), data_dir, "dump-1.0")
    try:
        uri = server.wait_listening()
        with autocommit_cursor(uri) as cur:
            cur.execute("SELECT * FROM ducklake_data_file ORDER BY data_file_id")
            table = cur.fetch_arrow_table()
    finally:
        server.stop()
    assert table.column_names == data_file_names("1.0")
    assert table.num_rows > 0
    served = dict(zip(table.column("data_file_id").to_pylist(),
                      table.column("partial_max").to_pylist()))
    assert served == {i: partial[i] for i in served}, served
