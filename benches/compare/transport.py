"""The transport anchor: a minimal in-memory Flight SQL server that answers each benchmark query
with a precomputed Arrow result and discards every ingested row.

It measures what the Flight SQL transport and the ADBC client cost on their own: whatever a
real server adds on top (planning, storage reads, validation, durability) is absent. It speaks
exactly what the ADBC Flight SQL driver 1.13 sends for the benchmark's workloads:

* GetFlightInfo / DoGet of `CommandGetSqlInfo` (transactions advertised, so DB-API connections
  open one on connect, as they do against moraine);
* the actions `CreatePreparedStatement`, `ClosePreparedStatement`, `BeginTransaction`,
  `EndTransaction` and `CloseSession`;
* GetFlightInfo(`CommandPreparedStatementQuery` or `CommandStatementQuery`) and DoGet of the
  ticket it returns, streaming the precomputed result in its stored (large) record batches;
* DoPut(`CommandStatementIngest`): the stream is drained and dropped, the row count answered;
* DoPut on the plain path `ducklake_commit` (moraine's one-stream commit): drained, answered with
  the JSON moraine answers.

Run as `python -m compare.transport --results DIR` (from `benches/`); DIR holds `manifest.json`
(`{"results": [{"sql": …, "file": …}]}`) and the Arrow IPC files it names. It prints
`transport listening on 127.0.0.1:PORT` once it serves, and stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Dict, Optional

import pyarrow as pa
import pyarrow.flight as fl
import pyarrow.ipc as ipc

try:  # run as `python -m compare.transport`
    from . import proto
except ImportError:  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from compare import proto  # type: ignore[no-redef]

SQL_INFO_TICKET = b"sql-info"

# SqlInfo ids (FlightSql.proto's SqlInfo enum) and their values, with the value types the spec
# gives them: strings for 0-2 and 504, int32 for 8 and 100-101, bools otherwise.
SQL_INFO = {
    0: "moraine-transport-anchor",  # FLIGHT_SQL_SERVER_NAME
    1: "1",  # FLIGHT_SQL_SERVER_VERSION
    2: pa.__version__,  # FLIGHT_SQL_SERVER_ARROW_VERSION
    3: False,  # FLIGHT_SQL_SERVER_READ_ONLY
    4: True,  # FLIGHT_SQL_SERVER_SQL
    5: False,  # FLIGHT_SQL_SERVER_SUBSTRAIT
    8: ("int32", 1),  # FLIGHT_SQL_SERVER_TRANSACTION: SQL_SUPPORTED_TRANSACTION_TRANSACTION
    9: False,  # FLIGHT_SQL_SERVER_CANCEL
    10: True,  # FLIGHT_SQL_SERVER_BULK_INGESTION
    11: True,  # FLIGHT_SQL_SERVER_INGEST_TRANSACTIONS_SUPPORTED
    100: ("int32", 600_000),  # FLIGHT_SQL_SERVER_STATEMENT_TIMEOUT (ms)
    101: ("int32", 3_600_000),  # FLIGHT_SQL_SERVER_TRANSACTION_TIMEOUT (ms)
    504: '"',  # SQL_IDENTIFIER_QUOTE_CHAR
    563: True,  # SQL_TRANSACTIONS_SUPPORTED
}


def sql_info_table() -> pa.Table:
    """The SqlInfo result: `info_name uint32, value dense_union<…>`, the spec's union layout."""
    map_type = pa.map_(pa.int32(), pa.list_(pa.int32()))
    # Union children, in the spec's order and type codes 0..5.
    strings, bools, bigints, int32s = [], [], [], []
    type_ids, offsets, names = [], [], []
    for info, value in sorted(SQL_INFO.items()):
        names.append(info)
        if isinstance(value, tuple):
            type_ids.append(3)
            offsets.append(len(int32s))
            int32s.append(value[1])
        elif isinstance(value, bool):
            type_ids.append(1)
            offsets.append(len(bools))
            bools.append(value)
        elif isinstance(value, int):
            type_ids.append(2)
            offsets.append(len(bigints))
            bigints.append(value)
        else:
            type_ids.append(0)
            offsets.append(len(strings))
            strings.append(value)
    children = [
        pa.array(strings, pa.utf8()),
        pa.array(bools, pa.bool_()),
        pa.array(bigints, pa.int64()),
        pa.array(int32s, pa.int32()),
        pa.array([], pa.list_(pa.utf8())),
        pa.array([], map_type),
    ]
    value = pa.UnionArray.from_dense(
        pa.array(type_ids, pa.int8()), pa.array(offsets, pa.int32()), children,
        ["string_value", "bool_value", "bigint_value", "int32_bitmask", "string_list",
         "int32_to_int32_list_map"])
    schema = pa.schema([pa.field("info_name", pa.uint32(), nullable=False),
                        pa.field("value", value.type, nullable=False)])
    return pa.Table.from_arrays([pa.array(names, pa.uint32()), value], schema=schema)


