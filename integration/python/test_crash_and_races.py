"""Acknowledged means stored, and contested means one winner.

- The server is killed with SIGKILL at 50 points while several clients commit (through ADBC
  transactions and one-stream DoPut): after each restart every acknowledged commit is there,
  and no commit is there in part.
- 16 writers race on overlapping mapping ids, data file ids and tables, half through ADBC and
  half through DoPut: each contested key has exactly one winner, what is stored is exactly the
  winners' commits, and every loser was told it lost.
"""

from __future__ import annotations

import json
import random
import threading
from collections import Counter
from typing import Dict, List, Optional, Tuple

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from conftest import (
    COLUMN_MAPPING,
    DATA_FILE,
    NAME_MAPPING,
    Mapping,
    Server,
    arrow_rows,
    autocommit_cursor,
    data_file,
    moraine_bin,
)
from test_pyarrow_flight import OPTIONS
from test_writes_pyarrow import MAPPING_STREAM_COLUMNS

COMMIT_PATH = "ducklake_commit"
NAMES = 4  # name rows per mapping: a partial commit would show fewer
KILL_POINTS = 50


def tagged_mapping(mapping_id: int, table_id: int, tag: str) -> Mapping:
    return Mapping(mapping_id, table_id,
                   [(i, f"{tag}_c{i}", i + 1, None, False) for i in range(NAMES)])


def tagged_file(data_file_id: int, table_id: int, mapping_id: Optional[int], tag: str):
    return data_file(data_file_id, table_id, mapping_id, path=f"/lake/{tag}/f{data_file_id}")


def put_commit(client: flight.FlightClient, m: Mapping, f: tuple) -> None:
    """One plain-Flight stream: the mapping in the load's shape and its file, committed."""
    table = pa.concat_tables([arrow_rows(NAME_MAPPING, m.join_rows, MAPPING_STREAM_COLUMNS),
                              arrow_rows(DATA_FILE, [f])], promote_options="default")
    writer, reader = client.do_put(flight.FlightDescriptor.for_path(COMMIT_PATH), table.schema,
                                   OPTIONS)
    try:
        for batch in table.to_batches(max_chunksize=2):
            writer.write_batch(batch)
        writer.write_metadata(b"commit")
        writer.done_writing()
        reply = reader.read()
    finally:
        writer.close()
    assert reply is not None and json.loads(reply.to_pybytes()).get("committed"), reply


def adbc_commit(conn, m: Mapping, f: tuple) -> None:
    """One ADBC transaction: the mapping's rows, its name rows and its file, then commit."""
    with conn.cursor() as cur:
        cur.adbc_ingest(COLUMN_MAPPING, arrow_rows(COLUMN_MAPPING, [m.column_row]), mode="append")
        cur.adbc_ingest(NAME_MAPPING, arrow_rows(NAME_MAPPING, m.name_rows), mode="append")
        cur.adbc_ingest(DATA_FILE, arrow_rows(DATA_FILE, [f]), mode="append")
    conn.commit()


def stored(uri: str) -> Tuple[Dict[int, Tuple[int, List[str]]], Dict[int, Tuple[int, str]]]:
    """Mappings as {mapping_id: (table_id, source names)}, files as {data_file_id: (table_id,
    path)}."""
    with autocommit_cursor(uri) as cur:
        cur.execute("SELECT m.mapping_id, m.table_id, n.source_name FROM "
                    "ducklake_column_mapping m JOIN ducklake_name_mapping n "
                    "ON m.mapping_id = n.mapping_id ORDER BY m.mapping_id, n.column_id")
        mappings: Dict[int, Tuple[int, List[str]]] = {}
        for mapping_id, table_id, name in cur.fetchall():
            mappings.setdefault(mapping_id, (table_id, []))[1].append(name)
        cur.execute("SELECT data_file_id, table_id, path FROM ducklake_data_file")
        files = {i: (t, p) for i, t, p in cur.fetchall()}
    return mappings, files


