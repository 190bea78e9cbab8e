"""Shared fixtures of the Python integration suite.

Every test talks to a real `moraine serve` process over 127.0.0.1 with a real client (the ADBC
Flight SQL driver or pyarrow.flight). The server's data comes from replaying DuckLake's own
rows (`integration/fixtures/ducklake-0.3/steps.json`) through `moraine import` (or the server
starts on an empty store); the expected results come from replaying the same file here, in
Python (`expected_rows()`), so no test hard-codes result rows. Tests that write compute what
the store must hold from the state they read first and the rows they wrote (`CatalogState`'s
`with_rows`/`without_rows`/`with_changes`, the row builders `Mapping`, `data_file`).

`MORAINE_BIN` names the binary (integration/run-tests sets it). Without it, the debug binary
in cargo's target directory is used if it exists.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import faulthandler
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import pyarrow as pa
import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "integration" / "fixtures" / "ducklake-0.3" / "steps.json"

CATALOG = "moraine"
SCHEMA = "main"

# Bounds. Every wait in this suite is bounded; a hung test is killed by the watchdog below.
IMPORT_TIMEOUT_S = 120
STARTUP_TIMEOUT_S = 60
SHUTDOWN_TIMEOUT_S = 20
TEST_TIMEOUT_S = int(os.environ.get("MORAINE_TEST_TIMEOUT", "120"))

# --------------------------------------------------------------------------------------------
# The tables, exactly as DuckLake declares them (column order matters).

COLUMN_MAPPING = "ducklake_column_mapping"
NAME_MAPPING = "ducklake_name_mapping"
DATA_FILE = "ducklake_data_file"
TABLES = (COLUMN_MAPPING, NAME_MAPPING, DATA_FILE)

_I, _S, _B = pa.int64(), pa.utf8(), pa.bool_()

COLUMNS: Dict[str, List[Tuple[str, pa.DataType]]] = {
    COLUMN_MAPPING: [("mapping_id", _I), ("table_id", _I), ("type", _S)],
    NAME_MAPPING: [
        ("mapping_id", _I),
        ("column_id", _I),
        ("source_name", _S),
        ("target_field_id", _I),
        ("parent_column", _I),
        ("is_partition", _B),
    ],
    DATA_FILE: [
        ("data_file_id", _I),
        ("table_id", _I),
        ("begin_snapshot", _I),
        ("end_snapshot", _I),
        ("file_order", _I),
        ("path", _S),
        ("path_is_relative", _B),
        ("file_format", _S),
        ("record_count", _I),
        ("file_size_bytes", _I),
        ("footer_size", _I),
        ("row_id_start", _I),
        ("partition_id", _I),
        ("encryption_key", _S),
        ("partial_file_info", _S),
        ("mapping_id", _I),
    ],
}

# Every column is nullable except ducklake_data_file.data_file_id.
NOT_NULL = {(DATA_FILE, "data_file_id")}

# `ducklake_data_file` in each DuckLake catalog version a deployment can serve (`moraine
# serve --ducklake-version`), in the version's order (DuckLake's MigrateV03 drops
# partial_file_info and appends partial_max, 0.4 = 1.0; MigrateV10 appends row_group_count,
# 1.1). COLUMNS holds 0.3's, what a server serves by default and the rest of the suite uses.
_DATA_FILE_HEAD = [c for c in COLUMNS[DATA_FILE] if c[0] not in ("partial_file_info", "mapping_id")]
DATA_FILE_VERSIONS: Dict[str, List[Tuple[str, pa.DataType]]] = {
    "0.3": COLUMNS[DATA_FILE],
    "1.0": _DATA_FILE_HEAD + [("mapping_id", _I), ("partial_max", _I)],
    "1.1": _DATA_FILE_HEAD + [("mapping_id", _I), ("partial_max", _I), ("row_group_count", _I)],
}


def column_names(table: str) -> List[str]:
    return [name for name, _ in COLUMNS[table]]


def data_file_names(version: str) -> List[str]:
    """`ducklake_data_file`'s column names in DuckLake version `version` (of
    DATA_FILE_VERSIONS), in order."""
    return [name for name, _ in DATA_FILE_VERSIONS[version]]


def data_file_in(version: str, row: Row, **later: Any) -> Row:
    """A `data_file` row (0.3's columns) as a row of `version`'s columns: the columns the
    version lacks dropped, those only it has (`partial_max=`, `row_group_count=`) from
    `later`, else NULL."""
    names = data_file_names(version)
    unknown = set(later) - set(names)
    assert not unknown, f"DuckLake {version}'s ducklake_data_file has no {sorted(unknown)}"
    rec = dict(zip(column_names(DATA_FILE), row), **later)
    return tuple(rec.get(n) for n in names)


def expected_schema(table: str) -> pa.Schema:
    return pa.schema(
        [pa.field(name, typ, nullable=(table, name) not in NOT_NULL) for name, typ in COLUMNS[table]]
    )


def describe_schema(schema: pa.Schema) -> List[Tuple[str, str, bool]]:
    """(name, type, nullable) per field: what the suite compares schemas on (not metadata)."""
    return [(f.name, str(f.type), f.nullable) for f in schema]


# --------------------------------------------------------------------------------------------
# The expected data: the fixture replayed in Python.

Row = Tuple[Any, ...]


@dataclass
class CatalogState:
    """The three tables as tuples in declared column order, each sorted by its natural key."""

    tables: Dict[str, List[Row]] = field(default_factory=dict)

    def __getitem__(self, table: str) -> List[Row]:
        return self.tables[table]

    def rows_of_table_id(self, table: str, table_id: int) -> List[Row]:
        """The rows of `table` that belong to DuckLake table `table_id` (name rows through
        their mapping)."""
        if table == NAME_MAPPING:
            mappings = {m[0] for m in self.tables[COLUMN_MAPPING] if m[1] == table_id}
            return [r for r in self.tables[NAME_MAPPING] if r[0] in mappings]
        pos = column_names(table).index("table_id")
        return [r for r in self.tables[table] if r[pos] == table_id]

    def mapping_join(self, min_mapping_id: Optional[int] = None) -> List[Row]:
        """DuckLake's mapping load: column_mapping JOIN name_mapping USING (mapping_id), as
        (mapping_id, table_id, type, column_id, source_name, target_field_id, parent_column,
        is_partition); inner join, so NULL mapping ids never match. Sorted by the query's key
        and then the remaining columns (siblings' order is unspecified; don't rely on it)."""
        names_by_map = collections.defaultdict(list)
        for n in self.tables[NAME_MAPPING]:
            if n[0] is not None:
                names_by_map[n[0]].append(n)
        out = []
        for mapping_id, table_id, typ in self.tables[COLUMN_MAPPING]:
            if mapping_id is None:
                continue
            if min_mapping_id is not None and mapping_id < min_mapping_id:
                continue
            for n in names_by_map.get(mapping_id, []):
                out.append((mapping_id, table_id, typ) + tuple(n[1:]))
        return sorted(out, key=lambda r: (mapping_order_key(r), sort_key(r)))

    def data_files_at(self, table_id: int, snapshot: int) -> List[Row]:
        """DuckLake's data-file read: `table_id = T AND S >= begin_snapshot AND
        (S < end_snapshot OR end_snapshot IS NULL)`."""
        out = []
        for r in self.tables[DATA_FILE]:
            rec = dict(zip(column_names(DATA_FILE), r))
            if rec["table_id"] != table_id or rec["begin_snapshot"] is None:
                continue
            if snapshot < rec["begin_snapshot"]:
                continue
            if rec["end_snapshot"] is not None and not snapshot < rec["end_snapshot"]:
                continue
            out.append(r)
        return out


    # The state after a change, for tests that write: each returns a new state.

    def with_rows(self, table: str, rows: Iterable[Row]) -> "CatalogState":
        """This state plus `rows` inserted into `table`."""
        tables = dict(self.tables)
        tables[table] = sorted_rows(list(self.tables[table]) + [tuple(r) for r in rows])
        return CatalogState(tables=tables)

    def without_rows(self, table: str, drop: Callable[[Dict[str, Any]], bool]) -> "CatalogState":
        """This state minus the rows of `table` for which `drop(row as a dict)` holds."""
        names = column_names(table)
        tables = dict(self.tables)
        tables[table] = [r for r in self.tables[table] if not drop(dict(zip(names, r)))]
        return CatalogState(tables=tables)

    def with_changes(
        self, table: str, where: Callable[[Dict[str, Any]], bool], **changes: Any
    ) -> "CatalogState":
        """This state with `changes` (column=value) applied to the rows of `table` that
        `where(row as a dict)` selects."""
        names = column_names(table)
        out = []
        for r in self.tables[table]:
            rec = dict(zip(names, r))
            if where(rec):
                rec.update(changes)
            out.append(tuple(rec[n] for n in names))
        tables = dict(self.tables)
        tables[table] = sorted_rows(out)
        return CatalogState(tables=tables)

    def mapping_keys(self) -> List[Tuple[int, int]]:
        """The (table_id, mapping_id) of every stored mapping."""
        return sorted((r[1], r[0]) for r in self.tables[COLUMN_MAPPING])


def mapping_order_key(row: Row) -> Tuple[Any, ...]:
    """`ORDER BY mapping_id, parent_column NULLS FIRST` on a mapping-join row."""
    mapping_id, parent = row[0], row[6]
    return (mapping_id, parent is not None, parent if parent is not None else 0)


def sort_key(row: Row) -> Tuple[Any, ...]:
    """A total order on rows that may hold NULLs, for comparing multisets as sorted lists."""
    return tuple((v is not None, v if v is not None else 0) if not isinstance(v, str)
                 else (True, v) for v in row)


def sorted_rows(rows) -> List[Row]:
    return sorted((tuple(r) for r in rows), key=sort_key)


def _fixture_rows(step: dict, table: str, which: str) -> List[Row]:
    """The step's `which` ('added'/'removed') rows of `table`, reordered into the declared
    column order by the step's own `columns` list."""
    t = step.get(table)
    if not t:
        return []
    cols = t.get("columns") or column_names(table)
    missing = set(column_names(table)) - set(cols)
    assert not missing, f"fixture table {table} lacks columns {sorted(missing)}"
    pos = [cols.index(c) for c in column_names(table)]
    return [tuple(r[p] for p in pos) for r in t.get(which, [])]


def replay_steps(steps: Dict[str, dict]) -> CatalogState:
    """Replays DuckLake steps with `moraine import`'s semantics: `added` mapping and name rows
    are inserts; a data file both removed and added with the same id, only `end_snapshot`
    changed, is an end transition; a removed-only data file is a delete; any other added file
    is an insert. `ducklake_snapshot` rows are ignored."""
    maps: List[Row] = []
    names: List[Row] = []
    files: Dict[int, Row] = {}
    end_pos = column_names(DATA_FILE).index("end_snapshot")
    for step_name, step in steps.items():
        for table in (COLUMN_MAPPING, NAME_MAPPING):
            assert not _fixture_rows(step, table, "removed"), (
                f"{step_name}: DuckLake 1.4 never deletes {table} rows; the replay does not "
                "model it"
            )
        maps.extend(_fixture_rows(step, COLUMN_MAPPING, "added"))
        names.extend(_fixture_rows(step, NAME_MAPPING, "added"))
        removed = {r[0]: r for r in _fixture_rows(step, DATA_FILE, "removed")}
        added = _fixture_rows(step, DATA_FILE, "added")
        added_ids = {r[0] for r in added}
        for file_id, old in removed.items():
            assert file_id in files, f"{step_name}: removes unknown data file {file_id}"
            if file_id not in added_ids:
                del files[file_id]  # a delete
        for row in added:
            file_id = row[0]
            old = removed.get(file_id)
            if old is not None:
                same_but_end = old[:end_pos] + old[end_pos + 1:] == row[:end_pos] + row[end_pos + 1:]
                assert same_but_end, f"{step_name}: file {file_id} changes more than end_snapshot"
                assert old[end_pos] is None and row[end_pos] is not None, (
                    f"{step_name}: file {file_id}: not an end transition"
                )
            else:
                assert file_id not in files, f"{step_name}: data file {file_id} inserted twice"
            files[file_id] = row
    return CatalogState(
        tables={
            COLUMN_MAPPING: sorted_rows(maps),
            NAME_MAPPING: sorted_rows(names),
            DATA_FILE: sorted_rows(files.values()),
        }
    )


@functools.lru_cache(maxsize=None)
def load_fixture() -> dict:
    with open(FIXTURE, encoding="utf-8") as f:
        return json.load(f)  # dicts keep the file's (chronological) step order


def expected_rows() -> CatalogState:
    """The final state of the three tables after the whole fixture, as the server must serve
    it after `moraine import` of the same file."""
    return replay_steps(load_fixture()["steps"])


def snapshots_in_fixture() -> List[int]:
    """Every snapshot id DuckLake committed in the fixture."""
    ids = set()
    for step in load_fixture()["steps"].values():
        snap = step.get("ducklake_snapshot")
        if snap:
            pos = snap["columns"].index("snapshot_id")
            ids.update(r[pos] for r in snap.get("added", []))
    return sorted(ids)


@pytest.fixture(scope="session")
def expected() -> CatalogState:
    return expected_rows()


# --------------------------------------------------------------------------------------------
# Rows for the write tests (built, not hard-coded results: the expected state is always the
# state read before the write plus these rows).


@dataclass
class Mapping:
    """One mapping as DuckLake writes it: its `ducklake_column_mapping` row and its
    `ducklake_name_mapping` rows (column_id, source_name, target_field_id, parent_column,
    is_partition, in pre-order)."""

    mapping_id: int
    table_id: int
    names: List[Tuple[Any, ...]]
    type: str = "map_by_name"

    @property
    def column_row(self) -> Row:
        return (self.mapping_id, self.table_id, self.type)

    @property
    def name_rows(self) -> List[Row]:
        return [(self.mapping_id,) + tuple(n) for n in self.names]

    @property
    def join_rows(self) -> List[Row]:
        """The mapping in the shape of DuckLake's mapping load (one row per name row)."""
        return [(self.mapping_id, self.table_id, self.type) + tuple(n) for n in self.names]

    def added_to(self, state: CatalogState) -> CatalogState:
        return state.with_rows(COLUMN_MAPPING, [self.column_row]).with_rows(
            NAME_MAPPING, self.name_rows)


def mapping_like(state: CatalogState, source_mapping_id: int, mapping_id: int,
                 table_id: int) -> Mapping:
    """A new mapping with the tree of the stored mapping `source_mapping_id` (DuckLake's own
    nested trees: structs, lists, maps, a hive partition column)."""
    names = [r[1:] for r in state[NAME_MAPPING] if r[0] == source_mapping_id]
    assert names, f"no name rows for mapping {source_mapping_id}"
    return Mapping(mapping_id, table_id, sorted(names, key=lambda n: n[0]))


def flat_mapping(mapping_id: int, table_id: int, columns: int = 3) -> Mapping:
    """A mapping of `columns` root columns c0, c1, ... with target field ids 1, 2, ..."""
    return Mapping(mapping_id, table_id,
                   [(i, f"c{i}", i + 1, None, False) for i in range(columns)])


def data_file(data_file_id: int, table_id: int, mapping_id: Optional[int], *,
              begin_snapshot: int = 1, end_snapshot: Optional[int] = None,
              path: Optional[str] = None) -> Row:
    """A `ducklake_data_file` row shaped like one `ducklake_add_data_files` registers."""
    rec = {
        "data_file_id": data_file_id,
        "table_id": table_id,
        "begin_snapshot": begin_snapshot,
        "end_snapshot": end_snapshot,
        "file_order": None,
        "path": path if path is not None else f"/lake/t{table_id}/f{data_file_id}.parquet",
        "path_is_relative": False,
        "file_format": "parquet",
        "record_count": 10 + data_file_id % 7,
        "file_size_bytes": 1000 + data_file_id,
        "footer_size": 200 + data_file_id % 13,
        "row_id_start": 0,
        "partition_id": None,
        "encryption_key": None,
        "partial_file_info": None,
        "mapping_id": mapping_id,
    }
    return tuple(rec[n] for n in column_names(DATA_FILE))


def arrow_rows(table: str, rows: Sequence[Row], columns=None) -> pa.Table:
    """`rows` of `table` (declared column order) as an Arrow table of the declared types,
    every field nullable; `columns` overrides the (name, type) list."""
    cols = columns if columns is not None else COLUMNS[table]
    arrays = [pa.array([r[i] for r in rows], type=t) for i, (_, t) in enumerate(cols)]
    return pa.Table.from_arrays(arrays, schema=pa.schema([pa.field(n, t) for n, t in cols]))


def state_from_tables(tables: Dict[str, pa.Table]) -> CatalogState:
    """The three tables read from a server, as a CatalogState."""
    out = {}
    for table in TABLES:
        got = tables[table]
        assert got.schema.names == column_names(table), f"{table}: columns {got.schema.names}"
        out[table] = sorted_rows(tuple(r.values()) for r in got.to_pylist())
    return CatalogState(tables=out)


def diff_states(got: CatalogState, want: CatalogState) -> str:
    """'' if equal, else which rows each table is missing and has unexpectedly."""
    lines = []
    for table in TABLES:
        g, w = collections.Counter(got[table]), collections.Counter(want[table])
        missing, extra = list((w - g).elements()), list((g - w).elements())
        if missing or extra:
            lines.append(f"{table}: {len(got[table])} rows, expected {len(want[table])}\n"
                         f"  missing ({len(missing)}): {sorted_rows(missing)[:10]}\n"
                         f"  unexpected ({len(extra)}): {sorted_rows(extra)[:10]}")
    return "\n".join(lines)


def mentions_id(message: str, ident: int) -> bool:
    """Whether `message` names the number `ident` (not as part of a longer number)."""
    return re.search(rf"(?<![0-9]){ident}(?![0-9])", message) is not None


class Ids:
    """Fresh ids for one server's tests: table ids and file-space ids (mapping_id and
    data_file_id share DuckLake's next_file_id counter) far from the fixture's, so tests that
    share a server never collide, and ids in error messages are unambiguous."""

    def __init__(self, first_table: int = 9001, first_file: int = 7_000_001):
        self._table = first_table
        self._file = first_file

    def table(self) -> int:
        self._table += 1
        return self._table

    def file(self) -> int:
        self._file += 1
        return self._file


# --------------------------------------------------------------------------------------------
# The server process.

LISTENING = re.compile(r"listening on (\S+)")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
LOG_TAIL = 80


@contextlib.contextmanager
def autocommit_cursor(uri: str) -> Iterator:
    """A cursor of a new ADBC connection with autocommit on (each statement commits on its
    own), closed with its connection afterwards."""
    import adbc_driver_flightsql.dbapi as flightsql

    conn = flightsql.connect(uri, autocommit=True)
    try:
        with conn.cursor() as cur:
            yield cur
    finally:
        conn.close()


def moraine_bin() -> Path:
    env = os.environ.get("MORAINE_BIN")
    if env:
        path = Path(env)
        if not (path.is_file() and os.access(path, os.X_OK)):
            pytest.fail(f"MORAINE_BIN={env} is not an executable file", pytrace=False)
        return path
    candidates = []
    try:
        meta = subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--no-deps"],
            cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
        )
        candidates.append(Path(json.loads(meta.stdout)["target_directory"]) / "debug" / "moraine")
    except (OSError, subprocess.SubprocessError, ValueError, KeyError):
        pass
    candidates.append(REPO / "target" / "debug" / "moraine")
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    pytest.fail(
        "no moraine binary: set MORAINE_BIN or build it (`cargo build --bin moraine`); "
        "integration/run-tests does both",
        pytrace=False,
    )


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM the server if this pytest process dies (even killed
    by the watchdog), so no server outlives the suite."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _child_env() -> Dict[str, str]:
    env = dict(os.environ)
    # The `listening on` line is logged at info; colours would garble it.
    env["RUST_LOG"] = os.environ.get("MORAINE_TEST_RUST_LOG", "info")
    env["NO_COLOR"] = "1"
    env.pop("MORAINE_LISTEN", None)
    env.pop("MORAINE_DATA", None)
    return env


def run_import(binary: Path, data_dir: Path, steps_file: Path = FIXTURE) -> str:
    cmd = [str(binary), "import", "--data", str(data_dir), str(steps_file)]
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, errors="replace", timeout=IMPORT_TIMEOUT_S,
            env=_child_env(), stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"`{' '.join(cmd)}` did not finish in {IMPORT_TIMEOUT_S} s\n"
                    f"stdout:\n{e.stdout}\nstderr:\n{e.stderr}", pytrace=False)
    if done.returncode != 0:
        pytest.fail(
            f"`{' '.join(cmd)}` exited {done.returncode}\nstdout:\n{done.stdout}\n"
            f"stderr:\n{done.stderr}",
            pytrace=False,
        )
    return done.stdout + done.stderr


class Server:
    """One `moraine serve` process on 127.0.0.1 with a free port. `extra_args` go after the
    suite's own flags (e.g. `["--txn-idle-timeout", "2"]`)."""

    def __init__(self, binary: Path, data_dir: Path, name: str, extra_args: Sequence[str] = ()):
        self.name = name
        self.data_dir = data_dir
        self.cmd = [str(binary), "serve", "--listen", "127.0.0.1:0", "--data", str(data_dir)]
        self.cmd.extend(str(a) for a in extra_args)
        self.lines: collections.deque = collections.deque(maxlen=5000)
        self.line_count = 0
        self._lock = threading.Lock()
        self._new_line = threading.Condition(self._lock)  # notified with each line, and at EOF
        self._listening = threading.Event()
        self._eof = threading.Event()
        self.address: Optional[str] = None
        self.proc = subprocess.Popen(
            self.cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=_child_env(),
            preexec_fn=_die_with_parent,
        )
        # Drains the pipe for the whole life of the process, so the server never blocks on it.
        self._reader = threading.Thread(target=self._drain, name=f"{name}-log", daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = ANSI.sub("", raw.decode("utf-8", "replace")).rstrip("\n")
            with self._lock:
                self.lines.append(line)
                self.line_count += 1
                self._new_line.notify_all()
            if not self._listening.is_set():
                m = LISTENING.search(line)
                if m:
                    self.address = m.group(1).rstrip(".,;")
                    self._listening.set()
        with self._lock:
            self._eof.set()
            self._new_line.notify_all()

    def wait_for_line(self, *texts: str, since: int, timeout: float) -> Optional[str]:
        """The first line from line number `since` on that holds any of `texts`, as soon as
        the server prints it; None when none has within `timeout` seconds, or the server's
        output ended without one."""
        deadline = time.monotonic() + timeout
        with self._new_line:
            while True:
                kept_from = self.line_count - len(self.lines)
                for line in list(self.lines)[max(0, since - kept_from):]:
                    if any(t in line for t in texts):
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or self._eof.is_set():
                    return None
                since = self.line_count
                self._new_line.wait(left)

    def log(self, since: int = 0, tail: Optional[int] = None) -> str:
        with self._lock:
            kept_from = self.line_count - len(self.lines)
            lines = list(self.lines)[max(0, since - kept_from):]
        if tail is not None:
            lines = lines[-tail:]
        return "\n".join(lines)

    def wait_listening(self) -> str:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._listening.wait(0.1):
                break
            if self.proc.poll() is not None:
                self._eof.wait(2)
                if self._listening.is_set():
                    break
                pytest.fail(
                    f"{self.name}: `{' '.join(self.cmd)}` exited {self.proc.returncode} before "
                    f"listening; its output:\n{self.log()}",
                    pytrace=False,
                )
        else:
            self.stop()
            pytest.fail(
                f"{self.name}: no `listening on` line within {STARTUP_TIMEOUT_S} s; its output:\n"
                f"{self.log()}",
                pytrace=False,
            )
        assert self.address is not None
        m = re.fullmatch(r"(?:\[?)([0-9.:a-fA-F]+?)(?:\]?):(\d+)\D*", self.address)
        if not m:
            self.stop()
            pytest.fail(f"{self.name}: cannot parse the address in `listening on {self.address}`",
                        pytrace=False)
        host, port = m.group(1), int(m.group(2))
        if host != "127.0.0.1" or port == 0:
            self.stop()
            pytest.fail(f"{self.name}: asked for 127.0.0.1:0, got `listening on {self.address}`",
                        pytrace=False)
        # jemalloc reads the server's settings (`MALLOC_CONF` in src/main.rs) at start-up and
        # only warns, on stderr, about one it does not know; it then runs without it.
        refused = [line for line in self.log().splitlines() if line.startswith("<jemalloc>")]
        if refused:
            self.stop()
            pytest.fail(f"{self.name}: the allocator refused a setting: {refused}", pytrace=False)
        return f"grpc://{host}:{port}"

    def stop(self) -> Optional[str]:
        """SIGTERM, bounded wait, SIGKILL. Returns a complaint if the server did not stop
        cleanly on SIGTERM, else None."""
        if self.proc.poll() is not None:
            return None
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(SHUTDOWN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            return f"{self.name}: did not stop within {SHUTDOWN_TIMEOUT_S} s of SIGTERM (killed)"
        finally:
            self._reader.join(5)
        if code not in (0, -signal.SIGTERM):
            return f"{self.name}: exited {code} on SIGTERM"
        return None


# --------------------------------------------------------------------------------------------
# Credentials files (`serve --auth-file`), made with moraine's own command line.

CLI_TIMEOUT_S = 60


def moraine_cli(*args: Any, password: Optional[str] = None,
                check: bool = True) -> subprocess.CompletedProcess:
    """Runs `moraine ARGS...` (e.g. `user add NAME --role writer --auth-file F`), with
    `password` in MORAINE_PASSWORD if given. With `check`, a non-zero exit fails the test."""
    cmd = [str(moraine_bin())] + [str(a) for a in args]
    env = _child_env()
    env.pop("MORAINE_PASSWORD", None)
    if password is not None:
        env["MORAINE_PASSWORD"] = password
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env,
                              timeout=CLI_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"`{' '.join(cmd)}` did not finish in {CLI_TIMEOUT_S} s\n"
                    f"stdout:\n{e.stdout}\nstderr:\n{e.stderr}", pytrace=False)
    if check and done.returncode != 0:
        pytest.fail(f"`{' '.join(cmd)}` exited {done.returncode}\nstdout:\n{done.stdout}\n"
                    f"stderr:\n{done.stderr}", pytrace=False)
    return done


def add_user(auth_file: Path, name: str, role: str, password: str) -> None:
    """`moraine user add NAME --role ROLE --auth-file F`, the password through
    MORAINE_PASSWORD."""
    moraine_cli("user", "add", name, "--role", role, "--auth-file", auth_file,
                password=password)


def create_token(auth_file: Path, name: str, role: str, ttl: Optional[int] = None) -> str:
    """`moraine token create NAME --role ROLE [--ttl S] --auth-file F`: the token, which is
    the one thing the command prints on stdout."""
    ttl_args = ["--ttl", ttl] if ttl is not None else []
    out = moraine_cli("token", "create", name, "--role", role, *ttl_args,
                      "--auth-file", auth_file).stdout
    token = out.strip()
    assert token.startswith("mrt_") and len(out.splitlines()) == 1, \
        f"`moraine token create` printed {out!r}, expected the token alone"
    return token


_RUNNING: List[Server] = []


@dataclass
class Running:
    uri: str
    server: Server


def _start(
    name: str, tmp_root: Path, steps_file: Optional[Path] = FIXTURE, extra_args: Sequence[str] = ()
) -> Tuple[Server, str, Path]:
    """Imports `steps_file` into a new data directory (none: the server starts on an empty
    store, which `moraine serve` creates) and starts a server on it."""
    binary = moraine_bin()
    data_dir = Path(tempfile.mkdtemp(prefix=f"moraine-{name}-", dir=tmp_root))
    if steps_file is not None:
        run_import(binary, data_dir, steps_file)
    server = Server(binary, data_dir, name, extra_args)
    _RUNNING.append(server)
    try:
        uri = server.wait_listening()
    except BaseException:
        server.stop()
        _RUNNING.remove(server)
        shutil.rmtree(data_dir, ignore_errors=True)
        raise
    return server, uri, data_dir


@pytest.fixture(scope="session")
def server_factory(tmp_path_factory) -> Iterator:
    """Starts servers, each on a data directory of its own: on the imported fixture by
    default, on an empty store with `steps_file=None`, with `extra_args` appended to
    `moraine serve`'s command line. Every one is stopped at the end of the session. A server
    that does not stop cleanly on SIGTERM fails the session's teardown."""
    started: List[Tuple[Server, Path]] = []
    root = tmp_path_factory.mktemp("servers")

    def start(
        name: str, steps_file: Optional[Path] = FIXTURE, extra_args: Sequence[str] = ()
    ) -> Running:
        server, uri, data_dir = _start(name, root, steps_file, extra_args)
        started.append((server, data_dir))
        return Running(uri, server)

    yield start
    complaints = []
    for server, data_dir in started:
        complaint = server.stop()
        if complaint:
            complaints.append(f"{complaint}; last output:\n{server.log(tail=30)}")
        if server in _RUNNING:
            _RUNNING.remove(server)
        shutil.rmtree(data_dir, ignore_errors=True)
    if complaints:
        pytest.fail("\n".join(complaints), pytrace=False)


@pytest.fixture(scope="session")
def moraine(server_factory) -> Running:
    """The shared read-only server, with the whole fixture imported."""
    return server_factory("shared")


@pytest.fixture(scope="session")
def moraine_uri(moraine) -> str:
    return moraine.uri


# --------------------------------------------------------------------------------------------
# A private PostgreSQL cluster, for DuckLake catalogs kept in PostgreSQL.


PG_BINARIES = ("initdb", "postgres")


class PostgresCluster:
    """A throwaway PostgreSQL cluster: `initdb` into a temporary directory and `postgres` on a
    free port of 127.0.0.1 as a child of this process (it dies with pytest, SIGQUIT through
    PR_SET_PDEATHSIG), trust authentication. initdb and postgres refuse to run as root, so as
    root both run as the `postgres` user."""

    def __init__(self, root: Path):
        self.root = root
        self.data = root / "data"
        self.port = 0
        self.proc: Optional[subprocess.Popen] = None
        self._log = None
        self._ids = None
        if os.geteuid() == 0:
            import pwd

            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                pytest.skip("running as root needs a `postgres` user to run PostgreSQL as")
            self._ids = (user.pw_uid, user.pw_gid)
            os.chown(root, *self._ids)

    def _preexec(self) -> None:
        if self._ids is not None:
            uid, gid = self._ids
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        try:  # after setuid, which clears it
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGQUIT)
        except OSError:
            pass

    def start(self) -> "PostgresCluster":
        done = subprocess.run(
            ["initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
             "--encoding=UTF8", "--locale=C", "--no-instructions", "--no-sync"],
            capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S, cwd=self.root,
            preexec_fn=self._preexec, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            pytest.fail(f"initdb exited {done.returncode}\n{done.stdout}{done.stderr}",
                        pytrace=False)
        self.port = free_port()
        self._log = open(self.root / "postgres.log", "wb")
        self.proc = subprocess.Popen(
            ["postgres", "-D", str(self.data), "-p", str(self.port), "-k", str(self.root),
             "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=self.root, preexec_fn=self._preexec)
        import adbc_driver_postgresql.dbapi as pg

        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:  # until it accepts a connection (its own readiness), or exits
            try:
                pg.connect(self.conninfo("postgres")).close()
                return self
            except Exception as err:  # noqa: BLE001 - not ready yet
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    pytest.fail(f"PostgreSQL did not start ({err}):\n{self.log()}",
                                pytrace=False)
                time.sleep(0.05)

    def conninfo(self, dbname: str) -> str:
        """A libpq connection string to database `dbname`."""
        return f"host=127.0.0.1 port={self.port} dbname={dbname} user=postgres"

    def create_database(self, name: str) -> str:
        """A new, empty database; its connection string."""
        import adbc_driver_postgresql.dbapi as pg

        with pg.connect(self.conninfo("postgres"), autocommit=True) as conn:
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{name}"')
        return self.conninfo(name)

    def log(self) -> str:
        try:
            return (self.root / "postgres.log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.proc.wait(timeout=SHUTDOWN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    """The session's private PostgreSQL cluster (started on first use). Skips, saying why,
    where the PostgreSQL server binaries are not on PATH."""
    missing = [b for b in PG_BINARIES if shutil.which(b) is None]
    if missing:
        pytest.skip(f"PostgreSQL server binaries not on PATH: {', '.join(missing)}")
    # Not under pytest's base directory: that is private to this user, and the cluster may
    # run as `postgres`.
    cluster = PostgresCluster(Path(tempfile.mkdtemp(prefix="moraine-pg-")))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# Bounds and diagnostics.


_REAL_STDERR_FD: Optional[int] = None
HARD_KILL_AFTER_S = 30


def pytest_configure(config):
    # pytest captures fd 2 while tests run; keep the real one for the watchdog's messages.
    global _REAL_STDERR_FD
    try:
        _REAL_STDERR_FD = os.dup(2)
    except OSError:
        _REAL_STDERR_FD = None


def _say(text: str) -> None:
    fd = _REAL_STDERR_FD if _REAL_STDERR_FD is not None else 2
    try:
        os.write(fd, text.encode())
    except OSError:
        pass


@pytest.fixture(autouse=True)
def _watchdog(request):
    """Bounds every test. After TEST_TIMEOUT_S it prints every thread's stack and interrupts
    the test (pytest then stops the session and tears the servers down); if that has not ended
    the process HARD_KILL_AFTER_S later (stuck in native code), it kills the servers and exits.
    The servers also die with pytest through PR_SET_PDEATHSIG."""
    test = request.node.nodeid

    def interrupt():
        _say(f"\n!! moraine suite: {test} still running after {TEST_TIMEOUT_S} s; "
             "interrupting it. Stacks:\n")
        fd = _REAL_STDERR_FD if _REAL_STDERR_FD is not None else 2
        faulthandler.dump_traceback(file=fd, all_threads=True)
        # A real SIGINT at the main thread: it also breaks blocking sleeps and waits (ADBC
        # cancels its call on SIGINT).
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    def kill():
        _say(f"\n!! moraine suite: {test} did not stop {HARD_KILL_AFTER_S} s after the "
             "interrupt; killing the servers and exiting\n")
        for server in list(_RUNNING):
            try:
                server.proc.kill()
            except OSError:
                pass
        os._exit(3)

    timers = [threading.Timer(TEST_TIMEOUT_S, interrupt),
              threading.Timer(TEST_TIMEOUT_S + HARD_KILL_AFTER_S, kill)]
    for t in timers:
        t.daemon = True
        t.start()
    try:
        yield
    finally:
        for t in timers:
            t.cancel()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    item._moraine_log_marks = {id(s): s.line_count for s in _RUNNING}
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        marks = getattr(item, "_moraine_log_marks", {})
        for s in _RUNNING:
            text = s.log(since=marks.get(id(s), 0), tail=LOG_TAIL)
            if text:
                report.sections.append((f"moraine server `{s.name}` output during the test", text))
