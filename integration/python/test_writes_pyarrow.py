"""moraine's write surface for plain Flight clients (pyarrow.flight): one-stream DoPut.

`do_put(FlightDescriptor.for_path("ducklake_mapping"), schema)` sends mappings in the shape
of DuckLake's mapping load (one row per name row; the column-mapping row is derived per
mapping_id); `for_path("ducklake_data_file")` sends data-file rows. A stream is one atomic
batch, committed only if its LAST message carries app_metadata b"commit"; the reply is a
PutResult whose app_metadata is JSON {"committed": true, "rows": N, "mappings": M,
"data_files": K}. Also here: the SqlInfo values that make ADBC open transactions.

Expected states are computed from the state read before each write plus the rows written
(conftest's CatalogState helpers); reads go through DoGet.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Sequence, Tuple

import pyarrow as pa
import pyarrow.flight as flight
import pytest

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
    _child_env,
    arrow_rows,
    data_file,
    data_file_in,
    data_file_names,
    diff_states,
    flat_mapping,
    load_fixture,
    mapping_like,
    mentions_id,
    moraine_bin,
    sorted_rows,
    state_from_tables,
    Server,
    _fixture_rows,
)
from test_pyarrow_flight import OPTIONS, _bytes_field, _varint, read_endpoints, run_command

MAPPING_PATH = "ducklake_mapping"
COMMIT = b"commit"

_TYPES = dict(COLUMNS[COLUMN_MAPPING] + COLUMNS[NAME_MAPPING])
JOIN_COLUMNS = ["mapping_id", "table_id", "type", "column_id", "source_name",
                "target_field_id", "parent_column", "is_partition"]
MAPPING_STREAM_COLUMNS = [(c, _TYPES[c]) for c in JOIN_COLUMNS]

SUBPROCESS_TIMEOUT_S = 60

# SqlInfo ids (Flight SQL's SqlInfo enum).
SQL_INFO_TRANSACTION = 8  # FLIGHT_SQL_SERVER_TRANSACTION: 0 none, 1 transactions, 2 savepoints
SQL_INFO_TRANSACTION_TIMEOUT = 101  # FLIGHT_SQL_SERVER_TRANSACTION_TIMEOUT, in milliseconds
DEFAULT_IDLE_TIMEOUT_S = 300


# --------------------------------------------------------------------------------------------
# Helpers.


@pytest.fixture(scope="module")
def lake(server_factory):
    """The module's server, on an empty store."""
    return server_factory("writes-flight", steps_file=None)


@pytest.fixture(scope="module")
def ids() -> Ids:
    return Ids()


@pytest.fixture(scope="module")
def client(lake):
    c = flight.FlightClient(lake.uri)
    c.wait_for_available(timeout=30)
    yield c
    c.close()


def read_committed(uri: str) -> CatalogState:
    """The three tables as committed: DoGet of each table's path, the three in parallel."""
    with flight.FlightClient(uri) as c:
        def one(table: str) -> pa.Table:
            info = c.get_flight_info(flight.FlightDescriptor.for_path(table), OPTIONS)
            return read_endpoints(c, uri, info)

        with ThreadPoolExecutor(len(TABLES)) as pool:
            return state_from_tables(dict(zip(TABLES, pool.map(one, TABLES))))


def assert_stored(uri: str, want: CatalogState, what: str) -> None:
    diff = diff_states(read_committed(uri), want)
    if diff:
        pytest.fail(f"{what}:\n{diff}", pytrace=False)


def mapping_batches(mappings: Sequence[Mapping], rows_per_batch: int = 7) -> List[pa.RecordBatch]:
    """The mappings' rows in the mapping-load shape, cut into batches of `rows_per_batch`
    (so a mapping's rows may span batches)."""
    rows = [r for m in mappings for r in m.join_rows]
    table = arrow_rows(NAME_MAPPING, rows, MAPPING_STREAM_COLUMNS)
    return table.to_batches(max_chunksize=rows_per_batch)


def file_batches(files: Sequence[tuple], rows_per_batch: int = 5) -> List[pa.RecordBatch]:
    return arrow_rows(DATA_FILE, files).to_batches(max_chunksize=rows_per_batch)


