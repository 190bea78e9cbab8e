"""`moraine serve --metrics HOST:PORT`: the Prometheus metrics, counted exactly.

Every test starts a server of its own with `--metrics 127.0.0.1:0` (metrics are per process,
so a fresh server starts every count at zero, but for the store commit that records a new
store's DuckLake version: FIRST_START_COMMITS), drives traffic whose effect on each metric is
known exactly (N path GetFlightInfos, their DoGets and the rows they read; one committed
one-stream DoPut; writes refused by validation; a conflict between two ADBC transactions; an
ADBC transaction left idle past `--txn-idle-timeout`), then reads the endpoint the server logs
(`metrics on http://127.0.0.1:PORT/metrics`), parses its text (`name{labels} value` lines)
and compares the counts.

A call's request metrics are recorded when the server finishes its response, which can be a
moment after the client has seen the last byte; so each expectation is checked against
scrapes repeated every SCRAPE_POLL_S until it holds, for at most SETTLE_S. A count that is
too high never "settles" and fails as surely as one that stays too low.

Labels must take values from small fixed sets only: the last test runs queries, logins,
refused logins and writes carrying distinctive markers (SQL literals, a user name, ids) and
checks that none of them appears anywhere in the metrics text.
"""

from __future__ import annotations

import math
import re
import time
import urllib.request
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from conftest import (
    COLUMN_MAPPING,
    DATA_FILE,
    NAME_MAPPING,
    TABLES,
    CatalogState,
    Ids,
    Mapping,
    Running,
    add_user,
    data_file,
    diff_states,
    flat_mapping,
    mentions_id,
)
from test_pyarrow_flight import OPTIONS, _bytes_field, command
from test_writes_adbc import connect, ingest, ingest_ok, stage_mapping
from test_writes_pyarrow import (
    MAPPING_PATH,
    check_refusal,
    check_reply,
    committed,
    file_batches,
    mapping_batches,
    put,
    read_committed,
)

METRICS_ARGS = ["--metrics", "127.0.0.1:0"]
METRICS_LINE = re.compile(r"metrics on (http://\S+)")
SCRAPE_TIMEOUT_S = 10
SCRAPE_POLL_S = 0.05
SETTLE_S = 10
EXPIRY_WAIT_S = 30

P = "moraine_"

# The metric families and their types, as the server exposes them (prometheus-client adds
# `_total` to counter samples and the unit to the family name).
FAMILIES = {
    P + "rpc_requests": "counter",
    P + "rpc_duration_seconds": "histogram",
    P + "rows_streamed": "counter",
    P + "streamed_bytes": "counter",
    P + "commits": "counter",
    P + "commit_conflicts": "counter",
    P + "validation_refusals": "counter",
    P + "commits_unknown": "counter",
    P + "transactions_open": "gauge",
    P + "transactions_expired": "counter",
    P + "store_read_duration_seconds": "histogram",
    P + "store_commit_duration_seconds": "histogram",
    P + "staged_peak_bytes": "gauge",
}

# The families whose series are created by the first call (prometheus-client leaves a family
# with no series out of the text altogether).
LABELLED_BY_CALLS = {P + "rpc_requests", P + "rpc_duration_seconds"}

# The samples.
REQUESTS = P + "rpc_requests_total"
RPC_SECONDS = P + "rpc_duration_seconds"
ROWS = P + "rows_streamed_total"
BYTES = P + "streamed_bytes_total"
COMMITS = P + "commits_total"
CONFLICTS = P + "commit_conflicts_total"
REFUSALS = P + "validation_refusals_total"
UNKNOWN = P + "commits_unknown_total"
OPEN = P + "transactions_open"
EXPIRED = P + "transactions_expired_total"
STORE_READ = P + "store_read_duration_seconds"
STORE_COMMIT = P + "store_commit_duration_seconds"
PEAK = P + "staged_peak_bytes"
SCALARS = (ROWS, BYTES, COMMITS, CONFLICTS, REFUSALS, UNKNOWN, OPEN, EXPIRED, PEAK)
# A server on a store it creates (`start(..., fixture=False)`) records the store's DuckLake
# catalog version (`--ducklake-version`, 0.3 by default) in it before it listens: one store
# commit, counted with the store's others. (On an imported store `moraine import` recorded it.)
FIRST_START_COMMITS = 1

