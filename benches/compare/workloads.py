"""The workloads: what each one sends, what it times, and how it checks the answer.

Every timed unit is measured on the client with `time.perf_counter`. Connections and Flight
clients are opened before the timer starts (and kept for all rounds of a workload); ending a
read's transaction, checking results and preparing data are never timed.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl

from .catalog import Batch, Catalog
from .procs import HarnessError
from .targets import Target, count_rows

LOAD_SQL = ("SELECT mapping_id, table_id, type, column_id, source_name, target_field_id, "
            "parent_column, is_partition FROM ducklake_column_mapping "
            "JOIN ducklake_name_mapping USING (mapping_id)")
LOAD_ORDER = " ORDER BY mapping_id, parent_column NULLS FIRST"

# Ingest batches: large, but well under the ADBC Flight SQL client's 16 MiB message limit.
INGEST_BATCH_BYTES = 4 << 20
COMMIT_PATH = "ducklake_commit"
CURSOR_MAPPINGS = 10
W4M_TARGET_MAPPINGS = 104


def mapping_load_sql(where: str = "") -> str:
    """DuckLake's mapping load, with an optional WHERE placed before its ORDER BY."""
    return LOAD_SQL + (f" WHERE {where}" if where else "") + LOAD_ORDER


def chunked(table: pa.Table, target_bytes: int = INGEST_BATCH_BYTES) -> pa.Table:
    """The table re-cut into record batches of about `target_bytes`."""
    if table.num_rows == 0:
        return table
    per_row = max(1, table.nbytes // table.num_rows)
    rows = max(1024, target_bytes // per_row)
    return pa.Table.from_batches(table.to_batches(max_chunksize=rows), table.schema)


class Mismatch(HarnessError):
    """A result that is not what the generator says it must be."""


@dataclass
class Sample:
    seconds: float  # wall time of the timed unit
    rows: int  # rows read or written by the unit
    commits: int = 0  # commits in the unit (W5)
    latencies: List[float] = field(default_factory=list)  # per commit (W5)
    rss_peak: Optional[int] = None  # moraine's VmHWM over the unit, bytes
    rss_start: Optional[int] = None  # moraine's VmRSS when the unit started, bytes
    cpu_seconds: Optional[float] = None  # moraine's CPU time over the unit, all threads


class ServerProbe:
    """moraine's process over one timed unit (nothing for the other targets): started where
    the unit starts, which resets the peak RSS; `end()` where its timing ends gives the
    sample's fields for the RSS it started from, its peak, and the CPU time it spent."""

    def __init__(self, target: Target):
        self.target = target
        self.rss_start = target.rss_reset()
        self.cpu_start = target.cpu_seconds()

    def end(self) -> Dict[str, Any]:
        rss = self.target.rss()
        cpu = self.target.cpu_seconds()
        spent = None
        if cpu is not None and self.cpu_start is not None:
            spent = round(cpu - self.cpu_start, 3)
        return {"rss_peak": rss.get("VmHWM") if rss else None, "rss_start": self.rss_start,
                "cpu_seconds": spent}


@dataclass
class Outcome:
    samples: List[Sample] = field(default_factory=list)
    error: Optional[str] = None  # the first failure; the workload stops there for the target
    skipped: Optional[str] = None


class Workload:
    key = ""
    title = ""
    rate = False  # reported as commits/s (else as time)
    only: Optional[Sequence[str]] = None  # the target keys it runs on (None: all)

    def __init__(self) -> None:
        self._sessions: Dict[str, object] = {}

    def applies(self, target: Target) -> bool:
        return self.only is None or target.key in self.only

    def describe(self) -> Dict[str, object]:
        return {"title": self.title}

    def label(self) -> str:
        """The report's short name for the workload."""
        return self.title

    def prepare(self, round_index: int) -> object:
        """Data for one round, shared by every target (not timed)."""
        return None

    def run(self, target: Target, data: object) -> Sample:
        raise NotImplementedError

    # Connections live for the whole workload, opened before any timing.
    def connection(self, target: Target):
        conn = self._sessions.get(target.key)
        if conn is None:
            conn = target.connect()
            self._sessions[target.key] = conn
        return conn

    def drop_session(self, target: Target) -> None:
        conn = self._sessions.pop(target.key, None)
        if conn is not None:
            _close_quietly(conn)

    def close(self) -> None:
        for key in list(self._sessions):
            _close_quietly(self._sessions.pop(key))


def _close_quietly(obj) -> None:
    try:
        obj.close()
    except Exception:
        pass


def _ingest(cur, batch_tables) -> List[int]:
    return [cur.adbc_ingest(name, table, mode="append") for name, table in batch_tables]


def _check_ingested(counts: List[int], batch_tables) -> None:
    for (name, table), count in zip(batch_tables, counts):
        # -1: the driver does not know; every driver here does.
        if count != -1 and count != table.num_rows:
            raise Mismatch(f"ingest into {name} reported {count} rows, sent {table.num_rows}")


@dataclass(frozen=True)
class Expected:
    """What a write must have stored: its rows, in the id range [first_id, next_id)."""
    first_id: int
    next_id: int
    mappings: int
    names: int
    files: int

    @staticmethod
    def of(parts: Sequence[Batch]) -> "Expected":
        return Expected(parts[0].first_id, parts[-1].next_id,
                        sum(p.column_mapping.num_rows for p in parts),
                        sum(p.name_mapping.num_rows for p in parts),
                        sum(p.data_file.num_rows for p in parts))


def check_stored(conn, expected: Expected) -> None:
    """Exactly the written rows are stored in their id range (read back, not timed)."""
    lo, hi = expected.first_id, expected.next_id
    by_mapping = f"mapping_id >= {lo} AND mapping_id < {hi}"
    got = count_rows(conn, {"ducklake_column_mapping": by_mapping,
                            "ducklake_name_mapping": by_mapping,
                            "ducklake_data_file": f"data_file_id >= {lo} AND data_file_id < {hi}"})
    want = {"ducklake_column_mapping": expected.mappings,
            "ducklake_name_mapping": expected.names,
            "ducklake_data_file": expected.files}
    if got != want:
        raise Mismatch(f"stored rows {got}, expected {want}")


# --- L ---------------------------------------------------------------------------------------

class Load(Workload):
    key = "L"
    title = "load the catalog into an empty target, one transaction"

    def __init__(self, catalog: Catalog, tables):
        super().__init__()
        self.catalog = catalog
        self.tables = tables  # [(name, chunked table)], DuckLake's insert order
        self.rows = catalog.rows
        self.payload_bytes = payload_bytes(tables)

    def describe(self):
        return {"title": self.title, "rows": self.rows, "payload_bytes": self.payload_bytes,
                "how": "adbc_ingest(mode='append') into ducklake_column_mapping, "
                       "ducklake_name_mapping, ducklake_data_file, then commit; a fresh "
                       "empty target each round (not timed)"}

    def label(self) -> str:
        return f"load {self.rows:,} rows in 1 txn"

    def run(self, target: Target, data: object) -> Sample:
        target.loaded = False
        target.reset_empty()
        return load_catalog(target, self.tables, self.rows)


def payload_bytes(tables) -> int:
    """The Arrow size of the rows a unit writes (`[(name, table)]`): what the issue's memory
bound for L and W5b is a multiple of."""
    return sum(table.nbytes for _, table in tables)


def load_catalog(target: Target, tables, rows: int) -> Sample:
    """Ingest the three tables in one transaction and commit; checks the stored counts."""
    conn = target.connect()
    try:
        with conn.cursor() as cur:
            server = ServerProbe(target)
            started = time.perf_counter()
            counts = _ingest(cur, tables)
            conn.commit()
            seconds = time.perf_counter() - started
            usage = server.end()
        _check_ingested(counts, tables)
        if target.has_storage:
            got = count_rows(conn)
            want = {name: table.num_rows for name, table in tables}
            if got != want:
                raise Mismatch(f"stored rows {got}, expected {want}")
    finally:
        _close_quietly(conn)
    target.loaded = True
    return Sample(seconds, rows, commits=1, **usage)


# --- W1-W4 -----------------------------------------------------------------------------------

def order_violations(table: pa.Table) -> int:
    """Rows out of the load's order (mapping_id, parent_column NULLS FIRST)."""
    if table.num_rows < 2:
        return 0
    mapping = pc.cast(table.column("mapping_id").combine_chunks(), pa.int64())
    parent = pc.cast(table.column("parent_column").combine_chunks(), pa.int64())
    n = table.num_rows
    m_next, m_prev = mapping.slice(1), mapping.slice(0, n - 1)
    p_next, p_prev = parent.slice(1), parent.slice(0, n - 1)
    null_next, null_prev = pc.is_null(p_next), pc.is_null(p_prev)
    same = pc.equal(m_next, m_prev)
    bad = pc.or_(
        pc.less(m_next, m_prev),
        pc.and_(same, pc.or_(
            pc.and_(null_next, pc.invert(null_prev)),
            pc.fill_null(pc.less(p_next, p_prev), False))))
    return int(pc.sum(pc.cast(bad, pa.int64())).as_py() or 0)


class Read(Workload):
    def __init__(self, key: str, title: str, short: str, sql: str, expected_rows: int,
                 ordered: bool, note: str = "", mappings: Optional[int] = None):
        super().__init__()
        self.mappings = mappings
        self.key = key
        self.title = title
        self.short = short
        self.sql = sql
        self.expected_rows = expected_rows
        self.ordered = ordered
        self.note = note

    def describe(self):
        out = {"title": self.title, "sql": self.sql, "rows": self.expected_rows,
               "how": "cursor.execute(sql); cursor.fetch_arrow_table(), in a transaction of "
                      "its own (its rollback not timed)"}
        if self.note:
            out["note"] = self.note
        return out

    def label(self) -> str:
        if self.mappings is not None:
            return f"{self.short} ({self.mappings:,} mappings, {self.expected_rows:,} rows)"
        return f"{self.short} ({self.expected_rows:,} rows)"

    def run(self, target: Target, data: object) -> Sample:
        conn = self.connection(target)
        with conn.cursor() as cur:
            server = ServerProbe(target)
            started = time.perf_counter()
            cur.execute(self.sql)
            table = cur.fetch_arrow_table()
            seconds = time.perf_counter() - started
            usage = server.end()
        conn.rollback()
        if table.num_rows != self.expected_rows:
            raise Mismatch(f"{table.num_rows} rows, expected {self.expected_rows}")
        if self.ordered:
            bad = order_violations(table)
            if bad:
                raise Mismatch(f"{bad} rows out of ORDER BY mapping_id, parent_column "
                               "NULLS FIRST")
        return Sample(seconds, table.num_rows, **usage)


# --- W5s, W5b: writes through ADBC ------------------------------------------------------------

class SequentialCommits(Workload):
    key = "W5s"
    rate = True

    def __init__(self, catalog: Catalog, commits: int, names_per_mapping: int):
        super().__init__()
        self.catalog = catalog
        self.commits = commits
        self.names = names_per_mapping
        self.title = (f"{commits} sequential commits of 1 mapping + {names_per_mapping} name "
                      "rows + 1 data file (ADBC ingest x3 + commit)")

    def describe(self):
        return {"title": self.title, "commits": self.commits,
                "rows_per_commit": 2 + self.names,
                "how": "per commit: adbc_ingest x3 (mapping, names, file) then commit; new ids "
                       "above everything stored"}

    def label(self) -> str:
        return f"{self.commits} commits via ADBC"

    def prepare(self, round_index: int):
        batch = self.catalog.new_batch(f"{self.key}:{round_index}", self.commits, [self.names])
        self.catalog.advance(batch)
        return batch.split()

    def run(self, target: Target, data) -> Sample:
        commits: List[Batch] = data
        conn = self.connection(target)
        latencies = []
        rows = 0
        with conn.cursor() as cur:
            server = ServerProbe(target)
            started = time.perf_counter()
            for commit in commits:
                tables = commit.tables()
                t0 = time.perf_counter()
                counts = _ingest(cur, tables)
                conn.commit()
                latencies.append(time.perf_counter() - t0)
                _check_ingested(counts, tables)  # cheap, between commits
                rows += commit.rows
            seconds = time.perf_counter() - started
            usage = server.end()
        if target.has_storage:
            check_stored(conn, Expected.of(commits))
        return Sample(seconds, rows, commits=len(commits), latencies=latencies,
                      **usage)


class BulkCommit(Workload):
    key = "W5b"

    def __init__(self, catalog: Catalog, mappings: int):
        super().__init__()
        self.catalog = catalog
        self.mappings = mappings
        self.title = (f"one transaction of {mappings:,} new mappings (about 10 name rows and "
                      "1 data file each) on the loaded catalog")
        self.payload_bytes = 0  # the largest round's

    def describe(self):
        return {"title": self.title, "mappings": self.mappings,
                "payload_bytes": self.payload_bytes,
                "how": "adbc_ingest x3 then commit; new ids each round"}

    def label(self) -> str:
        return f"one {self.mappings:,}-mapping txn"

    def prepare(self, round_index: int):
        batch = self.catalog.new_batch(f"{self.key}:{round_index}", self.mappings,
                                       range(8, 13))
        self.catalog.advance(batch)
        tables = [(name, chunked(table)) for name, table in batch.tables()]
        self.payload_bytes = max(self.payload_bytes, payload_bytes(tables))
        return batch, tables

    def run(self, target: Target, data) -> Sample:
        batch, tables = data
        conn = self.connection(target)
        with conn.cursor() as cur:
            server = ServerProbe(target)
            started = time.perf_counter()
            counts = _ingest(cur, tables)
            conn.commit()
            seconds = time.perf_counter() - started
            usage = server.end()
        _check_ingested(counts, tables)
        if target.has_storage:
            check_stored(conn, Expected.of([batch]))
        return Sample(seconds, batch.rows, commits=1,
                      **usage)


# --- W5p, W5c: one-stream plain Flight commits ------------------------------------------------

def commit_table(commit: Batch) -> pa.Table:
    """One DoPut stream's rows: the mapping in the load's shape and its data file, each row
    with the other shape's columns NULL (mapping_id and table_id are shared)."""
    return pa.concat_tables([commit.load_rows(), commit.data_file], promote_options="default")


def put_commit(client: fl.FlightClient, table: pa.Table, options: fl.FlightCallOptions) -> dict:
    descriptor = fl.FlightDescriptor.for_path(COMMIT_PATH)
    writer, reader = client.do_put(descriptor, table.schema, options=options)
    try:
        writer.write_table(table)
        writer.write_metadata(b"commit")
        writer.done_writing()
        reply = reader.read()
    finally:
        writer.close()
    if reply is None:
        raise Mismatch("the DoPut stream ended with no PutResult")
    answer = json.loads(reply.to_pybytes())
    if not answer.get("committed"):
        raise Mismatch(f"not committed: {answer}")
    return answer


class FlightCommits(Workload):
    key = "W5p"
    rate = True
    only = ("moraine", "transport")

    def __init__(self, catalog: Catalog, commits: int, names_per_mapping: int, timeout: float):
        super().__init__()
        self.catalog = catalog
        self.commits = commits
        self.names = names_per_mapping
        self.timeout = timeout
        self._clients: Dict[str, fl.FlightClient] = {}
        self.title = (f"W5s through one-stream plain Flight: one DoPut to "
                      f"`{COMMIT_PATH}` per commit")

    def describe(self):
        return {"title": self.title, "commits": self.commits,
                "how": f"client.do_put(FlightDescriptor.for_path('{COMMIT_PATH}')): one table "
                       "(load-shape rows + the data-file row, concat with promote_options="
                       "'default'), write_metadata(b'commit'), done_writing, read the "
                       "PutResult, close"}

    def label(self) -> str:
        return f"{self.commits} commits, one DoPut each"

    def prepare(self, round_index: int):
        batch = self.catalog.new_batch(f"{self.key}:{round_index}", self.commits, [self.names])
        self.catalog.advance(batch)
        parts = batch.split()
        return parts, [commit_table(p) for p in parts]

    def client(self, target: Target) -> fl.FlightClient:
        client = self._clients.get(target.key)
        if client is None:
            client = fl.FlightClient(target.flight_uri())
            self._clients[target.key] = client
        return client

    def run(self, target: Target, data) -> Sample:
        parts, tables = data
        client = self.client(target)
        options = fl.FlightCallOptions(timeout=self.timeout)
        latencies = []
        rows = 0
        server = ServerProbe(target)
        started = time.perf_counter()
        for part, table in zip(parts, tables):
            t0 = time.perf_counter()
            put_commit(client, table, options)
            latencies.append(time.perf_counter() - t0)
            rows += part.rows
        seconds = time.perf_counter() - started
        usage = server.end()
        if target.has_storage:
            check_stored(self.connection(target), Expected.of(parts))
        return Sample(seconds, rows, commits=len(parts), latencies=latencies,
                      **usage)

    def close(self) -> None:
        super().close()
        for key in list(self._clients):
            _close_quietly(self._clients.pop(key))


class ConcurrentFlightCommits(FlightCommits):
    key = "W5c"

    def __init__(self, catalog: Catalog, commits: int, names_per_mapping: int, timeout: float,
                 writers: int):
        super().__init__(catalog, commits, names_per_mapping, timeout)
        self.writers = writers
        self._pools: Dict[str, List[fl.FlightClient]] = {}
        self.title = (f"{writers} concurrent W5p writers (threads, a FlightClient each, "
                      f"disjoint ids), {commits} commits in total")

    def describe(self):
        out = super().describe()
        out.update(title=self.title, writers=self.writers,
                   how="W5p's commits split into contiguous shares, one per writer thread; "
                       "timed from a common start barrier until the last writer finishes")
        return out

    def label(self) -> str:
        return f"W5p by {self.writers} concurrent writers"

    def run(self, target: Target, data) -> Sample:
        parts, tables = data
        pool = self._pools.get(target.key)
        if pool is None:
            pool = [fl.FlightClient(target.flight_uri()) for _ in range(self.writers)]
            self._pools[target.key] = pool
        options = fl.FlightCallOptions(timeout=self.timeout)
        shares = _split(list(range(len(tables))), self.writers)
        latencies: List[List[float]] = [[] for _ in shares]
        errors: List[str] = []
        barrier = threading.Barrier(len(shares) + 1)

        def writer(w: int) -> None:
            try:
                barrier.wait(timeout=60)
            except threading.BrokenBarrierError:
                return
            try:
                for i in shares[w]:
                    t0 = time.perf_counter()
                    put_commit(pool[w], tables[i], options)
                    latencies[w].append(time.perf_counter() - t0)
            except Exception as err:  # reported by the main thread
                errors.append(f"writer {w}: {err}")

        threads = [threading.Thread(target=writer, args=(w,), daemon=True)
                   for w in range(len(shares))]
        for thread in threads:
            thread.start()
        server = ServerProbe(target)
        barrier.wait(timeout=60)
        started = time.perf_counter()
        deadline = time.monotonic() + self.timeout + 60
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        seconds = time.perf_counter() - started
        usage = server.end()
        if any(thread.is_alive() for thread in threads):
            raise HarnessError("a writer thread did not finish within its time bound")
        if errors:
            raise HarnessError("; ".join(errors[:3]))
        if target.has_storage:
            check_stored(self.connection(target), Expected.of(parts))
        return Sample(seconds, sum(p.rows for p in parts), commits=len(parts),
                      latencies=[x for per in latencies for x in per],
                      **usage)

    def close(self) -> None:
        super().close()
        for key in list(self._pools):
            for client in self._pools.pop(key):
                _close_quietly(client)


def _split(items: list, parts: int) -> List[list]:
    """Contiguous shares, sizes differing by at most one, none empty."""
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return out


# --- the read set ----------------------------------------------------------------------------

@dataclass
class ReadPlan:
    """The read workloads' SQL and expected answers, from the generator."""
    reads: List[Read]
    w4m_table: tuple  # (table_id, mappings, name rows)
    w4l_table: tuple
    cursor: int
    results: Dict[str, Callable[[], pa.Table]]  # sql -> the answer (for the transport anchor)


def read_plan(catalog: Catalog) -> ReadPlan:
    sizes = catalog.table_sizes()
    names = catalog.name_mapping.num_rows
    w4m = min(sizes.items(), key=lambda kv: (abs(kv[1][0] - W4M_TARGET_MAPPINGS), kv[0]))
    w4l = max(sizes.items(), key=lambda kv: (kv[1][0], -kv[0]))
    cursor, cursor_rows = catalog.cursor_for_last(CURSOR_MAPPINGS)
    full = mapping_load_sql()
    w3 = mapping_load_sql(f"mapping_id >= {cursor}")
    w4m_sql = mapping_load_sql(f"table_id = {w4m[0]}")
    w4l_sql = mapping_load_sql(f"table_id = {w4l[0]}")
    reads = [
        Read("W1", "SELECT * FROM ducklake_name_mapping", "`SELECT *` name_mapping",
             "SELECT * FROM ducklake_name_mapping", names, ordered=False),
        Read("W2", "DuckLake's full mapping load", "full mapping load", full, names,
             ordered=True),
        Read("W3", f"the load's cursor form, last {CURSOR_MAPPINGS} mappings",
             f"cursor load, last {CURSOR_MAPPINGS} mappings", w3, cursor_rows, ordered=True,
             note=f"cursor mapping_id >= {cursor}"),
        Read("W4m", f"the load for one table of {w4m[1][0]:,} mappings",
             "one table's load", w4m_sql, w4m[1][1], ordered=True,
             note=f"WHERE table_id = {w4m[0]}", mappings=w4m[1][0]),
        Read("W4L", f"the load for the largest table ({w4l[1][0]:,} mappings)",
             "largest table's load", w4l_sql, w4l[1][1], ordered=True,
             note=f"WHERE table_id = {w4l[0]}", mappings=w4l[1][0]),
    ]

    cache: Dict[str, pa.Table] = {}

    def load() -> pa.Table:
        if "load" not in cache:
            cache["load"] = catalog.mapping_load()
        return cache["load"]

    results = {
        reads[0].sql: lambda: catalog.name_mapping,
        full: load,
        w3: lambda: load().filter(pc.greater_equal(load().column("mapping_id"), cursor)),
        w4m_sql: lambda: load().filter(pc.equal(load().column("table_id"), w4m[0])),
        w4l_sql: lambda: load().filter(pc.equal(load().column("table_id"), w4l[0])),
    }
    return ReadPlan(reads, (w4m[0],) + w4m[1], (w4l[0],) + w4l[1], cursor, results)


ALL_WORKLOADS = ("L", "W1", "W2", "W3", "W4m", "W4L", "W5s", "W5b", "W5p", "W5c")