def stream_schema(path: str) -> pa.Schema:
    cols = MAPPING_STREAM_COLUMNS if path == MAPPING_PATH else COLUMNS[DATA_FILE]
    return pa.schema([pa.field(n, t) for n, t in cols])


Message = Tuple[Optional[pa.RecordBatch], Optional[bytes]]


def committed(batches: Sequence[pa.RecordBatch], marker_alone: bool = True) -> List[Message]:
    """The batches, then the commit marker: as a metadata-only last message, or on the last
    batch."""
    if marker_alone or not batches:
        return [(b, None) for b in batches] + [(None, COMMIT)]
    return [(b, None) for b in batches[:-1]] + [(batches[-1], COMMIT)]


def put(client, path: str, messages: Sequence[Message],
        schema: Optional[pa.Schema] = None,
        options: Optional[flight.FlightCallOptions] = None) -> Optional[dict]:
    """One DoPut stream of `messages` (batch, app_metadata), with `options` (OPTIONS if None:
    another caller's headers, say); returns the reply's JSON (None if the server sent no
    PutResult). The call's error, if any, is raised: from reader.read() or, when a write
    already failed, from writer.close(), which carries the server's status."""
    schema = schema if schema is not None else stream_schema(path)
    options = options if options is not None else OPTIONS
    writer, reader = client.do_put(flight.FlightDescriptor.for_path(path), schema, options)
    try:
        for batch, meta in messages:
            if batch is None:
                writer.write_metadata(meta)
            elif meta is None:
                writer.write_batch(batch)
            else:
                writer.write_with_metadata(batch, meta)
    except pa.ArrowException as first:
        closing_raises(writer, first)
    buf = finish_put(writer, reader)
    return None if buf is None else json.loads(buf.to_pybytes())


def closing_raises(writer, first: BaseException) -> None:
    """Closes a DoPut `writer` whose call failed with `first` and raises the call's error:
    the server's status, which close() carries, or `first` if close() has none."""
    try:
        writer.close()
    except pa.ArrowException as status:
        raise status from first
    raise first


def finish_put(writer, reader) -> Optional[pa.Buffer]:
    """Half-closes a DoPut, reads its one reply (None if the server sent none) and closes
    it; the call's error is raised as `closing_raises` tells it."""
    try:
        writer.done_writing()
        buf = reader.read()
    except pa.ArrowException as first:
        closing_raises(writer, first)
    writer.close()
    return buf


def check_reply(reply: Optional[dict], *, rows: int, mappings: int, data_files: int,
                what: str) -> None:
    assert reply is not None, f"{what}: no PutResult"
    want = {"committed": True, "rows": rows, "mappings": mappings, "data_files": data_files}
    got = {k: reply.get(k) for k in want}
    assert got == want, f"{what}: reply {reply}, expected {want}"


def check_refusal(err: BaseException, code: str, *, ids: Sequence[int] = (),
                  words: Sequence[str] = (), what: str = "") -> None:
    """The call failed with gRPC status `code` (pyarrow's message quotes it, e.g.
    "gRPC client debug context: INVALID_ARGUMENT:..."), naming every id and word."""
    msg = str(err)
    assert code in msg, f"{what}: not a {code} error: {msg}"
    for i in ids:
        assert mentions_id(msg, i), f"{what}: the error does not name {i}: {msg}"
    for w in words:
        assert w.lower() in msg.lower(), f"{what}: the error does not say {w!r}: {msg}"


# --------------------------------------------------------------------------------------------
# SqlInfo.


def sql_info(client, uri: str, infos: Sequence[int]) -> Dict[int, object]:
    body = _bytes_field(1, b"".join(_varint(i) for i in infos))  # packed repeated uint32
    got = run_command(client, uri, "CommandGetSqlInfo", body)
    return dict(zip(got.column("info_name").to_pylist(), got.column("value").to_pylist()))


