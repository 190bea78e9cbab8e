"""What no client may make the server do: allocate without bound, run forever, or hold
transactions and prepared statements without end. Each refusal names its limit, with the
right gRPC status, and the server goes on.

The server here runs with small limits (a 16 MiB query memory pool, 100,000 rows per
transaction, six transactions in all, two transactions and three prepared statements per
session) so that each limit is reached quickly; the statement timeout has a server of its own.
"""

from __future__ import annotations

from pathlib import Path

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from conftest import autocommit_cursor
from test_pyarrow_flight import OPTIONS, SQL_PKG, _bytes_field

EXTRA_ARGS = [
    "--query-memory-mb", "16",
    "--txn-max-rows", "100000",
    "--max-open-transactions", "6",
    "--max-session-transactions", "2",
    "--max-session-prepared-statements", "3",
]


@pytest.fixture(scope="module")
def limited(server_factory):
    return server_factory("limits", steps_file=None, extra_args=EXTRA_ARGS)


def peak_rss_mib(running) -> float:
    """The server process's peak resident memory so far (Linux `VmHWM`)."""
    status = Path(f"/proc/{running.server.proc.pid}/status").read_text()
    line = next(l for l in status.splitlines() if l.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def refused(uri: str, sql: str, code: str, words) -> str:
    """Runs `sql` on a connection with autocommit on; it must fail with gRPC status `code`
    (which the ADBC driver names in its message, in parentheses), naming every one of
    `words`. Returns the message."""
    with autocommit_cursor(uri) as cur:
        with pytest.raises(flightsql.Error) as e:
            cur.execute(sql)
            got = cur.fetch_arrow_table()
            pytest.fail(f"{sql[:80]} ran: {got.to_pylist()[:3]}")
    msg = str(e.value)
    assert has_code(msg, code), f"{sql[:80]}: not {code}: {e.value!r}"
    for w in words:
        assert w in msg, f"{sql[:80]}: the message does not say {w!r}: {msg}"
    return msg


def has_code(msg: str, code: str) -> bool:
    """Whether an ADBC error message carries gRPC status `code` (the driver writes it either
    way, depending on the call)."""
    return f"({code};" in msg or f"code = {code} " in msg


def scalar(uri: str, sql: str):
    with autocommit_cursor(uri) as cur:
        cur.execute(sql)
        return cur.fetchone()[0]


def test_functions_asked_for_gigabytes_are_refused_before_they_allocate(limited):
    before = peak_rss_mib(limited)
    for sql, name in [
        ("SELECT repeat('x', 300000000)", "repeat"),
        # Per row, not folded into one constant: 200 kB each, for 1000 rows of one batch.
        ("SELECT length(repeat('ab', 100000 + value % 2)) FROM generate_series(1, 1000)",
         "repeat"),
        ("SELECT lpad('x', 200000000)", "lpad"),
        ("SELECT rpad('x', 200000000, 'yz')", "rpad"),
        ("SELECT array_length(range(1, 100000000))", "range"),
        ("SELECT array_repeat(1, 100000000)", "array_repeat"),
    ]:
        refused(limited.uri, sql, "ResourceExhausted",
                [name, "67108864 bytes"])
    grown = peak_rss_mib(limited) - before
    assert grown < 150, f"the server's peak RSS grew by {grown:.0f} MiB"
    # Within the limit the functions work as ever.
    assert scalar(limited.uri, "SELECT repeat('ab', 3)") == "ababab"
    assert scalar(limited.uri, "SELECT array_length(range(1, 1001))") == 1000


def test_an_insert_select_is_refused_while_its_rows_are_read(limited):
    before = peak_rss_mib(limited)
    refused(limited.uri,
            "INSERT INTO ducklake_data_file (data_file_id, table_id) "
            "SELECT value, 1 FROM generate_series(1, 5000000)",
            "ResourceExhausted", ["100000 rows", "--txn-max-rows"])
    grown = peak_rss_mib(limited) - before
    assert grown < 150, f"the server's peak RSS grew by {grown:.0f} MiB"
    assert scalar(limited.uri, "SELECT count(*) FROM ducklake_data_file") == 0


def test_a_query_over_the_memory_pool_is_refused(limited):
    refused(limited.uri,
            "SELECT count(*) FROM (SELECT value % 3000000 AS v FROM generate_series(1, 3000000) "
            "GROUP BY v)",
            "ResourceExhausted", ["Resources exhausted"])
    assert scalar(limited.uri, "SELECT count(DISTINCT value) FROM generate_series(1, 1000)") \
        == 1000


def test_a_statement_past_the_timeout_is_ended(server_factory):
    timed = server_factory("timeout", steps_file=None, extra_args=["--statement-timeout", "1"])
    refused(timed.uri, "SELECT count(*) FROM generate_series(1, 1000000000000)",
            "DeadlineExceeded", ["1 s", "--statement-timeout"])
    assert scalar(timed.uri, "SELECT 1") == 1


def test_sql_text_and_statement_count_are_bounded(limited):
    refused(limited.uri, "SELECT 1 -- " + "x" * (4 << 20), "InvalidArgument",
            ["4194304 bytes"])
    refused(limited.uri, "SELECT 1; SELECT 2", "InvalidArgument",
            ["2 statements"])


def action(client, kind: str, body: bytes, headers) -> bytes:
    """The Flight SQL action `kind` (its request `Action<kind>Request` in a
    google.protobuf.Any); returns the first result."""
    any_msg = _bytes_field(1, f"{SQL_PKG}Action{kind}Request".encode()) + _bytes_field(2, body)
    options = flight.FlightCallOptions(timeout=OPTIONS.timeout, headers=headers)
    results = list(client.do_action(flight.Action(kind, any_msg), options))
    return results[0].body.to_pybytes() if results else b""


def test_transactions_and_prepared_statements_are_capped_per_session(limited):
    with flight.FlightClient(limited.uri) as client:
        token = client.authenticate_basic_token("moraine", "unused", OPTIONS)
        for _ in range(2):
            action(client, "BeginTransaction", b"", [token])
        with pytest.raises(pa.ArrowException) as e:
            action(client, "BeginTransaction", b"", [token])
        assert "resource exhausted" in str(e.value), repr(e.value)
        assert "--max-session-transactions" in str(e.value), str(e.value)

        query = _bytes_field(1, b"SELECT 1")
        for _ in range(3):
            action(client, "CreatePreparedStatement", query, [token])
        with pytest.raises(pa.ArrowException) as e:
            action(client, "CreatePreparedStatement", query, [token])
        assert "resource exhausted" in str(e.value), repr(e.value)
        assert "--max-session-prepared-statements" in str(e.value), str(e.value)
    # Another session is not held up by this one's.
    assert scalar(limited.uri, "SELECT 2") == 2


def test_open_transactions_are_capped_in_total(limited):
    # Each DB-API connection with autocommit off holds a transaction of its own session. The
    # server allows 6 in all; the session above may still hold 2 of them until it expires.
    conns = []
    try:
        with pytest.raises(flightsql.Error) as e:
            for _ in range(7):
                conns.append(flightsql.connect(limited.uri))
        assert "--max-open-transactions" in str(e.value), str(e.value)
    finally:
        for conn in conns:
            conn.close()
    # Closing them frees their places.
    conn = flightsql.connect(limited.uri)
    conn.close()
