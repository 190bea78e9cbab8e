"""`moraine export` read by other tools: its Parquet files open in pyarrow and in DuckDB, its
Arrow IPC files in pyarrow, each with the rows and schema the server serves, and the manifest's
checksums are the files' SHA-256."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from conftest import TABLES, describe_schema, expected_schema, moraine_cli, sorted_rows

CALL_TIMEOUT_S = 30
OPTIONS = flight.FlightCallOptions(timeout=CALL_TIMEOUT_S)


def served(uri: str, table: str) -> pa.Table:
    """The whole table as the server streams it, every endpoint in order."""
    with flight.FlightClient(uri) as client:
        info = client.get_flight_info(flight.FlightDescriptor.for_path(table), OPTIONS)
        parts = [client.do_get(ep.ticket, OPTIONS).read_all() for ep in info.endpoints]
    return pa.concat_tables(parts) if parts else info.schema.empty_table()


def rows(table: pa.Table):
    return sorted_rows(tuple(r.values()) for r in table.to_pylist())


def export(uri: str, out: Path, *extra: str) -> dict:
    moraine_cli("export", "--server", uri, "--out", out, *extra)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "moraine-export" and manifest["version"] == 1
    assert [t["table"] for t in manifest["tables"]] == list(TABLES)
    for entry in manifest["tables"]:
        data = (out / entry["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], entry["file"]
        assert len(data) == entry["bytes"], entry["file"]
    return manifest


@pytest.fixture(scope="module")
def parquet_export(moraine_uri, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "parquet"
    return out, export(moraine_uri, out)


@pytest.mark.parametrize("table", TABLES)
def test_parquet_export_opens_in_pyarrow_with_the_servers_rows(moraine_uri, parquet_export,
                                                                 table):
    out, manifest = parquet_export
    entry = next(t for t in manifest["tables"] if t["table"] == table)
    assert entry["file"] == f"{table}.parquet"
    from_file = pq.read_table(out / entry["file"])
    from_server = served(moraine_uri, table)
    assert from_file.num_rows == from_server.num_rows == entry["rows"] > 0
    assert describe_schema(from_file.schema) == describe_schema(expected_schema(table))
    assert rows(from_file) == rows(from_server)
    metadata = pq.ParquetFile(out / entry["file"]).metadata
    codecs = {metadata.row_group(g).column(c).compression
              for g in range(metadata.num_row_groups) for c in range(metadata.num_columns)}
    assert codecs == {"ZSTD"}


@pytest.mark.parametrize("table", TABLES)
def test_parquet_export_opens_in_duckdb_with_the_servers_row_count(moraine_uri, parquet_export,
                                                                   table):
    out, manifest = parquet_export
    entry = next(t for t in manifest["tables"] if t["table"] == table)
    path = str(out / entry["file"]).replace("'", "''")
    con = duckdb.connect()
    try:
        (count,) = con.sql(f"SELECT count(*) FROM '{path}'").fetchone()
        columns = [row[0] for row in con.sql(f"DESCRIBE SELECT * FROM '{path}'").fetchall()]
    finally:
        con.close()
    assert count == served(moraine_uri, table).num_rows == entry["rows"]
    assert columns == expected_schema(table).names


def test_arrow_export_opens_in_pyarrow_with_the_servers_rows(moraine_uri, tmp_path):
    out = tmp_path / "arrow"
    manifest = export(moraine_uri, out, "--format", "arrow", "--tables",
                      ",".join(reversed(TABLES)))
    assert manifest["file_format"] == "arrow"
    for entry in manifest["tables"]:
        with pa.memory_map(str(out / entry["file"])) as source:
            from_file = ipc.open_file(source).read_all()
        from_server = served(moraine_uri, entry["table"])
        assert from_file.num_rows == from_server.num_rows == entry["rows"]
        assert describe_schema(from_file.schema) == describe_schema(
            expected_schema(entry["table"]))
        assert rows(from_file) == rows(from_server)