@pytest.mark.parametrize("idle_timeout_s", [None, 7])
def test_sql_info_advertises_transactions(server_factory, client, lake, idle_timeout_s):
    if idle_timeout_s is None:
        c, uri, seconds = client, lake.uri, DEFAULT_IDLE_TIMEOUT_S
        info = sql_info(c, uri, [SQL_INFO_TRANSACTION, SQL_INFO_TRANSACTION_TIMEOUT])
    else:
        running = server_factory("sqlinfo-timeout", steps_file=None,
                                 extra_args=["--txn-idle-timeout", str(idle_timeout_s)])
        seconds = idle_timeout_s
        with flight.FlightClient(running.uri) as c:
            info = sql_info(c, running.uri, [SQL_INFO_TRANSACTION, SQL_INFO_TRANSACTION_TIMEOUT])
    assert info.get(SQL_INFO_TRANSACTION) == 1, f"SqlInfo 8 (transactions): {info}"
    assert info.get(SQL_INFO_TRANSACTION_TIMEOUT) == seconds * 1000, \
        f"SqlInfo 101 (transaction timeout, ms) for an idle timeout of {seconds} s: {info}"


def test_handshake_issues_a_bearer_token_per_session(lake):
    """ADBC binds its untagged ingest to its transaction through this token, so every
    Handshake must get a token of its own."""
    tokens = []
    for _ in range(3):
        with flight.FlightClient(lake.uri) as c:
            key, value = c.authenticate_basic_token("moraine", "unused", OPTIONS)
            assert key.lower() == b"authorization", f"the token arrives as {key!r}"
            assert value.startswith(b"Bearer ") and value[len(b"Bearer "):].strip(), value
            tokens.append(value)
            # The token is accepted on later calls.
            auth = flight.FlightCallOptions(timeout=30, headers=[(key, value)])
            c.get_flight_info(flight.FlightDescriptor.for_path(COLUMN_MAPPING), auth)
    assert len(set(tokens)) == len(tokens), f"sessions share tokens: {tokens}"


# --------------------------------------------------------------------------------------------
# Streams that commit.


@pytest.mark.parametrize("marker_alone", [True, False], ids=["marker-message", "marker-on-batch"])
def test_mapping_stream_commits(client, lake, ids, expected, marker_alone):
    before = read_committed(lake.uri)
    t = ids.table()
    mappings = [mapping_like(expected, 0, ids.file(), t), flat_mapping(ids.file(), t, 4),
                mapping_like(expected, 5, ids.file(), t)]
    batches = mapping_batches(mappings)
    assert len(batches) > len(mappings), "mappings span several batches"
    reply = put(client, MAPPING_PATH, committed(batches, marker_alone))
    rows = sum(len(m.names) for m in mappings)
    check_reply(reply, rows=rows, mappings=len(mappings), data_files=0, what="mapping stream")
    want = before
    for m in mappings:
        want = m.added_to(want)
    assert_stored(lake.uri, want, "after the mapping stream")


@pytest.mark.parametrize("marker_alone", [True, False], ids=["marker-message", "marker-on-batch"])
def test_data_file_stream_commits(client, lake, ids, marker_alone):
    t = ids.table()
    m = flat_mapping(ids.file(), t, 2)
    check_reply(put(client, MAPPING_PATH, committed(mapping_batches([m]))),
                rows=2, mappings=1, data_files=0, what="the mapping first")
    before = read_committed(lake.uri)
    files = [data_file(ids.file(), t, m.mapping_id if i % 3 else None) for i in range(12)]
    files.append(data_file(ids.file(), t, None, begin_snapshot=1, end_snapshot=3))
    reply = put(client, DATA_FILE, committed(file_batches(files), marker_alone))
    check_reply(reply, rows=len(files), mappings=0, data_files=len(files),
                what="data-file stream")
    assert_stored(lake.uri, before.with_rows(DATA_FILE, files),
                  "after the data-file stream")


