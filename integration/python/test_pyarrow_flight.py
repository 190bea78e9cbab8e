"""moraine through pyarrow.flight: the plain Flight surface (path descriptors, one FlightInfo
per served table) and a few raw Flight SQL commands, against the same imported fixture."""

from __future__ import annotations

import collections
from typing import List

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from conftest import (
    CATALOG,
    COLUMN_MAPPING,
    DATA_FILE,
    NAME_MAPPING,
    SCHEMA,
    TABLES,
    describe_schema,
    expected_schema,
    sorted_rows,
)

CALL_TIMEOUT_S = 30
OPTIONS = flight.FlightCallOptions(timeout=CALL_TIMEOUT_S)


@pytest.fixture(scope="module")
def client(moraine_uri):
    c = flight.FlightClient(moraine_uri)
    c.wait_for_available(timeout=CALL_TIMEOUT_S)
    yield c
    c.close()


def rows(table: pa.Table):
    return [tuple(r.values()) for r in table.to_pylist()]


def assert_same_rows(got, want, what):
    got, want = sorted_rows(got), sorted_rows(want)
    if got != want:
        g, w = collections.Counter(got), collections.Counter(want)
        pytest.fail(
            f"{what}: {len(got)} rows, expected {len(want)}\n"
            f"  missing: {list((w - g).elements())[:20]}\n"
            f"  unexpected: {list((g - w).elements())[:20]}",
            pytrace=False,
        )


def read_endpoints(client, uri: str, info: flight.FlightInfo) -> pa.Table:
    """DoGet every endpoint in order, as pyarrow users do: from the original server when the
    endpoint has no location (or names this server), else from the named location, which must
    be on 127.0.0.1."""
    tables: List[pa.Table] = []
    for ep in info.endpoints:
        locations = [loc.uri.decode() for loc in ep.locations]
        others = [u for u in locations if u not in (uri, "arrow-flight-reuse-connection://?")]
        if not others or len(others) < len(locations):
            reader = client.do_get(ep.ticket, OPTIONS)
            tables.append(reader.read_all())
            continue
        target = others[0]
        assert "127.0.0.1" in target or "localhost" in target, f"endpoint points away: {target}"
        with flight.FlightClient(target) as other:
            tables.append(other.do_get(ep.ticket, OPTIONS).read_all())
    if not tables:
        return info.schema.empty_table()
    for t in tables[1:]:
        assert describe_schema(t.schema) == describe_schema(tables[0].schema), \
            "endpoints stream different schemas"
    return pa.concat_tables(tables)


def check_info_and_stream(info: flight.FlightInfo, stream: pa.Table, table: str, what: str):
    assert describe_schema(info.schema) == describe_schema(expected_schema(table)), \
        f"{what}: FlightInfo.schema"
    assert describe_schema(stream.schema) == describe_schema(info.schema), \
        f"{what}: the DoGet stream's schema differs from FlightInfo.schema"
    if info.total_records >= 0:
        assert info.total_records == stream.num_rows, f"{what}: total_records"


# --------------------------------------------------------------------------------------------
# Plain Flight.


def test_list_flights(client):
    infos = list(client.list_flights(options=OPTIONS))
    paths = []
    for info in infos:
        d = info.descriptor
        assert d.descriptor_type == flight.DescriptorType.PATH, f"not a path descriptor: {d}"
        paths.append([p.decode() if isinstance(p, bytes) else p for p in d.path])
    assert sorted(paths) == sorted([t] for t in TABLES)
    for info in infos:
        table = info.descriptor.path[0]
        table = table.decode() if isinstance(table, bytes) else table
        assert describe_schema(info.schema) == describe_schema(expected_schema(table)), table


@pytest.mark.parametrize("table", TABLES)
def test_whole_table(client, moraine_uri, expected, table):
    info = client.get_flight_info(flight.FlightDescriptor.for_path(table), OPTIONS)
    got = read_endpoints(client, moraine_uri, info)
    check_info_and_stream(info, got, table, table)
    assert_same_rows(rows(got), expected[table], f"all of {table}")


@pytest.mark.parametrize("table", [COLUMN_MAPPING, DATA_FILE])
@pytest.mark.parametrize("table_id", [1, 2, 99])
def test_one_table_id(client, moraine_uri, expected, table, table_id):
    info = client.get_flight_info(flight.FlightDescriptor.for_path(table, str(table_id)), OPTIONS)
    got = read_endpoints(client, moraine_uri, info)
    check_info_and_stream(info, got, table, f"{table} of table {table_id}")
    assert_same_rows(rows(got), expected.rows_of_table_id(table, table_id),
                     f"{table} of table {table_id}")


