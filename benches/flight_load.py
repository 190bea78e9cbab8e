#!/usr/bin/env python3
"""DuckLake's mapping loads through Flight SQL, against anchors measured in the same run.

The brief's bar is DuckLake's own reads, compared with what the Flight transport allows:

* full load: DuckLake's first mapping load of a process, verbatim (the join of both mapping
  tables, ordered), through the ADBC Flight SQL driver, as DuckLake's catalog client would run
  it. Anchor: a plain-Flight DoGet of `ducklake_name_mapping` (the same rows, no join, no
  sort) through pyarrow.flight: the scan and the transport alone.
* incremental load: the same query with DuckLake's `WHERE mapping_id >= <cursor>`, the cursor
  placed so that it returns the last 10 mappings. Anchor: `SELECT 1` through the same ADBC
  path (prepare, GetFlightInfo, DoGet): the protocol's round trips alone.

Each figure is the median of `--runs` alternating runs (A B A B …) on one warm connection;
ratios are taken pair by pair, so machine drift between pairs cancels. Connecting and Python's
start-up are not timed.

The store is built once, through the write path (one-stream DoPut uploads of `--chunk`
mappings each, each an atomic commit), into `--data`; a later run on the same directory reuses
it. Each mapping has DuckLake's shape for a table `(id, s STRUCT(a, b))` with a hive partition
column: 5 name rows.

Usage (a release build is what the figures are for):

    cargo build --release
    python benches/flight_load.py --binary target/release/moraine --data /tmp/moraine-bench \\
        --mappings 1000000

Needs pyarrow and adbc-driver-flightsql (the Python suite's venv has both).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, List, Optional

import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow as pa
import pyarrow.flight as fl

LOAD = ("SELECT mapping_id, table_id, type, column_id, source_name, target_field_id, "
        "parent_column, is_partition FROM ducklake_column_mapping "
        "JOIN ducklake_name_mapping USING (mapping_id)")
ORDER = " ORDER BY mapping_id, parent_column NULLS FIRST"
TABLES = 1000


NAMES = [("id", 1, None, False), ("s", 2, None, False), ("a", 3, 1, False),
         ("b", 4, 1, False), ("part", 5, None, True)]


def mapping_rows(first: int, count: int) -> pa.Table:
    """`count` mappings from index `first`, in DuckLake's mapping load shape. Mapping ids are
    even (DuckLake spends ids on data files between them); they spread over `TABLES` tables."""
    cols: dict = {name: [] for name in ("mapping_id", "table_id", "type", "column_id",
                                        "source_name", "target_field_id", "parent_column",
                                        "is_partition")}
    for i in range(first, first + count):
        for column_id, (source, target, parent, partition) in enumerate(NAMES):
            cols["mapping_id"].append(2 * i)
            cols["table_id"].append(i % TABLES + 1)
            cols["type"].append("map_by_name")
            cols["column_id"].append(column_id)
            cols["source_name"].append(source)
            cols["target_field_id"].append(target)
            cols["parent_column"].append(parent)
            cols["is_partition"].append(partition)
    types = {"type": pa.utf8(), "source_name": pa.utf8(), "is_partition": pa.bool_()}
    return pa.table({k: pa.array(v, types.get(k, pa.int64())) for k, v in cols.items()})


def upload(uri: str, rows: pa.Table) -> dict:
    client = fl.FlightClient(uri)
    writer, reader = client.do_put(fl.FlightDescriptor.for_path("ducklake_mapping"), rows.schema)
    writer.write_table(rows, max_chunksize=65536)
    writer.write_metadata(b"commit")
    writer.done_writing()
    reply = json.loads(reader.read().to_pybytes())
    writer.close()
    client.close()
    return reply


def stored_mappings(uri: str) -> int:
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM ducklake_column_mapping")
        return cur.fetchone()[0]


def build(uri: str, mappings: int, chunk: int) -> None:
    have = stored_mappings(uri)
    if have == mappings:
        print(f"store holds {have} mappings already", flush=True)
        return
    if have:
        sys.exit(f"store holds {have} mappings, not {mappings}: use another --data directory")
    started = time.perf_counter()
    for first in range(0, mappings, chunk):
        reply = upload(uri, mapping_rows(first, min(chunk, mappings - first)))
        assert reply["committed"], reply
    print(f"loaded {mappings} mappings ({mappings * len(NAMES)} name rows) through "
          f"DoPut in {time.perf_counter() - started:.1f} s", flush=True)


def timed(run: Callable[[], int]) -> tuple[float, int]:
    started = time.perf_counter()
    rows = run()
    return time.perf_counter() - started, rows


def compare(name: str, a_name: str, a: Callable[[], int], b_name: str, b: Callable[[], int],
            runs: int) -> None:
    a(), b()  # warm-up
    pairs = []
    rows = (0, 0)
    for _ in range(runs):
        (ta, ra), (tb, rb) = timed(a), timed(b)
        pairs.append((ta, tb))
        rows = (ra, rb)
    med = lambda xs: statistics.median(xs)  # noqa: E731
    ratios = [ta / tb for ta, tb in pairs]
    print(f"{name}:")
    print(f"  {a_name:<40} {med([p[0] for p in pairs]) * 1000:10.1f} ms  ({rows[0]} rows)")
    print(f"  {b_name:<40} {med([p[1] for p in pairs]) * 1000:10.1f} ms  ({rows[1]} rows)")
    print(f"  ratio, median of pairs (min-max)        {med(ratios):10.2f}   "
          f"({min(ratios):.2f}-{max(ratios):.2f})", flush=True)


def start(binary: Path, data: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([str(binary), "serve", "--listen", "127.0.0.1:0", "--data", str(data)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        m = re.search(r"listening on (\S+)", line)
        if m:
            return proc, f"grpc://{m.group(1)}"
        if not line and proc.poll() is not None:
            break
    proc.kill()
    sys.exit("moraine serve did not start")


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--uri", help="a running server (its store is built if empty)")
    where.add_argument("--binary", type=Path, help="a moraine binary to start on --data")
    ap.add_argument("--data", type=Path, help="data directory for --binary (default: a temp dir)")
    ap.add_argument("--mappings", type=int, default=100_000)
    ap.add_argument("--chunk", type=int, default=100_000, help="mappings per upload")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args(argv)

    proc = None
    temp = None
    try:
        if args.binary:
            data = args.data
            if data is None:
                temp = tempfile.mkdtemp(prefix="moraine-bench-")
                data = Path(temp)
            proc, uri = start(args.binary, data)
        else:
            uri = args.uri
        build(uri, args.mappings, args.chunk)

        conn = flight_sql.connect(uri, autocommit=True)
        cur = conn.cursor()
        client = fl.FlightClient(uri)
        cursor = (args.mappings - 10) * 2

        def full() -> int:
            cur.execute(LOAD + ORDER)
            return cur.fetch_arrow_table().num_rows

        def incremental() -> int:
            cur.execute(f"{LOAD} WHERE mapping_id >= {cursor}{ORDER}")
            return cur.fetch_arrow_table().num_rows

        def select_one() -> int:
            cur.execute("SELECT 1")
            return cur.fetch_arrow_table().num_rows

        def name_table() -> int:
            info = client.get_flight_info(fl.FlightDescriptor.for_path("ducklake_name_mapping"))
            return sum(client.do_get(e.ticket).read_all().num_rows for e in info.endpoints)

        print(f"{args.mappings} mappings, {args.runs} runs each", flush=True)
        compare("full mapping load", "DuckLake's load query (ADBC)", full,
                "plain DoGet of ducklake_name_mapping", name_table, args.runs)
        compare("incremental load (10 mappings)", "DuckLake's cursor query (ADBC)", incremental,
                "SELECT 1 (ADBC)", select_one, args.runs)
        cur.close()
        conn.close()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    main()