def test_streams_replay_the_fixture_into_an_empty_store(server_factory, expected):
    """DuckLake's commits of the fixture, each as a mapping stream (its new mappings), then
    every data file in one stream: the store ends exactly as `moraine import` leaves it."""
    running = server_factory("replay-flight", steps_file=None)
    with flight.FlightClient(running.uri) as c:
        assert_stored(running.uri, CatalogState(tables={t: [] for t in TABLES}), "empty")
        streams = 0
        for name, step in load_fixture()["steps"].items():
            maps = _fixture_rows(step, COLUMN_MAPPING, "added")
            names = _fixture_rows(step, NAME_MAPPING, "added")
            if not maps:
                assert not names, f"{name}: name rows without mappings"
                continue
            mappings = [Mapping(m[0], m[1], [n[1:] for n in names if n[0] == m[0]], m[2])
                        for m in maps]
            reply = put(c, MAPPING_PATH, committed(mapping_batches(mappings)))
            check_reply(reply, rows=len(names), mappings=len(maps), data_files=0, what=name)
            streams += 1
        assert streams == len(expected[COLUMN_MAPPING]), "one stream per mapping commit"
        files = expected[DATA_FILE]
        reply = put(c, DATA_FILE, committed(file_batches(files, rows_per_batch=4)))
        check_reply(reply, rows=len(files), mappings=0, data_files=len(files),
                    what="all data files")
        assert_stored(running.uri, expected, "the fixture replayed through DoPut")


# --------------------------------------------------------------------------------------------
# Streams that must commit nothing.


def _no_marker(batches):
    return [(b, None) for b in batches]


def _zero_batches(batches):
    return []


def _marker_not_last(batches):
    return [(batches[0], COMMIT)] + [(b, None) for b in batches[1:]]


def _marker_then_batch(batches):
    return [(b, None) for b in batches[:-1]] + [(None, COMMIT), (batches[-1], None)]


def _other_marker(batches):
    return [(b, None) for b in batches] + [(None, b"done")]


UNCOMMITTED = {
    "no-marker": _no_marker,
    "schema-only": _zero_batches,
    "marker-not-last": _marker_not_last,
    "marker-then-batch": _marker_then_batch,
    "other-marker": _other_marker,
}


@pytest.mark.parametrize("shape", list(UNCOMMITTED))
def test_stream_without_a_final_commit_marker_commits_nothing(client, lake, ids, shape):
    before = read_committed(lake.uri)
    t = ids.table()
    mappings = [flat_mapping(ids.file(), t, 3), flat_mapping(ids.file(), t, 2)]
    batches = mapping_batches(mappings, rows_per_batch=2)
    assert len(batches) >= 3
    with pytest.raises(pa.ArrowException) as e:
        put(client, MAPPING_PATH, UNCOMMITTED[shape](batches))
    check_refusal(e.value, "FAILED_PRECONDITION", words=["commit"], what=shape)
    if shape in ("no-marker", "schema-only"):
        msg = str(e.value).lower()
        assert "marker" in msg or "missing" in msg, f"{shape}: {e.value}"
    assert_stored(lake.uri, before, f"after a stream shaped {shape}")
    # Nothing was half-written or left locked: the same mappings commit now.
    check_reply(put(client, MAPPING_PATH, committed(batches)), rows=5, mappings=2,
                data_files=0, what=f"the same mappings after {shape}")


CUT_OFF_CLIENT = textwrap.dedent("""
    import os, sys, time
    import pyarrow as pa
    import pyarrow.flight as flight

    uri, path, then_marker = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    with pa.memory_map(path) as source:
        table = pa.ipc.open_file(source).read_all()
    client = flight.FlightClient(uri)
    writer, reader = client.do_put(flight.FlightDescriptor.for_path("ducklake_mapping"),
                                   table.schema)
    for batch in table.to_batches(max_chunksize=2):
        writer.write_batch(batch)
    if then_marker:
        writer.write_metadata(b"commit")
    print("sent", flush=True)
    time.sleep(0.5)
    os._exit(1)  # dies mid-stream: no done_writing, no close
""")