# The values each label may take (src/metrics.rs): fixed sets, never caller data.
RPCS = {"Handshake", "ListFlights", "GetFlightInfo", "PollFlightInfo", "GetSchema", "DoGet",
        "DoPut", "DoExchange", "DoAction", "ListActions", "other"}
COMMANDS = {
    "CommandStatementQuery", "CommandStatementUpdate", "CommandStatementIngest",
    "CommandStatementSubstraitPlan", "CommandPreparedStatementQuery",
    "CommandPreparedStatementUpdate", "CommandGetCatalogs", "CommandGetDbSchemas",
    "CommandGetTables", "CommandGetTableTypes", "CommandGetSqlInfo", "CommandGetXdbcTypeInfo",
    "CommandGetPrimaryKeys", "CommandGetExportedKeys", "CommandGetImportedKeys",
    "CommandGetCrossReference", "TicketStatementQuery", "CreatePreparedStatement",
    "ClosePreparedStatement", "CreatePreparedSubstraitPlan", "BeginTransaction",
    "EndTransaction", "BeginSavepoint", "EndSavepoint", "CancelQuery", "CloseSession",
    "SetSessionOptions", "GetSessionOptions", "CreateToken", "ListTokens", "RevokeToken",
    "path", "none", "other",
}
CODES = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
         "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
         "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
         "UNAUTHENTICATED"}
STORE_OPS = {"get", "batch_get", "scan_page", "divide"}
LABEL_VALUES = {"rpc": RPCS, "command": COMMANDS, "code": CODES, "op": STORE_OPS}


# --------------------------------------------------------------------------------------------
# Scraping and parsing.

Labels = Tuple[Tuple[str, str], ...]

_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)(?: \S+)?")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')


def _labels(text: str, line: str) -> Labels:
    out, pos = [], 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        assert m, f"cannot parse the labels of `{line}` at {text[pos:]!r}"
        value = m.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
        out.append((m.group(1), value))
        pos = m.end()
    return tuple(sorted(out))


def _number(text: str, line: str) -> float:
    try:
        return float(text)  # also +Inf, -Inf, NaN
    except ValueError:
        pytest.fail(f"not a number in `{line}`", pytrace=False)


@dataclass
class Metrics:
    """One scrape: its text, its `# TYPE` lines and its samples."""

    text: str
    content_type: str
    types: Dict[str, str]
    samples: Dict[Tuple[str, Labels], float]

    def value(self, name: str, **labels: str) -> Optional[float]:
        """The sample `name` with exactly `labels`, None if there is none."""
        return self.samples.get((name, tuple(sorted(labels.items()))))

    def scalar(self, name: str) -> float:
        """A sample without labels, which is always exposed."""
        v = self.value(name)
        assert v is not None, f"no `{name}` sample in the metrics:\n{self.text}"
        return v

    def series(self, name: str) -> List[Tuple[Dict[str, str], float]]:
        return [(dict(labels), v) for (n, labels), v in self.samples.items() if n == name]

    def count(self, name: str, **labels: str) -> float:
        """A labelled counter (or histogram `_count`): a series the server has not created
        yet has counted nothing."""
        v = self.value(name, **labels)
        return 0 if v is None else v

    def requests(self) -> Dict[Tuple[str, str, str], float]:
        """rpc_requests_total as {(rpc, command, code): count}."""
        return {(l["rpc"], l["command"], l["code"]): v for l, v in self.series(REQUESTS)}

    def durations(self, name: str) -> Dict[Tuple[Tuple[str, str], ...], float]:
        """A histogram's `_count` per label set."""
        return {tuple(sorted(l.items())): v for l, v in self.series(name + "_count")}


def metrics_url(running: Running) -> str:
    m = METRICS_LINE.search(running.server.log())
    assert m, f"no `metrics on http://…` line in the server's output:\n{running.server.log()}"
    url = m.group(1).rstrip(".,;")
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics"), url
    assert not url.startswith("http://127.0.0.1:0/"), f"port 0 logged: {url}"
    return url