def test_name_mapping_by_table_id(client, moraine_uri, expected):
    """ducklake_name_mapping has no table_id column: a server may serve the names of that
    table's mappings, or refuse the path clearly. Either way, never other tables' rows."""
    descriptor = flight.FlightDescriptor.for_path(NAME_MAPPING, "2")
    try:
        info = client.get_flight_info(descriptor, OPTIONS)
    except pa.ArrowInvalid as e:
        assert NAME_MAPPING in str(e), f"refusal does not name the table: {e}"
        return
    got = read_endpoints(client, moraine_uri, info)
    check_info_and_stream(info, got, NAME_MAPPING, "names of table 2")
    assert_same_rows(rows(got), expected.rows_of_table_id(NAME_MAPPING, 2), "names of table 2")


@pytest.mark.parametrize("path", [(DATA_FILE, "two"), (DATA_FILE, "1", "x")])
def test_malformed_path_is_invalid(client, path):
    with pytest.raises(pa.ArrowInvalid):
        client.get_flight_info(flight.FlightDescriptor.for_path(*path), OPTIONS)


def test_data_files_of_table_2(client, moraine_uri, expected):
    info = client.get_flight_info(flight.FlightDescriptor.for_path(DATA_FILE, "2"), OPTIONS)
    got = read_endpoints(client, moraine_uri, info)
    assert got.num_rows > 0
    assert set(got.column("table_id").to_pylist()) == {2}
    assert_same_rows(rows(got), expected.rows_of_table_id(DATA_FILE, 2), "files of table 2")


def test_tickets_are_reusable_on_another_connection(client, moraine_uri, expected):
    info = client.get_flight_info(flight.FlightDescriptor.for_path(DATA_FILE, "2"), OPTIONS)
    first = read_endpoints(client, moraine_uri, info)
    with flight.FlightClient(moraine_uri) as other:
        again = read_endpoints(other, moraine_uri, info)
    assert_same_rows(rows(again), rows(first), "the same tickets read again elsewhere")
    assert_same_rows(rows(first), expected.rows_of_table_id(DATA_FILE, 2), "files of table 2")


def test_whole_table_endpoints_read_on_another_connection_once(client, moraine_uri, expected):
    """The endpoints of a whole-table read share one held snapshot, let go once each has been
    read to its end: read on any connection, then refused with a clear message."""
    info = client.get_flight_info(flight.FlightDescriptor.for_path(NAME_MAPPING), OPTIONS)
    with flight.FlightClient(moraine_uri) as other:
        got = read_endpoints(other, moraine_uri, info)
    assert_same_rows(rows(got), expected[NAME_MAPPING], "name rows")
    with pytest.raises(pa.ArrowException) as e:
        read_endpoints(client, moraine_uri, info)
    assert "no longer held" in str(e.value) and "GetFlightInfo again" in str(e.value), e.value


@pytest.fixture(scope="module")
def divided(server_factory):
    """A server whose whole-table reads divide into endpoints of 64 bytes: one table each."""
    return server_factory("divided", extra_args=["--endpoint-bytes", "64"])


@pytest.mark.parametrize("table", TABLES)
def test_parallel_endpoints_read_concurrently_union_to_the_table(divided, expected, table):
    import concurrent.futures
    import json

    with flight.FlightClient(divided.uri) as c:
        info = c.get_flight_info(flight.FlightDescriptor.for_path(table), OPTIONS)
        assert len(info.endpoints) > 1, f"{table}: one endpoint"
        ranges = [json.loads(ep.app_metadata)["tables"] for ep in info.endpoints]
        for before, after in zip(ranges, ranges[1:]):
            assert before[1] + 1 == after[0], f"disjoint and in order: {ranges}"
        assert all(not ep.locations for ep in info.endpoints), "endpoints mean this server"

        def read(ep):
            with flight.FlightClient(divided.uri) as own:
                return own.do_get(ep.ticket, OPTIONS).read_all()

        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            parts = list(pool.map(read, info.endpoints))
    got = pa.concat_tables(parts)
    check_info_and_stream(info, got, table, table)
    assert_same_rows(rows(got), expected[table], f"the endpoints of {table}")


