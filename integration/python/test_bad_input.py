"""The bad-input battery: well over 60 malformed, hostile or impossible requests through
every surface (SQL over ADBC, Flight SQL commands, actions and uploads over pyarrow.flight,
plain-Flight streams, ADBC ingest). Each must get its expected gRPC status and a message
naming what was wrong, the server must stay up, and the store must be byte-identical
afterwards: every file of the data directory hashes the same as before the battery.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Sequence

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from conftest import (
    COLUMNS,
    DATA_FILE,
    NAME_MAPPING,
    Ids,
    arrow_rows,
    autocommit_cursor,
    data_file,
)
from test_pyarrow_flight import OPTIONS, SQL_PKG, _bytes_field, _varint_field, command
from test_writes_pyarrow import (
    MAPPING_PATH,
    committed,
    file_batches,
    mapping_batches,
    put,
    stream_schema,
)

# gRPC status names as the two clients spell them: ADBC quotes Go's names, pyarrow the
# upper-case ones (or its own words for a few).
CODES = {
    "INVALID_ARGUMENT": ["InvalidArgument", "INVALID_ARGUMENT", "invalid argument"],
    "NOT_FOUND": ["NotFound", "NOT_FOUND", "not found error"],
    "ALREADY_EXISTS": ["AlreadyExists", "ALREADY_EXISTS", "already exists error"],
    "FAILED_PRECONDITION": ["FailedPrecondition", "FAILED_PRECONDITION", "precondition failed"],
    "RESOURCE_EXHAUSTED": ["ResourceExhausted", "RESOURCE_EXHAUSTED", "resource exhausted"],
    "UNIMPLEMENTED": ["Unimplemented", "UNIMPLEMENTED", "unimplemented", "not supported"],
}


@dataclass
class Case:
    name: str
    run: Callable[["Ctx"], None]
    code: str
    words: Sequence[str]


@dataclass
class Ctx:
    uri: str
    client: flight.FlightClient
    ids: Ids


def sql(text: str, code: str, *words: str, params=None) -> Case:
    def run(ctx: Ctx) -> None:
        with autocommit_cursor(ctx.uri) as cur:
            cur.execute(text, params)
            cur.fetch_arrow_table()
    return Case(f"sql: {text[:60]}", run, code, words)


def info(descriptor_of: Callable[[Ctx], flight.FlightDescriptor], name: str, code: str,
         *words: str) -> Case:
    def run(ctx: Ctx) -> None:
        got = ctx.client.get_flight_info(descriptor_of(ctx), OPTIONS)
        for endpoint in got.endpoints:
            ctx.client.do_get(endpoint.ticket, OPTIONS).read_all()
    return Case(f"flight info: {name}", run, code, words)


def ticket(raw: bytes, name: str, code: str, *words: str) -> Case:
    def run(ctx: Ctx) -> None:
        ctx.client.do_get(flight.Ticket(raw), OPTIONS).read_all()
    return Case(f"ticket: {name}", run, code, words)


def action(kind: str, body: bytes, name: str, code: str, *words: str,
           type_url: str = "") -> Case:
    def run(ctx: Ctx) -> None:
        url = type_url or f"{SQL_PKG}Action{kind}Request"
        any_msg = _bytes_field(1, url.encode()) + _bytes_field(2, body)
        list(ctx.client.do_action(flight.Action(kind, any_msg), OPTIONS))
    return Case(f"action: {name}", run, code, words)


def stream(path: str, messages_of: Callable[[Ctx], list], name: str, code: str, *words: str,
           schema: pa.Schema = None) -> Case:
    def run(ctx: Ctx) -> None:
        put(ctx.client, path, messages_of(ctx), schema)
    return Case(f"stream: {name}", run, code, words)


def ingest(table: str, data_of: Callable[[Ctx], pa.Table], name: str, code: str, *words: str,
           mode: str = "append", temporary: bool = False) -> Case:
    def run(ctx: Ctx) -> None:
        with autocommit_cursor(ctx.uri) as cur:
            cur.adbc_ingest(table, data_of(ctx), mode=mode, temporary=temporary)
    return Case(f"ingest: {name}", run, code, words)


def statement_update(text: str, txn: bytes, name: str, code: str, *words: str) -> Case:
    """A CommandStatementUpdate through DoPut, as the Rust client sends it."""
    def run(ctx: Ctx) -> None:
        body = _bytes_field(1, text.encode()) + (_bytes_field(2, txn) if txn else b"")
        descriptor = command("CommandStatementUpdate", body)
        writer, reader = ctx.client.do_put(descriptor, pa.schema([]), OPTIONS)
        writer.done_writing()
        reader.read()
        writer.close()
    return Case(f"update: {name}", run, code, words)


def mapping_stream(names_of: Callable[[Ctx], list], name: str, code: str, *words: str) -> Case:
    def messages(ctx: Ctx) -> list:
        return committed(mapping_batches(names_of(ctx)))
    return stream(MAPPING_PATH, messages, name, code, *words)


def file_stream(files_of: Callable[[Ctx], list], name: str, code: str, *words: str) -> Case:
    return stream(DATA_FILE, lambda ctx: committed(file_batches(files_of(ctx))), name, code,
                  *words)


# A mapping and a data file the imported fixture holds.
FIXTURE_MAPPING = (0, 1)  # (mapping_id, table_id)
FIXTURE_FILE = 4  # live, in table 1


def bad_tree(ctx: Ctx, names) -> list:
    from conftest import Mapping
    return [Mapping(ctx.ids.file(), ctx.ids.table(), names)]


def cases() -> List[Case]:
    long_sql = "SELECT 1 -- " + "x" * (4 << 20)
    deep = "SELECT " + "+".join(["1"] * 2000)
    huge_id = b"t" * (1 << 20)
    return [
        # --- SQL that does not parse, plan or run -------------------------------------------
        sql("SELEC 1", "INVALID_ARGUMENT", "SELEC"),
        sql("SELECT * FROM no_such_table", "INVALID_ARGUMENT", "no_such_table"),
        sql("SELECT no_such_column FROM ducklake_data_file", "INVALID_ARGUMENT",
            "no_such_column"),
        sql("SELECT 1 / 0", "INVALID_ARGUMENT", "Divide by zero"),
        sql("SELECT CAST('x' AS INT)", "INVALID_ARGUMENT", "'x'"),
        sql("SELECT no_such_function(1)", "INVALID_ARGUMENT", "no_such_function"),
        sql("SELECT * FROM ducklake_data_file LIMIT -1", "INVALID_ARGUMENT", "LIMIT"),
        sql("SELECT 1; SELECT 2", "INVALID_ARGUMENT", "2 statements"),
        sql(long_sql, "INVALID_ARGUMENT", "4194304 bytes"),
        sql(deep, "INVALID_ARGUMENT", "256 tokens"),
        sql("SELECT " + "(" * 300 + "1" + ")" * 300, "INVALID_ARGUMENT", "256 tokens"),
        sql("SELECT repeat('x', 300000000)", "RESOURCE_EXHAUSTED", "repeat", "67108864"),
        sql("SELECT lpad('x', 200000000)", "RESOURCE_EXHAUSTED", "lpad"),
        sql("SELECT range(1, 1000000000)", "RESOURCE_EXHAUSTED", "range"),
        sql("SELECT array_repeat('x', 100000000)", "RESOURCE_EXHAUSTED", "array_repeat"),
        sql("SELECT range(DATE '2000-01-01', DATE '3000-01-01', INTERVAL '1 day')",
            "INVALID_ARGUMENT", "integer"),
        sql("SELECT ?", "INVALID_ARGUMENT", "parameter", params=(1, 2)),
        # --- statements the surface does not take -------------------------------------------
        sql("CREATE TABLE t (a INT)", "INVALID_ARGUMENT", "DDL"),
        sql("DROP TABLE ducklake_data_file", "INVALID_ARGUMENT", "DDL"),
        sql("CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '/etc/passwd'", "INVALID_ARGUMENT",
            "read-only"),
        sql("COPY ducklake_data_file TO '/tmp/out.csv'", "INVALID_ARGUMENT", "read-only"),
        sql("SET datafusion.execution.batch_size = 0", "INVALID_ARGUMENT", "Statement"),
        sql("UPDATE ducklake_column_mapping SET type = 'x'", "INVALID_ARGUMENT",
            "ducklake_column_mapping"),
        sql("UPDATE ducklake_name_mapping SET source_name = 'x'", "INVALID_ARGUMENT",
            "ducklake_name_mapping"),
        sql("UPDATE ducklake_data_file SET path = 'x'", "INVALID_ARGUMENT", "path"),
        sql(f"UPDATE ducklake_data_file SET end_snapshot = NULL WHERE data_file_id = "
            f"{FIXTURE_FILE}", "INVALID_ARGUMENT", str(FIXTURE_FILE)),
        sql("UPDATE ducklake_data_file SET end_snapshot = 5 FROM ducklake_column_mapping",
            "UNIMPLEMENTED", "FROM"),
        sql("DELETE FROM ducklake_data_file USING ducklake_column_mapping", "UNIMPLEMENTED",
            "USING"),
        sql("DELETE FROM no_such_table", "NOT_FOUND", "no_such_table"),
        sql(f"DELETE FROM ducklake_name_mapping WHERE mapping_id = {FIXTURE_MAPPING[0]}",
            "INVALID_ARGUMENT", str(FIXTURE_MAPPING[0])),
        # --- INSERT statements that break the rules -----------------------------------------
        sql("INSERT INTO ducklake_column_mapping VALUES (1, 2)", "INVALID_ARGUMENT",
            "ducklake_column_mapping"),
        sql("INSERT INTO ducklake_column_mapping VALUES ('x', 1, 'map_by_name')",
            "INVALID_ARGUMENT", "mapping_id", "BIGINT"),
        sql("INSERT INTO ducklake_column_mapping VALUES (NULL, 1, 'map_by_name')",
            "INVALID_ARGUMENT", "mapping_id"),
        sql(f"INSERT INTO ducklake_column_mapping VALUES ({FIXTURE_MAPPING[0]}, "
            f"{FIXTURE_MAPPING[1]}, 'map_by_name')", "ALREADY_EXISTS",
            str(FIXTURE_MAPPING[0])),
        sql("INSERT INTO ducklake_column_mapping VALUES (7999001, 1, 'map_by_name')",
            "INVALID_ARGUMENT", "7999001"),
        sql("INSERT INTO ducklake_name_mapping VALUES (7999002, 0, 'a', 1, NULL, false)",
            "INVALID_ARGUMENT", "7999002"),
        sql("INSERT INTO ducklake_data_file (data_file_id, table_id) VALUES (NULL, 1)",
            "INVALID_ARGUMENT", "data_file_id"),
        sql("INSERT INTO ducklake_data_file (no_such_column) VALUES (1)", "INVALID_ARGUMENT",
            "no_such_column"),
        sql("INSERT INTO ducklake_data_file (data_file_id, table_id) "
            "SELECT value, 1 FROM generate_series(1, 3000000)", "RESOURCE_EXHAUSTED",
            "--txn-max-rows"),
        # --- Flight SQL commands and tickets ------------------------------------------------
        info(lambda ctx: flight.FlightDescriptor.for_path("no_such_table"), "unknown path",
             "NOT_FOUND", "no_such_table"),
        info(lambda ctx: flight.FlightDescriptor.for_path(DATA_FILE, "x"), "table id not a number",
             "INVALID_ARGUMENT", "x"),
        info(lambda ctx: flight.FlightDescriptor.for_path("t" * 100_000), "100 kB path",
             "NOT_FOUND", "100000 bytes"),
        info(lambda ctx: flight.FlightDescriptor.for_command(b"\xff\xfe garbage"),
             "command that is no protobuf", "INVALID_ARGUMENT", "decode"),
        info(lambda ctx: command("CommandNoSuchThing"), "unknown command", "UNIMPLEMENTED",
             "CommandNoSuchThing"),
        info(lambda ctx: command("CommandStatementQuery", _bytes_field(1, b"SELEC 1")),
             "statement query that does not parse", "INVALID_ARGUMENT", "SELEC"),
        info(lambda ctx: command("CommandStatementQuery",
                                 _bytes_field(1, b"SELECT 1") + _bytes_field(2, huge_id)),
             "query in a 1 MB transaction id", "FAILED_PRECONDITION", "1048576 bytes"),
        info(lambda ctx: command("CommandPreparedStatementQuery", _bytes_field(1, b"nope")),
             "unknown prepared statement", "NOT_FOUND", "nope"),
        info(lambda ctx: command("CommandGetTables", _bytes_field(1, b"\xff" * 3)),
             "metadata command with a bad string", "INVALID_ARGUMENT", "UTF-8"),
        ticket(b"", "empty ticket", "INVALID_ARGUMENT", "ticket"),
        ticket(b"\x00\x01not a ticket", "garbage ticket", "INVALID_ARGUMENT", "ticket"),
        ticket(b'{"Table":{"table":"no_such_table"}}', "ticket of an unknown table",
               "INVALID_ARGUMENT", "ticket"),
        # --- actions --------------------------------------------------------------------------
        action("NoSuchAction", b"", "unknown action", "UNIMPLEMENTED", "NoSuchAction",
               type_url="type.googleapis.com/x.NoSuchAction"),
        action("EndTransaction", _bytes_field(1, b"feedface") + _varint_field(2, 1),
               "commit of an unknown transaction", "FAILED_PRECONDITION", "feedface"),
        action("EndTransaction", _bytes_field(1, huge_id) + _varint_field(2, 2),
               "rollback of a 1 MB transaction id", "FAILED_PRECONDITION", "1048576 bytes"),
        action("EndTransaction", _bytes_field(1, b"feedface") + _varint_field(2, 9),
               "an end that is neither commit nor rollback", "INVALID_ARGUMENT", "9"),
        action("CreatePreparedStatement", _bytes_field(1, b"SELEC 1"),
               "prepare SQL that does not parse", "INVALID_ARGUMENT", "SELEC"),
        action("CreatePreparedStatement", _bytes_field(1, b"CREATE TABLE t (a INT)"),
               "prepare DDL", "INVALID_ARGUMENT", "DDL"),
        action("BeginTransaction", b"\xff\xff\xff", "begin with a body that is no protobuf",
               "INVALID_ARGUMENT", "decode"),
        # --- updates through DoPut ---------------------------------------------------------
        statement_update("DELETE FROM ducklake_data_file", b"feedface",
                         "update in an unknown transaction", "FAILED_PRECONDITION", "feedface"),
        statement_update("SELECT 1", b"", "a query sent as an update", "INVALID_ARGUMENT",
                         "not an INSERT"),
        # --- plain-Flight streams ------------------------------------------------------------
        stream("no_such_path", lambda ctx: committed([]), "upload to an unknown path",
               "NOT_FOUND", "no_such_path", schema=pa.schema([pa.field("a", pa.int64())])),
        stream(DATA_FILE, lambda ctx: [(b, None) for b in file_batches(
            [data_file(ctx.ids.file(), ctx.ids.table(), None)])],
            "file stream without its commit marker", "FAILED_PRECONDITION", "commit"),
        stream(DATA_FILE, lambda ctx: committed([pa.record_batch(
            [pa.array([ctx.ids.file()], pa.int64())], names=["data_file_id"])]),
            "file stream missing columns", "INVALID_ARGUMENT", "table_id",
            schema=pa.schema([pa.field("data_file_id", pa.int64())])),
        stream(DATA_FILE, lambda ctx: committed([pa.record_batch(
            [pa.array(["x"]) for _ in COLUMNS[DATA_FILE]],
            names=[n for n, _ in COLUMNS[DATA_FILE]])]),
            "file stream of strings", "INVALID_ARGUMENT", "data_file_id",
            schema=pa.schema([pa.field(n, pa.string()) for n, _ in COLUMNS[DATA_FILE]])),
        file_stream(lambda ctx: [(None,) + data_file(1, ctx.ids.table(), None)[1:]],
                    "file without data_file_id", "INVALID_ARGUMENT", "data_file_id"),
        file_stream(lambda ctx: [data_file(FIXTURE_FILE, 1, None)], "stored data_file_id",
                    "ALREADY_EXISTS", str(FIXTURE_FILE)),
        file_stream(lambda ctx: [data_file(FIXTURE_FILE, 424242, None)],
                    "stored data_file_id in another table", "ALREADY_EXISTS",
                    str(FIXTURE_FILE)),
        file_stream(lambda ctx: [data_file(7999100, ctx.ids.table(), None)] * 2,
                    "one data_file_id twice", "INVALID_ARGUMENT", "7999100"),
        file_stream(lambda ctx: [data_file(ctx.ids.file(), ctx.ids.table(), 7999101)],
                    "file of a mapping that does not exist", "INVALID_ARGUMENT", "7999101"),
        file_stream(lambda ctx: [data_file(ctx.ids.file(), 2, FIXTURE_MAPPING[0])],
                    "file of another table's mapping", "INVALID_ARGUMENT",
                    str(FIXTURE_MAPPING[0])),
        mapping_stream(lambda ctx: bad_tree(ctx, [(0, "a", 1, None, False),
                                                  (0, "b", 2, None, False)]),
                       "mapping with one column_id twice", "INVALID_ARGUMENT", "column_id"),
        mapping_stream(lambda ctx: bad_tree(ctx, [(0, "a", 1, 1, False),
                                                  (1, "b", 2, None, False)]),
                       "child before its parent", "INVALID_ARGUMENT", "parent"),
        mapping_stream(lambda ctx: bad_tree(ctx, [(0, None, 1, None, False)]),
                       "name row without source_name", "INVALID_ARGUMENT", "source_name"),
        mapping_stream(lambda ctx: bad_tree(ctx, [(0, "a", 1, 7, False)]),
                       "parent that is none of the mapping's columns", "INVALID_ARGUMENT",
                       "parent"),
        # --- ADBC ingest ---------------------------------------------------------------------
        ingest("no_such_table", lambda ctx: pa.table({"a": [1]}), "into an unknown table",
               "NOT_FOUND", "no_such_table"),
        ingest(DATA_FILE, lambda ctx: arrow_rows(DATA_FILE, [data_file(ctx.ids.file(), 1,
                                                                        None)]),
               "into a temporary table", "INVALID_ARGUMENT", "temporary", temporary=True),
        ingest(DATA_FILE, lambda ctx: arrow_rows(DATA_FILE, [data_file(ctx.ids.file(), 1,
                                                                        None)]),
               "creating a catalog table", "ALREADY_EXISTS", DATA_FILE, mode="create"),
        ingest(DATA_FILE, lambda ctx: arrow_rows(DATA_FILE, [data_file(ctx.ids.file(), 1,
                                                                        None)]),
               "replacing a catalog table", "UNIMPLEMENTED", "replacing", mode="replace"),
        ingest(DATA_FILE, lambda ctx: pa.table({"data_file_id": ["x"]}),
               "missing and mistyped columns", "INVALID_ARGUMENT", "data_file_id"),
        ingest(NAME_MAPPING, lambda ctx: arrow_rows(NAME_MAPPING,
                                                    [(7999200, 0, "a", 1, None, False)]),
               "name rows of no mapping", "INVALID_ARGUMENT", "7999200"),
    ]


def data_dir_hashes(path: Path) -> Dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def code_of(msg: str) -> str:
    for code, spellings in CODES.items():
        if any(s in msg for s in spellings):
            return code
    return "?"


def test_bad_input_battery(server_factory):
    running = server_factory("bad-input", extra_args=["--txn-max-rows", "100000"])
    battery = cases()
    assert len(battery) >= 60, len(battery)
    before = data_dir_hashes(running.server.data_dir)
    failures = []
    with flight.FlightClient(running.uri) as client:
        ctx = Ctx(running.uri, client, Ids())
        for case in battery:
            try:
                case.run(ctx)
                failures.append(f"{case.name}: accepted")
                continue
            except (flightsql.Error, pa.ArrowException, flight.FlightError) as err:
                msg = str(err)
            code = code_of(msg)
            if code != case.code:
                failures.append(f"{case.name}: {code}, expected {case.code}: {msg[:300]}")
            missing = [w for w in case.words if w.lower() not in msg.lower()]
            if missing:
                failures.append(f"{case.name}: does not say {missing}: {msg[:300]}")
            if len(msg) > 8192:
                failures.append(f"{case.name}: a message of {len(msg)} bytes")
            # The server goes on.
            with autocommit_cursor(running.uri) as cur:
                cur.execute("SELECT count(*) FROM ducklake_data_file")
                assert cur.fetchone()[0] > 0
    assert not failures, "\n".join(failures)
    assert data_dir_hashes(running.server.data_dir) == before, "the store changed"