def parse(text: str, content_type: str = "") -> Metrics:
    lines = text.split("\n")
    assert lines[-1] == "" and lines[-2] == "# EOF", \
        f"the metrics text does not end with `# EOF`:\n{text[-500:]}"
    types: Dict[str, str] = {}
    samples: Dict[Tuple[str, Labels], float] = {}
    for line in lines[:-2]:
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3]
            continue
        m = _SAMPLE.fullmatch(line)
        assert m, f"cannot parse the metrics line `{line}`"
        key = (m.group(1), _labels(m.group(2) or "", line))
        assert key not in samples, f"sample exposed twice: `{line}`"
        samples[key] = _number(m.group(3), line)
    return Metrics(text, content_type, types, samples)


def scrape(url: str) -> Metrics:
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
        assert response.status == 200, f"GET {url}: HTTP {response.status}"
        content_type = response.headers.get("Content-Type", "")
        text = response.read().decode("utf-8")
    return parse(text, content_type)


def settled(url: str, check: Callable[[Metrics], None], timeout: float = SETTLE_S) -> Metrics:
    """Scrapes until `check` (which asserts) passes on a scrape, and returns that scrape;
    fails with `check`'s last complaint and the last text if it has not within `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(url)
        try:
            check(m)
            return m
        except AssertionError as e:
            if time.monotonic() >= deadline:
                pytest.fail(f"the metrics did not settle within {timeout} s: {e}\n"
                            f"the last scrape:\n{relevant(m.text)}", pytrace=False)
        time.sleep(SCRAPE_POLL_S)


def relevant(text: str) -> str:
    """The metrics text without its `# HELP`/`# UNIT` lines and histogram buckets."""
    return "\n".join(l for l in text.splitlines()
                     if not l.startswith(("# HELP", "# UNIT")) and "_bucket{" not in l)


def eq(what: str, got, want) -> None:
    assert got == want, f"{what}: the server exposes {got!r}, expected {want!r}"


def check_histograms(m: Metrics) -> None:
    """Every histogram series is well formed: cumulative buckets ending in +Inf equal to
    `_count`, a `_sum` that is a non-negative number."""
    for family, kind in m.types.items():
        if kind != "histogram":
            continue
        by_labels: Dict[Labels, List[Tuple[float, float]]] = {}
        for (name, labels), v in m.samples.items():
            if name == family + "_bucket":
                le = dict(labels)["le"]
                rest = tuple(kv for kv in labels if kv[0] != "le")
                by_labels.setdefault(rest, []).append((float(le), v))
        for rest, buckets in by_labels.items():
            buckets.sort()
            counts = [c for _, c in buckets]
            assert counts == sorted(counts), f"{family}{dict(rest)}: buckets not cumulative"
            assert buckets[-1][0] == math.inf, f"{family}{dict(rest)}: no +Inf bucket"
            total = m.samples.get((family + "_count", rest))
            assert total == buckets[-1][1], \
                f"{family}{dict(rest)}: _count {total} but the +Inf bucket holds {buckets[-1][1]}"
            s = m.samples.get((family + "_sum", rest))
            assert s is not None and s >= 0 and not math.isnan(s), f"{family}{dict(rest)}: _sum {s}"
            if total == 0:
                assert s == 0, f"{family}{dict(rest)}: _sum {s} with no observation"


def start(server_factory, name: str, *, fixture: bool = True,
          extra: Sequence[str] = ()) -> Tuple[Running, str]:
    kwargs = {} if fixture else {"steps_file": None}
    running = server_factory(name, extra_args=[*METRICS_ARGS, *extra], **kwargs)
    return running, metrics_url(running)


def no_store_surprises(m: Metrics) -> None:
    eq("commits_unknown_total", m.scalar(UNKNOWN), 0)


# --------------------------------------------------------------------------------------------
# The endpoint.


def test_endpoint_serves_every_family_at_zero(server_factory):
    running, url = start(server_factory, "metrics-fresh", fixture=False)
    m = scrape(url)
    assert m.content_type.startswith("application/openmetrics-text"), m.content_type
    for family, kind in FAMILIES.items():
        if family in LABELLED_BY_CALLS:
            continue  # a family with no series yet is left out of the text
        eq(f"the type of {family}", m.types.get(family), kind)
    for name in SCALARS:
        eq(f"{name} on a fresh server", m.scalar(name), 0)
    eq("store commits on a fresh server (its DuckLake version record)",
       m.scalar(STORE_COMMIT + "_count"), FIRST_START_COMMITS)
    assert m.scalar(STORE_COMMIT + "_sum") > 0, "the version record's commit took no time"
    eq("rpc_requests_total series before any call", m.series(REQUESTS), [])
    eq("rpc_duration_seconds series before any call", m.series(RPC_SECONDS + "_count"), [])
    check_histograms(m)
    # The server checked its store on start: store reads have been timed already.
    assert all(l["op"] in STORE_OPS for l, _ in m.series(STORE_READ + "_count"))


# --------------------------------------------------------------------------------------------
# Reads.


def test_plain_flight_reads_are_counted_exactly(server_factory, expected):
    running, url = start(server_factory, "metrics-reads")
    before = scrape(url)
    rounds = 2
    infos = do_gets = rows = 0
    with flight.FlightClient(running.uri) as c:
        paths = [(t,) for t in TABLES for _ in range(rounds)] + [(DATA_FILE, "2")]
        for path in paths:
            info = c.get_flight_info(flight.FlightDescriptor.for_path(*path), OPTIONS)
            infos += 1
            for ep in info.endpoints:
                assert not ep.locations or all(
                    loc.uri.decode() in (running.uri, "arrow-flight-reuse-connection://?")
                    for loc in ep.locations), f"endpoint elsewhere: {ep.locations}"
                rows += c.do_get(ep.ticket, OPTIONS).read_all().num_rows
                do_gets += 1
        with pytest.raises(pa.ArrowException) as e:
            c.get_flight_info(flight.FlightDescriptor.for_path("no_such_table"), OPTIONS)
        assert "not found" in str(e.value).lower(), e.value
    want_rows = rounds * sum(len(expected[t]) for t in TABLES) + \
        len(expected.rows_of_table_id(DATA_FILE, 2))
    assert rows == want_rows, f"read {rows} rows, the fixture holds {want_rows}"
    assert do_gets >= infos > 0

    def check(m: Metrics) -> None:
        eq("rpc_requests_total", m.requests(), {
            ("GetFlightInfo", "path", "OK"): infos,
            ("GetFlightInfo", "path", "NOT_FOUND"): 1,
            ("DoGet", "TicketStatementQuery", "OK"): do_gets,
        })
        eq("rpc_duration_seconds_count", m.durations(RPC_SECONDS), {
            (("command", "path"), ("rpc", "GetFlightInfo")): infos + 1,
            (("command", "TicketStatementQuery"), ("rpc", "DoGet")): do_gets,
        })
        eq("rows_streamed_total", m.scalar(ROWS), rows)

    m = settled(url, check)
    check_histograms(m)
    for family, kind in FAMILIES.items():
        eq(f"the type of {family}", m.types.get(family), kind)
    assert m.scalar(BYTES) > before.scalar(BYTES), "streamed_bytes_total did not grow"
    reads_before = {l["op"]: v for l, v in before.series(STORE_READ + "_count")}
    reads = {l["op"]: v for l, v in m.series(STORE_READ + "_count")}
    assert set(reads) <= STORE_OPS, f"store_read_duration_seconds ops: {sorted(reads)}"
    assert reads.get("scan_page", 0) > reads_before.get("scan_page", 0), \
        f"no store scan timed for the reads: {reads_before} -> {reads}"
    # Reads change nothing else; a table that is not found is no validation refusal.
    for name in (COMMITS, CONFLICTS, REFUSALS, UNKNOWN, OPEN, EXPIRED, PEAK):
        eq(name, m.scalar(name), 0)
    eq("store_commit_duration_seconds_count", m.scalar(STORE_COMMIT + "_count"), 0)


# --------------------------------------------------------------------------------------------
# Writes.


def test_one_stream_commit_and_validation_refusals(server_factory):
    running, url = start(server_factory, "metrics-puts", fixture=False)
    ids = Ids()
    t = ids.table()
    m1 = flat_mapping(ids.file(), t, 3)
    with flight.FlightClient(running.uri) as c:
        check_reply(put(c, MAPPING_PATH, committed(mapping_batches([m1]))),
                    rows=3, mappings=1, data_files=0, what="the committed stream")
        settled(url, lambda m: (eq("commits_total after one stream", m.scalar(COMMITS), 1),
                                eq("validation_refusals_total", m.scalar(REFUSALS), 0)))

        # A data file naming a mapping that does not exist: refused by validation.
        missing = ids.file()
        files = [data_file(ids.file(), t, m1.mapping_id), data_file(ids.file(), t, missing)]
        with pytest.raises(pa.ArrowException) as e:
            put(c, DATA_FILE, committed(file_batches(files)))
        check_refusal(e.value, "INVALID_ARGUMENT", ids=[missing], what="an unknown mapping")
        settled(url, lambda m: eq("validation_refusals_total after the unknown mapping",
                                  m.scalar(REFUSALS), 1))

        # Name rows breaking RFC 0018 (a duplicate column_id): refused by validation.
        bad = Mapping(ids.file(), t, [(0, "a", 1, None, False), (1, "b", 2, None, False),
                                      (1, "c", 3, None, False)])
        with pytest.raises(pa.ArrowException) as e:
            put(c, MAPPING_PATH, committed(mapping_batches([flat_mapping(ids.file(), t), bad])))
        check_refusal(e.value, "INVALID_ARGUMENT", ids=[bad.mapping_id], what="duplicate column_id")

    def check(m: Metrics) -> None:
        eq("rpc_requests_total", m.requests(), {
            ("DoPut", "path", "OK"): 1,
            ("DoPut", "path", "INVALID_ARGUMENT"): 2,
        })
        eq("rpc_duration_seconds_count", m.durations(RPC_SECONDS), {
            (("command", "path"), ("rpc", "DoPut")): 3,
        })
        eq("commits_total", m.scalar(COMMITS), 1)
        eq("validation_refusals_total", m.scalar(REFUSALS), 2)

    m = settled(url, check)
    check_histograms(m)
    no_store_surprises(m)
    eq("commit_conflicts_total", m.scalar(CONFLICTS), 0)
    eq("store_commit_duration_seconds_count (refused streams never reach the store)",
       m.scalar(STORE_COMMIT + "_count"), FIRST_START_COMMITS + 1)
    eq("rows_streamed_total (nothing was read)", m.scalar(ROWS), 0)
    eq("transactions_open", m.scalar(OPEN), 0)
    # Nothing of the refused streams was written.
    want = m1.added_to(CatalogState(tables={tb: [] for tb in TABLES}))
    diff = diff_states(read_committed(running.uri), want)
    assert not diff, f"after one commit and two refusals:\n{diff}"


def test_adbc_validation_refusals_count_once_each(server_factory):
    """One refusal at an ingest statement (a duplicate column_id), one at commit (a data file
    naming a mapping that does not exist): two refusals, no commit, nothing written."""
    running, url = start(server_factory, "metrics-adbc-refusals", fixture=False)
    ids = Ids()
    t = ids.table()
    conn = connect(running.uri)
    try:
        m = flat_mapping(ids.file(), t, 3)
        ingest_ok(conn, COLUMN_MAPPING, [m.column_row])
        with pytest.raises(flightsql.Error) as e:
            ingest(conn, NAME_MAPPING, m.name_rows + [(m.mapping_id, 1, "again", 9, None, False)])
        assert "INVALID_ARGUMENT" in str(e.value), str(e.value)
        settled(url, lambda s: eq("validation_refusals_total after the refused ingest",
                                  s.scalar(REFUSALS), 1))
        conn.rollback()
        good = flat_mapping(ids.file(), t, 2)
        stage_mapping(conn, good)
        missing = ids.file()
        ingest_ok(conn, DATA_FILE, [data_file(ids.file(), t, missing)])
        with pytest.raises(flightsql.Error) as e:
            conn.commit()
        assert "INVALID_ARGUMENT" in str(e.value) and mentions_id(str(e.value), missing), \
            str(e.value)
    finally:
        conn.close()

    def check(s: Metrics) -> None:
        eq("validation_refusals_total", s.scalar(REFUSALS), 2)
        eq("ingests refused", s.count(REQUESTS, rpc="DoPut", command="CommandStatementIngest",
                                      code="INVALID_ARGUMENT"), 1)
        eq("ingests", s.count(REQUESTS, rpc="DoPut", command="CommandStatementIngest",
                              code="OK"), 4)
        eq("EndTransaction INVALID_ARGUMENT", s.count(
            REQUESTS, rpc="DoAction", command="EndTransaction", code="INVALID_ARGUMENT"), 1)
        eq("EndTransaction OK (the rollback)", s.count(
            REQUESTS, rpc="DoAction", command="EndTransaction", code="OK"), 1)
        eq("transactions_open", s.scalar(OPEN), 0)

    s = settled(url, check)
    eq("commits_total", s.scalar(COMMITS), 0)
    eq("commit_conflicts_total", s.scalar(CONFLICTS), 0)
    eq("store_commit_duration_seconds_count (refused before the store)",
       s.scalar(STORE_COMMIT + "_count"), FIRST_START_COMMITS)
    no_store_surprises(s)
    diff = diff_states(read_committed(running.uri), CatalogState(tables={tb: [] for tb in TABLES}))
    assert not diff, f"a refused transaction wrote:\n{diff}"


def test_open_transaction_with_staged_rows(server_factory):
    running, url = start(server_factory, "metrics-open-txn", fixture=False)
    ids = Ids()
    m = flat_mapping(ids.file(), ids.table(), 2)
    conn = connect(running.uri)  # BeginTransaction
    try:
        settled(url, lambda s: (eq("transactions_open after connect", s.scalar(OPEN), 1),
                                eq("staged_peak_bytes before staging", s.scalar(PEAK), 0)))
        ingest_ok(conn, COLUMN_MAPPING, [m.column_row])
        s = settled(url, lambda s: eq("transactions_open with a staged row", s.scalar(OPEN), 1))
        assert s.scalar(PEAK) > 0, f"staged_peak_bytes is {s.scalar(PEAK)} with a row staged"
        peak = s.scalar(PEAK)
        ingest_ok(conn, NAME_MAPPING, m.name_rows)
        s = settled(url, lambda s: eq("requests of the two ingests", s.count(
            REQUESTS, rpc="DoPut", command="CommandStatementIngest", code="OK"), 2))
        assert s.scalar(PEAK) >= peak, f"staged_peak_bytes fell from {peak} to {s.scalar(PEAK)}"
        eq("commits_total before the commit", s.scalar(COMMITS), 0)
        conn.rollback()  # the driver begins the next transaction at once
        s = settled(url, lambda s: (
            eq("EndTransaction OK", s.count(REQUESTS, rpc="DoAction", command="EndTransaction",
                                            code="OK"), 1),
            eq("transactions_open after rollback (the next one is open)", s.scalar(OPEN), 1)))
        eq("commits_total after a rollback", s.scalar(COMMITS), 0)
        assert s.scalar(PEAK) >= peak, "the peak is a peak: a rollback does not lower it"
    finally:
        conn.close()
    s = settled(url, lambda s: eq("transactions_open after close", s.scalar(OPEN), 0))
    eq("BeginTransaction OK", s.count(REQUESTS, rpc="DoAction", command="BeginTransaction",
                                      code="OK"), 2)
    eq("transactions_expired_total", s.scalar(EXPIRED), 0)
    eq("commit_conflicts_total", s.scalar(CONFLICTS), 0)
    no_store_surprises(s)


def test_commit_conflict_between_two_adbc_transactions(server_factory):
    running, url = start(server_factory, "metrics-conflict", fixture=False)
    ids = Ids()
    t, mapping_id = ids.table(), ids.file()
    ma = Mapping(mapping_id, t, [(0, "from_a", 1, None, False)])
    mb = Mapping(mapping_id, t, [(0, "from_b", 1, None, False), (1, "also_b", 2, None, False)])
    a = b = None
    try:
        a, b = connect(running.uri), connect(running.uri)
        stage_mapping(a, ma)
        stage_mapping(b, mb)
        s = settled(url, lambda s: (
            eq("transactions_open", s.scalar(OPEN), 2),
            eq("ingests", s.count(REQUESTS, rpc="DoPut", command="CommandStatementIngest",
                                  code="OK"), 4)))
        assert s.scalar(PEAK) > 0, "staged_peak_bytes with rows staged"
        a.commit()
        settled(url, lambda s: (
            eq("commits_total after the first commit", s.scalar(COMMITS), 1),
            eq("transactions_open (a's next one and b's)", s.scalar(OPEN), 2)))
        with pytest.raises(flightsql.Error) as e:
            b.commit()
        assert "conflict" in str(e.value).lower(), str(e.value)

        def check(s: Metrics) -> None:
            eq("commit_conflicts_total", s.scalar(CONFLICTS), 1)
            eq("commits_total", s.scalar(COMMITS), 1)
            eq("EndTransaction OK", s.count(REQUESTS, rpc="DoAction", command="EndTransaction",
                                            code="OK"), 1)
            eq("EndTransaction ABORTED", s.count(REQUESTS, rpc="DoAction",
                                                 command="EndTransaction", code="ABORTED"), 1)
            eq("BeginTransaction OK", s.count(REQUESTS, rpc="DoAction",
                                              command="BeginTransaction", code="OK"), 3)
            eq("rpc_duration_seconds_count{DoAction,EndTransaction}",
               s.count(RPC_SECONDS + "_count", rpc="DoAction", command="EndTransaction"), 2)
            # After the refused commit b has no transaction; a has its next one.
            eq("transactions_open after the conflict", s.scalar(OPEN), 1)

        s = settled(url, check)
        eq("validation_refusals_total (a conflict is no validation refusal)",
           s.scalar(REFUSALS), 0)
        eq("store_commit_duration_seconds_count (both commits reached the store)",
           s.scalar(STORE_COMMIT + "_count"), FIRST_START_COMMITS + 2)
        no_store_surprises(s)
        check_histograms(s)
    finally:
        for conn in (a, b):
            if conn is not None:
                conn.close()
    diff = diff_states(read_committed(running.uri),
                       ma.added_to(CatalogState(tables={tb: [] for tb in TABLES})))
    assert not diff, f"the first committer's mapping only:\n{diff}"
    settled(url, lambda s: eq("transactions_open after both closed", s.scalar(OPEN), 0))


def test_idle_transaction_expires(server_factory):
    running, url = start(server_factory, "metrics-idle", fixture=False,
                         extra=["--txn-idle-timeout", "1"])
    ids = Ids()
    m = flat_mapping(ids.file(), ids.table(), 2)
    conn = connect(running.uri)
    try:
        ingest_ok(conn, COLUMN_MAPPING, [m.column_row])
        # Left idle: the reaper rolls it back after a second. Polled, with a deadline.
        deadline = time.monotonic() + EXPIRY_WAIT_S
        seen_open = set()
        while True:
            s = scrape(url)
            seen_open.add(s.scalar(OPEN))
            if s.scalar(EXPIRED) >= 1 and s.scalar(OPEN) == 0:
                break
            assert time.monotonic() < deadline, (
                f"no expiry within {EXPIRY_WAIT_S} s: transactions_expired_total "
                f"{s.scalar(EXPIRED)}, transactions_open {s.scalar(OPEN)}\n"
                f"server output:\n{running.server.log(tail=20)}")
            time.sleep(SCRAPE_POLL_S * 4)
        assert seen_open <= {0, 1}, f"transactions_open took the values {sorted(seen_open)}"
        eq("transactions_expired_total", s.scalar(EXPIRED), 1)
        assert s.scalar(PEAK) > 0, "staged_peak_bytes: a row was staged"
        with pytest.raises(flightsql.Error):
            conn.commit()
    finally:
        conn.close()
    s = settled(url, lambda s: eq("EndTransaction OK after the expiry", s.count(
        REQUESTS, rpc="DoAction", command="EndTransaction", code="OK"), 0))
    eq("transactions_expired_total after the late commit", s.scalar(EXPIRED), 1)
    eq("transactions_open", s.scalar(OPEN), 0)
    eq("commits_total", s.scalar(COMMITS), 0)
    eq("commit_conflicts_total", s.scalar(CONFLICTS), 0)
    no_store_surprises(s)
    diff = diff_states(read_committed(running.uri), CatalogState(tables={tb: [] for tb in TABLES}))
    assert not diff, f"the expired transaction wrote:\n{diff}"


# --------------------------------------------------------------------------------------------
# Labels.

MARKERS = ["zebra_marker_sel", "quokka_marker_where", "okapi_marker_param",
           "capybara_marker_table", "walrus_marker_user", "narwhal_marker_user",
           "pangolin_marker_password"]
MARKER_IDS = [8675309123, 7771234567, 4242424242, 6151551616]


def _statement_query(sql: str) -> flight.FlightDescriptor:
    return command("CommandStatementQuery", _bytes_field(1, sql.encode()))


def test_labels_carry_no_sql_user_or_id(server_factory, tmp_path):
    user, password = "walrus_marker_user", "pangolin_marker_password"
    auth_file = tmp_path / "credentials"
    add_user(auth_file, user, "writer", password)
    running, url = start(server_factory, "metrics-labels",
                         extra=["--auth-file", str(auth_file)])
    mapping_id, table_id, unknown_mapping, file_id = MARKER_IDS
    with flight.FlightClient(running.uri) as c:
        key, value = c.authenticate_basic_token(user, password, OPTIONS)
        opts = flight.FlightCallOptions(timeout=30, headers=[(key, value)])
        info = c.get_flight_info(_statement_query("SELECT 'zebra_marker_sel' AS x"), opts)
        got = [c.do_get(ep.ticket, opts).read_all() for ep in info.endpoints]
        assert pa.concat_tables(got).column(0).to_pylist() == ["zebra_marker_sel"]
        with pytest.raises(pa.ArrowException):
            c.get_flight_info(_statement_query("SELECT * FROM capybara_marker_table"), opts)
        with pytest.raises(pa.ArrowException):
            c.get_flight_info(flight.FlightDescriptor.for_path("capybara_marker_table"), opts)
        m = flat_mapping(mapping_id, table_id, 2)
        check_reply(put(c, MAPPING_PATH, committed(mapping_batches([m])), options=opts),
                    rows=2, mappings=1, data_files=0, what="a mapping with marker ids")
        with pytest.raises(pa.ArrowException) as e:
            put(c, DATA_FILE, committed(file_batches([data_file(file_id, table_id,
                                                                unknown_mapping)])),
                options=opts)
        check_refusal(e.value, "INVALID_ARGUMENT", ids=[unknown_mapping], what="unknown mapping")
    with pytest.raises(pa.ArrowException):
        with flight.FlightClient(running.uri) as c:
            c.authenticate_basic_token("narwhal_marker_user", "wrong", OPTIONS)
    with flightsql.connect(running.uri, autocommit=True,
                           db_kwargs={"username": user, "password": password}) as conn:
        with conn.cursor() as cur:
            cur.execute("SELECT source_name FROM ducklake_name_mapping "
                        "WHERE source_name = 'quokka_marker_where' OR mapping_id = 7771234567")
            assert cur.fetchall() == []
            cur.execute("SELECT ? AS y", ("okapi_marker_param",))
            assert cur.fetchall() == [("okapi_marker_param",)]

    def check(s: Metrics) -> None:
        codes = {code for (_, _, code) in s.requests()}
        for code in ("OK", "INVALID_ARGUMENT", "UNAUTHENTICATED"):
            assert code in codes, f"no request counted with code {code}: {sorted(codes)}"
        eq("validation_refusals_total", s.scalar(REFUSALS), 1)

    s = settled(url, check)
    lower = s.text.lower()
    for marker in MARKERS:
        assert marker.lower() not in lower, f"`{marker}` appears in the metrics:\n" + "\n".join(
            l for l in s.text.splitlines() if marker.lower() in l.lower())
    for ident in MARKER_IDS:
        assert not mentions_id(s.text, ident), f"the id {ident} appears in the metrics"
    for (name, labels), _ in s.samples.items():
        for label, value in labels:
            if label == "le":
                float(value)  # a bucket bound
                assert name.endswith("_bucket"), f"`le` on {name}"
                continue
            allowed = LABEL_VALUES.get(label)
            assert allowed is not None, f"{name}: unexpected label `{label}`"
            assert value in allowed, f"{name}: {label}={value!r} is not one of the fixed values"
    check_histograms(s)
    no_store_surprises(s)