def test_acknowledged_commits_survive_sigkill_at_50_points(tmp_path):
    rng = random.Random(20261201)
    binary = moraine_bin()
    data_dir = tmp_path / "data"
    acked: Dict[int, int] = {}  # mapping_id -> data_file_id, once acknowledged
    lock = threading.Condition()
    next_id = iter(range(1_000_000, 10_000_000, 2))
    for point in range(KILL_POINTS):
        server = Server(binary, data_dir, f"crash-{point}")
        try:
            uri = server.wait_listening()
            mappings, files = stored(uri)
            with lock:
                expected = dict(acked)
            for mapping_id, file_id in expected.items():
                assert mapping_id in mappings and file_id in files, \
                    f"kill point {point}: acknowledged commit of mapping {mapping_id} lost"
            for mapping_id, (_, names) in mappings.items():
                assert len(names) == NAMES, f"kill point {point}: mapping {mapping_id} partial"
                assert mapping_id + 1 in files, \
                    f"kill point {point}: mapping {mapping_id} stored without its file"
            assert len(files) == len(mappings), f"kill point {point}: a file without its mapping"

            # Writers commit until the server dies; it dies a few acknowledgements on.
            target = len(expected) + rng.randint(1, 6)
            stop = threading.Event()

            def writer(kind: str) -> None:
                client = conn = None
                try:
                    if kind == "flight":
                        client = flight.FlightClient(uri)
                    else:
                        # A connection that could not begin its transaction (the server died
                        # under it) would commit each ingest on its own: it must not write.
                        conn = flightsql.connect(uri)
                        if not getattr(conn, "_commit_supported", True):
                            return
                    while not stop.is_set():
                        with lock:
                            mapping_id = next(next_id)
                        m = tagged_mapping(mapping_id, 1 + mapping_id % 3, "crash")
                        f = tagged_file(mapping_id + 1, m.table_id, mapping_id, "crash")
                        if client is not None:
                            put_commit(client, m, f)
                        else:
                            adbc_commit(conn, m, f)
                        with lock:
                            acked[mapping_id] = mapping_id + 1
                            lock.notify_all()
                except Exception:  # the server was killed under the call
                    pass
                finally:
                    for closable in (client, conn):
                        try:
                            if closable is not None:
                                closable.close()
                        except Exception:
                            pass

            threads = [threading.Thread(target=writer, args=(kind,))
                       for kind in ("flight", "flight", "adbc", "adbc")]
            for t in threads:
                t.start()
            with lock:
                assert lock.wait_for(lambda: len(acked) >= target, timeout=60), \
                    f"kill point {point}: no progress: {server.log(tail=20)}"
            server.proc.kill()
            server.proc.wait(30)
            stop.set()
            for t in threads:
                t.join(60)
        finally:
            if server.proc.poll() is None:
                server.proc.kill()
                server.proc.wait(30)
    # A last restart, a clean stop: everything acknowledged is there.
    server = Server(binary, data_dir, "crash-final")
    try:
        mappings, files = stored(server.wait_listening())
        assert set(acked) <= set(mappings), "acknowledged commits lost"
        assert len(acked) >= KILL_POINTS
    finally:
        assert server.stop() is None


def test_sixteen_writers_on_overlapping_keys_have_one_winner_per_key(server_factory):
    running = server_factory("races", steps_file=None)
    uri = running.uri
    tables = (501, 502)
    mapping_ids = [600_000 + 10 * i for i in range(4)]
    file_ids = [700_000 + 10 * i for i in range(4)]

    def commit_of(writer: int) -> Tuple[Mapping, tuple]:
        tag = f"w{writer}"
        m = tagged_mapping(mapping_ids[writer % 4], tables[0], tag)
        # The file's id is contested across both tables.
        f = tagged_file(file_ids[(writer // 4) % 4], tables[writer % 2], None, tag)
        return m, f

    barrier = threading.Barrier(16)
    outcomes: Dict[int, Optional[str]] = {}

    def writer(w: int) -> None:
        m, f = commit_of(w)
        if w % 2 == 0:
            conn = flightsql.connect(uri)
            try:
                barrier.wait()
                adbc_commit(conn, m, f)
                outcomes[w] = None
            except flightsql.Error as e:
                outcomes[w] = str(e)
            finally:
                conn.close()
        else:
            with flight.FlightClient(uri) as client:
                barrier.wait()
                try:
                    put_commit(client, m, f)
                    outcomes[w] = None
                except pa.ArrowException as e:
                    outcomes[w] = str(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(outcomes) == 16, outcomes
    winners = sorted(w for w, err in outcomes.items() if err is None)
    for w, err in outcomes.items():
        if err is not None:
            assert "conflict" in err.lower() or "already exists" in err.lower() \
                or "already_exists" in err.lower(), f"writer {w} lost without being told: {err}"
    assert winners, "nobody won"
    # One winner per contested key.
    won_mappings = Counter(commit_of(w)[0].mapping_id for w in winners)
    won_files = Counter(commit_of(w)[1][0] for w in winners)
    assert max(won_mappings.values()) == 1, f"a mapping id won twice: {won_mappings}"
    assert max(won_files.values()) == 1, f"a data file id won twice: {won_files}"
    # What is stored is exactly the winners' commits.
    mappings, files = stored(uri)
    want_mappings = {}
    want_files = {}
    for w in winners:
        m, f = commit_of(w)
        want_mappings[m.mapping_id] = (m.table_id, [n[1] for n in m.names])
        want_files[f[0]] = (f[1], f"/lake/w{w}/f{f[0]}")
    assert mappings == want_mappings
    assert files == want_files