class TransportServer(fl.FlightServerBase):
    def __init__(self, location: str, results: Dict[str, pa.Table], trace: bool = False):
        super().__init__(location)
        self._trace = trace
        # Handle and ticket are the same short key; the SQL text finds it.
        self._keys = {sql: f"r{i}".encode() for i, sql in enumerate(results)}
        self._tables = {self._keys[sql]: table for sql, table in results.items()}
        self._sql_info = sql_info_table()
        self._txn_counter = 0
        self._lock = threading.Lock()

    # --- helpers ---------------------------------------------------------------------------

    def _key_of_sql(self, sql: str) -> bytes:
        key = self._keys.get(sql)
        if key is None:
            # Python's KeyError reaches the client as NOT_FOUND.
            raise KeyError(f"the transport anchor has no precomputed result for: {sql[:200]}")
        return key

    def _info(self, descriptor: fl.FlightDescriptor, key: bytes) -> fl.FlightInfo:
        table = self._tables[key]
        return fl.FlightInfo(table.schema, descriptor, [fl.FlightEndpoint(key, [])],
                             table.num_rows, -1)

    # --- Flight RPCs -----------------------------------------------------------------------

    def _log(self, *what) -> None:
        if self._trace:
            print("transport:", *what, file=sys.stderr, flush=True)

    def get_flight_info(self, context, descriptor):
        self._log("GetFlightInfo", descriptor.descriptor_type, descriptor.command[:60]
                  if descriptor.command else descriptor.path)
        if descriptor.descriptor_type != fl.DescriptorType.CMD:
            raise NotImplementedError("the transport anchor serves Flight SQL commands only")
        name, fields = proto.unpack_any(descriptor.command)
        if name == "CommandGetSqlInfo":
            return fl.FlightInfo(self._sql_info.schema, descriptor,
                                 [fl.FlightEndpoint(SQL_INFO_TICKET, [])],
                                 self._sql_info.num_rows, -1)
        if name == "CommandPreparedStatementQuery":
            key = proto.first_bytes(fields, 1)
            if key not in self._tables:
                raise KeyError(f"unknown prepared statement handle {key!r}")
            return self._info(descriptor, key)
        if name == "CommandStatementQuery":
            sql = proto.first_bytes(fields, 1).decode()
            return self._info(descriptor, self._key_of_sql(sql))
        raise NotImplementedError(f"{name} is not supported by the transport anchor")

    def do_get(self, context, ticket):
        key = ticket.ticket
        self._log("DoGet", key)
        if key == SQL_INFO_TICKET:
            return fl.RecordBatchStream(self._sql_info)
        table = self._tables.get(key)
        if table is None:
            raise KeyError(f"unknown ticket {key!r}")
        return fl.RecordBatchStream(table)

    def do_put(self, context, descriptor, reader, writer):
        self._log("DoPut", descriptor.command[:80] if descriptor.command else descriptor.path)
        if descriptor.descriptor_type == fl.DescriptorType.PATH:
            self._plain_put(descriptor, reader, writer)
            return
        name, _fields = proto.unpack_any(descriptor.command)
        if name != "CommandStatementIngest":
            raise NotImplementedError(f"DoPut {name} is not supported by the transport anchor")
        rows = 0
        for chunk in reader:
            if chunk.data is not None:
                rows += chunk.data.num_rows
        writer.write(pa.py_buffer(proto.do_put_update_result(rows)))

    def _plain_put(self, descriptor, reader, writer):
        path = [p.decode() if isinstance(p, bytes) else p for p in descriptor.path]
        if path != ["ducklake_commit"]:
            raise NotImplementedError(f"plain DoPut path {path} is not served by the anchor")
        rows = 0
        marker = None
        for chunk in reader:
            if chunk.data is not None:
                rows += chunk.data.num_rows
            if chunk.app_metadata is not None:
                marker = chunk.app_metadata.to_pybytes()
        if marker != b"commit":
            raise fl.FlightServerError("stream ended without the commit marker: nothing committed")
        reply = json.dumps({"committed": True, "rows": rows}).encode()
        writer.write(pa.py_buffer(reply))

    def list_actions(self, context):
        return [("CreatePreparedStatement", ""), ("ClosePreparedStatement", ""),
                ("BeginTransaction", ""), ("EndTransaction", ""), ("CloseSession", "")]

    def do_action(self, context, action):
        kind = action.type
        self._log("DoAction", kind)
        body = action.body.to_pybytes() if action.body is not None else b""
        if kind == "CreatePreparedStatement":
            _name, fields = proto.unpack_any(body)
            key = self._key_of_sql(proto.first_bytes(fields, 1).decode())
            schema = self._tables[key].schema.serialize().to_pybytes()
            return [fl.Result(proto.create_prepared_statement_result(key, schema))]
        if kind == "ClosePreparedStatement":
            return []
        if kind == "BeginTransaction":
            with self._lock:
                self._txn_counter += 1
                txn = f"txn-{self._txn_counter}".encode()
            return [fl.Result(proto.begin_transaction_result(txn))]
        if kind == "EndTransaction":
            return []  # commit or rollback of nothing
        if kind == "CloseSession":
            return [fl.Result(proto.CLOSE_SESSION_RESULT)]
        raise NotImplementedError(f"action {kind} is not supported by the transport anchor")