@pytest.mark.parametrize("then_marker", [False, True], ids=["after-batches", "after-marker"])
def test_stream_cut_off_midway_commits_nothing(client, lake, ids, tmp_path, then_marker):
    """The client process dies mid-stream (the stream never half-closes). Even if the last
    message that arrived was the commit marker, the stream never ended, so nothing commits."""
    before = read_committed(lake.uri)
    t = ids.table()
    mappings = [flat_mapping(ids.file(), t, 3), flat_mapping(ids.file(), t, 4)]
    batches = mapping_batches(mappings, rows_per_batch=2)
    path = tmp_path / "rows.arrow"
    with pa.OSFile(str(path), "wb") as sink:
        with pa.ipc.new_file(sink, batches[0].schema) as w:
            for b in batches:
                w.write_batch(b)
    done = subprocess.run(
        [sys.executable, "-c", CUT_OFF_CLIENT, lake.uri, str(path), "1" if then_marker else "0"],
        capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, env=_child_env(),
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1 and "sent" in done.stdout, \
        f"the client did not die mid-stream as planned: {done.returncode}\n{done.stderr}"
    assert_stored(lake.uri, before, "after a client died mid-stream")
    check_reply(put(client, MAPPING_PATH, committed(batches)), rows=7, mappings=2,
                data_files=0, what="the same mappings after the cut-off stream")
    assert_stored(lake.uri, mappings[1].added_to(mappings[0].added_to(before)),
                  "the same mappings, committed by a whole stream")


# --------------------------------------------------------------------------------------------
# Validation: a stream that breaks a constraint is refused whole.


def test_stream_with_a_duplicate_column_id_is_refused(client, lake, ids):
    before = read_committed(lake.uri)
    t = ids.table()
    good = flat_mapping(ids.file(), t, 3)
    bad = Mapping(ids.file(), t, [(0, "a", 1, None, False), (1, "b", 2, None, False),
                                  (1, "c", 3, None, False)])
    with pytest.raises(pa.ArrowException) as e:
        put(client, MAPPING_PATH, committed(mapping_batches([good, bad])))
    check_refusal(e.value, "INVALID_ARGUMENT", ids=[bad.mapping_id], what="duplicate column_id")
    assert_stored(lake.uri, before, "after a refused stream")


def test_stream_with_a_parent_after_its_child_is_refused(client, lake, ids):
    before = read_committed(lake.uri)
    t = ids.table()
    bad = Mapping(ids.file(), t, [(0, "s", 1, None, False), (1, "a", 2, 2, False),
                                  (2, "n", 3, 0, False)])
    good = flat_mapping(ids.file(), t, 2)
    with pytest.raises(pa.ArrowException) as e:
        put(client, MAPPING_PATH, committed(mapping_batches([bad, good])))
    check_refusal(e.value, "INVALID_ARGUMENT", ids=[bad.mapping_id],
                  what="parent_column >= column_id")
    assert_stored(lake.uri, before, "after a refused stream")


def test_stream_with_a_null_source_name_is_refused(client, lake, ids):
    before = read_committed(lake.uri)
    t = ids.table()
    bad = Mapping(ids.file(), t, [(0, "a", 1, None, False), (1, None, 2, None, False)])
    with pytest.raises(pa.ArrowException) as e:
        put(client, MAPPING_PATH, committed(mapping_batches([bad])))
    check_refusal(e.value, "INVALID_ARGUMENT", words=["source_name"], what="NULL source_name")
    assert_stored(lake.uri, before, "after a refused stream")


def test_stream_with_a_stored_mapping_is_refused(client, lake, ids):
    t = ids.table()
    stored = flat_mapping(ids.file(), t, 2)
    check_reply(put(client, MAPPING_PATH, committed(mapping_batches([stored]))),
                rows=2, mappings=1, data_files=0, what="the first stream")
    before = read_committed(lake.uri)
    new = flat_mapping(ids.file(), t, 3)
    again = Mapping(stored.mapping_id, t, [(0, "other", 1, None, False)])
    with pytest.raises(pa.ArrowException) as e:
        put(client, MAPPING_PATH, committed(mapping_batches([new, again])))
    check_refusal(e.value, "ALREADY_EXISTS", ids=[stored.mapping_id], words=["already exists"],
                  what="a stored mapping sent again")
    assert_stored(lake.uri, before, "after a refused stream")


def test_data_file_stream_with_an_unknown_mapping_is_refused(client, lake, ids):
    before = read_committed(lake.uri)
    t = ids.table()
    missing = ids.file()
    files = [data_file(ids.file(), t, None), data_file(ids.file(), t, missing)]
    with pytest.raises(pa.ArrowException) as e:
        put(client, DATA_FILE, committed(file_batches(files)))
    check_refusal(e.value, "INVALID_ARGUMENT", ids=[missing],
                  what="a data file with an unknown mapping")
    assert_stored(lake.uri, before, "after a refused stream")


def test_data_file_stream_with_a_stored_file_is_refused(client, lake, ids):
    t = ids.table()
    stored = data_file(ids.file(), t, None)
    check_reply(put(client, DATA_FILE, committed(file_batches([stored]))),
                rows=1, mappings=0, data_files=1, what="the first stream")
    before = read_committed(lake.uri)
    files = [data_file(ids.file(), t, None), data_file(stored[0], t, None, begin_snapshot=2)]
    with pytest.raises(pa.ArrowException) as e:
        put(client, DATA_FILE, committed(file_batches(files)))
    check_refusal(e.value, "ALREADY_EXISTS", ids=[stored[0]], words=["already exists"],
                  what="a stored data file sent again")
    assert_stored(lake.uri, before, "after a refused stream")


def test_stream_to_an_unknown_path_is_refused(client, lake, ids):
    before = read_committed(lake.uri)
    rows = flat_mapping(ids.file(), ids.table(), 1).join_rows
    with pytest.raises(pa.ArrowException):
        put(client, "ducklake_no_such_table",
            committed([arrow_rows(NAME_MAPPING, rows, MAPPING_STREAM_COLUMNS).to_batches()[0]]),
            schema=stream_schema(MAPPING_PATH))
    assert_stored(lake.uri, before, "after a stream to an unknown path")


# --------------------------------------------------------------------------------------------
# DuckLake catalog versions: the streams carry the ducklake_data_file columns of the version
# the deployment serves (`serve --ducklake-version`); another version's are refused by name.

COMMIT_PATH = "ducklake_commit"


def commit_stream(m: Mapping, files: Sequence[tuple], version: str) -> pa.Table:
    """One `ducklake_commit` stream's rows: the mapping in the load's shape, then the files
    with DuckLake `version`'s columns (each row's columns of the other shape NULL)."""
    return pa.concat_tables(
        [arrow_rows(NAME_MAPPING, m.join_rows, MAPPING_STREAM_COLUMNS),
         arrow_rows(DATA_FILE, files, DATA_FILE_VERSIONS[version])],
        promote_options="default")


def data_files_served(uri: str) -> pa.Table:
    """`ducklake_data_file` as DoGet of its path streams it."""
    with flight.FlightClient(uri) as c:
        info = c.get_flight_info(flight.FlightDescriptor.for_path(DATA_FILE), OPTIONS)
        return read_endpoints(c, uri, info)


@pytest.fixture(scope="module")
def lake_1_0(server_factory):
    """A server of DuckLake 1.0's catalog tables, on an empty store."""
    return server_factory("writes-flight-1.0", steps_file=None,
                          extra_args=["--ducklake-version", "1.0"])


@pytest.mark.parametrize("path", [DATA_FILE, COMMIT_PATH])
def test_stream_of_another_versions_data_file_is_refused(client, lake, ids, path):
    """DuckLake 1.0's data-file columns into a server of 0.3's (the default): refused naming
    partial_max and both versions, the stream's mapping not stored either."""
    before = read_committed(lake.uri)
    t = ids.table()
    m = flat_mapping(ids.file(), t, 2)
    f = data_file_in("1.0", data_file(ids.file(), t, m.mapping_id), partial_max=3)
    table = (arrow_rows(DATA_FILE, [f], DATA_FILE_VERSIONS["1.0"]) if path == DATA_FILE
             else commit_stream(m, [f], "1.0"))
    with pytest.raises(pa.ArrowException) as e:
        put(client, path, committed(table.to_batches(max_chunksize=2)), schema=table.schema)
    check_refusal(e.value, "INVALID_ARGUMENT",
                  words=["column partial_max ", "DuckLake 1.0's", "DuckLake 0.3's"],
                  what=f"DuckLake 1.0's data file on {path}")
    assert_stored(lake.uri, before, f"after a refused DuckLake 1.0 stream on {path}")


def test_streams_of_the_served_version_commit(lake_1_0, ids):
    """A DuckLake 1.0 server takes 1.0's data-file columns on both paths (and refuses 0.3's
    partial_file_info); DoGet streams them back with 1.0's columns in its order."""
    with flight.FlightClient(lake_1_0.uri) as c:
        t = ids.table()
        m = flat_mapping(ids.file(), t, 2)
        alone = data_file_in("1.0", data_file(ids.file(), t, None), partial_max=None)
        mapped = data_file_in("1.0", data_file(ids.file(), t, m.mapping_id), partial_max=31)
        table = arrow_rows(DATA_FILE, [alone], DATA_FILE_VERSIONS["1.0"])
        check_reply(put(c, DATA_FILE, committed(table.to_batches()), schema=table.schema),
                    rows=1, mappings=0, data_files=1, what="a 1.0 data-file stream")
        table = commit_stream(m, [mapped], "1.0")
        check_reply(put(c, COMMIT_PATH, committed(table.to_batches()), schema=table.schema),
                    rows=table.num_rows, mappings=1, data_files=1, what="a 1.0 commit stream")
        old = data_file(ids.file(), t, None)
        with pytest.raises(pa.ArrowException) as e:
            table = arrow_rows(DATA_FILE, [old])
            put(c, DATA_FILE, committed(table.to_batches()), schema=table.schema)
        check_refusal(e.value, "INVALID_ARGUMENT",
                      words=["column partial_file_info ", "DuckLake 0.3's",
                             "DuckLake 1.0's"],
                      what="DuckLake 0.3's data file into a 1.0 server")
    served = data_files_served(lake_1_0.uri)
    assert served.schema.names == data_file_names("1.0")
    got = sorted_rows(tuple(r.values()) for r in served.to_pylist() if r["table_id"] == t)
    assert got == sorted_rows([alone, mapped]), got


# --------------------------------------------------------------------------------------------
# A stream and an ADBC transaction writing the same mapping.


def test_stream_commit_beats_an_open_adbc_transaction(client, lake, ids):
    import adbc_driver_flightsql.dbapi as flightsql
    from test_writes_adbc import connect, stage_mapping

    before = read_committed(lake.uri)
    t, mapping_id = ids.table(), ids.file()
    staged = Mapping(mapping_id, t, [(0, "from_adbc", 1, None, False)])
    streamed = Mapping(mapping_id, t, [(0, "from_stream", 1, None, False)])
    conn = connect(lake.uri)
    try:
        stage_mapping(conn, staged)
        check_reply(put(client, MAPPING_PATH, committed(mapping_batches([streamed]))),
                    rows=1, mappings=1, data_files=0, what="the stream")
        with pytest.raises((flightsql.OperationalError, flightsql.ProgrammingError)) as e:
            conn.commit()
        msg = str(e.value).lower()
        assert "conflict" in msg or "already exists" in msg, str(e.value)
    finally:
        conn.close()
    assert_stored(lake.uri, streamed.added_to(before), "the stream's mapping only")


# --------------------------------------------------------------------------------------------
# Durability: what was acknowledged survives the process being killed.


def test_acknowledged_commits_survive_a_crash(tmp_path, ids):
    """Concurrent streams commit (so the embedded store groups them), the server is killed
    with SIGKILL before any checkpoint (checkpoints are a day apart here, so every commit is
    in the commit log only), and a new server on the same directory holds every
    acknowledged commit: the log was replayed."""
    binary, data_dir = moraine_bin(), tmp_path / "crash"
    args = ["--redb-checkpoint-ms", "86400000"]
    work = []
    for _ in range(24):
        t = ids.table()
        m = flat_mapping(ids.file(), t, 3)
        work.append((m, [data_file(ids.file(), t, m.mapping_id) for _ in range(2)]))

    def commit_one(uri: str, m: Mapping, files: List[tuple]) -> None:
        with flight.FlightClient(uri) as c:
            check_reply(put(c, MAPPING_PATH, committed(mapping_batches([m]))),
                        rows=3, mappings=1, data_files=0, what="a mapping")
            check_reply(put(c, DATA_FILE, committed(file_batches(files))),
                        rows=len(files), mappings=0, data_files=len(files), what="its files")

    server = Server(binary, data_dir, "crash", args)
    try:
        uri = server.wait_listening()
        want = read_committed(uri)
        with ThreadPoolExecutor(6) as pool:
            list(pool.map(lambda item: commit_one(uri, *item), work))
        for m, files in work:
            want = m.added_to(want).with_rows(DATA_FILE, files)
        assert_stored(uri, want, "before the crash")
        assert (data_dir / "moraine.log").stat().st_size > 0, "the commits are in the log"
        server.proc.kill()
        server.proc.wait(10)
    finally:
        server.stop()

    restarted = Server(binary, data_dir, "crash-restarted", args)
    try:
        uri = restarted.wait_listening()
        assert_stored(uri, want, "after SIGKILL and a restart")
        assert "replayed the commit log" in restarted.log(), restarted.log(tail=20)
    finally:
        complaint = restarted.stop()
    assert complaint is None, complaint


# --------------------------------------------------------------------------------------------
# Memory: a request over the staging limit is refused as it is read, not after it is buffered.


def _proc_kib(pid: int, field: str) -> int:
    """A `kB` field of /proc/<pid>/status (VmRSS: resident now; VmHWM: the peak so far)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def test_an_oversized_stream_is_refused_in_bounded_memory(server_factory, ids):
    """A 320 MiB mapping stream against a 16 MiB staging limit: refused with
    RESOURCE_EXHAUSTED naming the limit and its flag, nothing written, and the server's peak
    RSS grew by a small fraction of the payload (the stream is staged batch by batch and
    checked against the limit before the next batch is read)."""
    limit = 16 << 20
    lake = server_factory("memory-limit", steps_file=None,
                          extra_args=["--txn-max-bytes", str(limit)])
    pid = lake.server.proc.pid
    rows_per_batch, name_bytes, batches = 4096, 2048, 40
    payload = rows_per_batch * name_bytes * batches
    table_id = ids.table()
    # The batches share their columns but the mapping ids, so what the client holds stays
    # small; each batch is 512 new mappings of 8 names.
    shared = [
        pa.array([table_id] * rows_per_batch, pa.int64()),
        pa.array(["map_by_name"] * rows_per_batch),
        pa.array([i % 8 for i in range(rows_per_batch)], pa.int64()),
        pa.array([f"{i % 8}".ljust(name_bytes, "x") for i in range(rows_per_batch)]),
        pa.array([i % 8 + 1 for i in range(rows_per_batch)], pa.int64()),
        pa.array([None] * rows_per_batch, pa.int64()),
        pa.array([False] * rows_per_batch),
    ]

    def batch_of(first: int) -> pa.RecordBatch:
        mapping_ids = pa.array([first + i // 8 for i in range(rows_per_batch)], pa.int64())
        return pa.record_batch([mapping_ids] + shared, schema=stream_schema(MAPPING_PATH))

    stream = [batch_of(100_000_000 + k * rows_per_batch) for k in range(batches)]
    batch = stream[0]
    assert batch.nbytes >= rows_per_batch * name_bytes
    with flight.FlightClient(lake.uri) as c:
        before = read_committed(lake.uri)
        rss_before = _proc_kib(pid, "VmRSS")
        with pytest.raises(pa.ArrowException) as e:
            put(c, MAPPING_PATH, committed(stream))
    check_refusal(e.value, "RESOURCE_EXHAUSTED", words=["--txn-max-bytes", str(limit)],
                  what="a stream over the staging limit")
    peak_growth = (_proc_kib(pid, "VmHWM") - rss_before) << 10
    assert peak_growth < payload // 4, (
        f"the server's peak RSS grew by {peak_growth >> 20} MiB for a refused "
        f"{payload >> 20} MiB stream (limit {limit >> 20} MiB)")
    assert_stored(lake.uri, before, "after the refused stream")
    grown = (_proc_kib(pid, "VmRSS") - rss_before) << 10
    assert grown < payload // 4, f"the server holds {grown >> 20} MiB more than before"