def test_adbc_partitions_union_to_the_table(divided, expected):
    import adbc_driver_flightsql.dbapi as flightsql

    with flightsql.connect(divided.uri, autocommit=True) as conn, conn.cursor() as cur:
        partitions, schema = cur.adbc_execute_partitions(f"SELECT * FROM {NAME_MAPPING}")
        assert len(partitions) > 1, "one partition"
        tables = []
        for partition in partitions:
            cur.adbc_read_partition(partition)
            tables.append(cur.fetch_arrow_table())
        cur.execute(f"SELECT * FROM {DATA_FILE}")
        files = cur.fetch_arrow_table()
    got = pa.concat_tables(tables)
    assert describe_schema(got.schema) == describe_schema(schema)
    assert_same_rows(rows(got), expected[NAME_MAPPING], "ADBC's partitions")
    assert_same_rows(rows(files), expected[DATA_FILE], "ADBC reading every endpoint itself")


def test_unknown_path_is_a_clear_error(client):
    with pytest.raises(pa.ArrowException) as e:
        info = client.get_flight_info(flight.FlightDescriptor.for_path("no_such_table"), OPTIONS)
        for ep in info.endpoints:
            client.do_get(ep.ticket, OPTIONS).read_all()
    assert "no_such_table" in str(e.value), f"message does not name the table: {e.value!r}"


# --------------------------------------------------------------------------------------------
# Raw Flight SQL commands (hand-encoded protobuf, as any client would send them).

SQL_PKG = "type.googleapis.com/arrow.flight.protocol.sql."


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _bytes_field(number: int, value: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _varint_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def command(name: str, body: bytes = b"") -> flight.FlightDescriptor:
    """A Flight SQL command descriptor: google.protobuf.Any{type_url, value}."""
    any_msg = _bytes_field(1, (SQL_PKG + name).encode()) + _bytes_field(2, body)
    return flight.FlightDescriptor.for_command(any_msg)


def run_command(client, moraine_uri, name: str, body: bytes = b"") -> pa.Table:
    info = client.get_flight_info(command(name, body), OPTIONS)
    got = read_endpoints(client, moraine_uri, info)
    assert describe_schema(got.schema) == describe_schema(info.schema), \
        f"{name}: stream schema differs from FlightInfo.schema"
    return got


def test_get_catalogs(client, moraine_uri):
    got = run_command(client, moraine_uri, "CommandGetCatalogs")
    assert CATALOG in got.column("catalog_name").to_pylist()


def test_get_db_schemas(client, moraine_uri):
    got = run_command(client, moraine_uri, "CommandGetDbSchemas", _bytes_field(1, CATALOG.encode()))
    pairs = set(zip(got.column("catalog_name").to_pylist(), got.column("db_schema_name").to_pylist()))
    assert (CATALOG, SCHEMA) in pairs


def test_get_tables_with_schema(client, moraine_uri):
    body = _bytes_field(1, CATALOG.encode()) + _varint_field(5, 1)  # include_schema = true
    got = run_command(client, moraine_uri, "CommandGetTables", body).to_pylist()
    tables = {r["table_name"]: r for r in got
              if r["catalog_name"] == CATALOG and r["db_schema_name"] == SCHEMA}
    assert sorted(tables) == sorted(TABLES)
    for name, r in tables.items():
        schema = pa.ipc.read_schema(pa.py_buffer(r["table_schema"]))
        assert describe_schema(schema) == describe_schema(expected_schema(name)), name


def test_get_xdbc_type_info(client, moraine_uri):
    got = run_command(client, moraine_uri, "CommandGetXdbcTypeInfo")
    assert got.num_rows > 0
    assert all(got.column("type_name").to_pylist())


def test_unknown_command_is_unimplemented(client):
    with pytest.raises(pa.ArrowNotImplementedError):
        client.get_flight_info(command("CommandMoraineNoSuchThing"), OPTIONS)


def test_unknown_action_is_unimplemented(client):
    with pytest.raises(pa.ArrowNotImplementedError):
        list(client.do_action(flight.Action("moraine.no-such-action", b""), OPTIONS))


@pytest.mark.parametrize("table", TABLES)
def test_get_schema_of_path(client, table):
    got = client.get_schema(flight.FlightDescriptor.for_path(table), OPTIONS).schema
    assert describe_schema(got) == describe_schema(expected_schema(table))