def load_results(directory: Path) -> Dict[str, pa.Table]:
    """The precomputed results, memory-mapped from their IPC files (batches as stored)."""
    manifest = json.loads((directory / "manifest.json").read_text())
    results = {}
    for entry in manifest["results"]:
        source = pa.memory_map(str(directory / entry["file"]), "r")
        results[entry["sql"]] = ipc.open_file(source).read_all()
    return results


def main(argv: Optional[list] = None) -> None:
    ap = argparse.ArgumentParser(description="Flight SQL transport anchor for benches/compare.py")
    ap.add_argument("--results", type=Path, required=True,
                    help="directory with manifest.json and the Arrow IPC result files")
    ap.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (port 0 picks one)")
    ap.add_argument("--trace", action="store_true", help="log every call on stderr")
    args = ap.parse_args(argv)

    results = load_results(args.results)
    server = TransportServer(f"grpc://{args.listen}", results, trace=args.trace)
    host = args.listen.rsplit(":", 1)[0]

    # The server listens from construction on; the main thread only waits for a stop signal
    # (a Python signal handler runs only between bytecodes, so never block in serve()).
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stopping.set())
    signal.signal(signal.SIGINT, lambda _signum, _frame: stopping.set())
    print(f"transport listening on {host}:{server.port}", flush=True)
    while not stopping.wait(0.5):
        pass
    server.shutdown()


if __name__ == "__main__":
    main()
