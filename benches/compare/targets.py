"""The systems under test, each driven through its real ADBC client.

* `Moraine`: `moraine serve` on a fresh data directory, ADBC Flight SQL driver.
* `Postgres`: a throwaway PostgreSQL cluster (initdb, pg_ctl) with DuckLake's DDL, ADBC
  PostgreSQL driver. Durability settings are the defaults (fsync, synchronous_commit on).
* `Sqlite`: a SQLite file with DuckLake's DDL, ADBC SQLite driver, default journal and
  synchronous settings.
* `Transport`: the in-memory Flight SQL anchor (`compare.transport`), ADBC Flight SQL driver.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import adbc_driver_flightsql.dbapi as flight_sql
import adbc_driver_postgresql.dbapi as pg_dbapi
import adbc_driver_sqlite.dbapi as sqlite_dbapi

from .procs import CLEANUP, HarnessError, Server, log, run, temp_dir

TABLES = ("ducklake_column_mapping", "ducklake_name_mapping", "ducklake_data_file")

# DuckLake 0.3's DDL for the three tables, verbatim (ducklake-contract.md).
DUCKLAKE_DDL = (
    "CREATE TABLE ducklake_column_mapping(mapping_id BIGINT, table_id BIGINT, type VARCHAR)",
    "CREATE TABLE ducklake_name_mapping(mapping_id BIGINT, column_id BIGINT, "
    "source_name VARCHAR, target_field_id BIGINT, parent_column BIGINT, is_partition BOOLEAN)",
    "CREATE TABLE ducklake_data_file(data_file_id BIGINT PRIMARY KEY, table_id BIGINT, "
    "begin_snapshot BIGINT, end_snapshot BIGINT, file_order BIGINT, path VARCHAR, "
    "path_is_relative BOOLEAN, file_format VARCHAR, record_count BIGINT, "
    "file_size_bytes BIGINT, footer_size BIGINT, row_id_start BIGINT, partition_id BIGINT, "
    "encryption_key VARCHAR, partial_file_info VARCHAR, mapping_id BIGINT)",
)

SERVER_START_TIMEOUT = 120.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

# Staging limits for moraine's one-transaction loads (defaults: 2,000,000 rows, 512 MiB), and
# an idle timeout long enough for a slow ingest between two calls of one transaction.
MORAINE_TXN_MAX_ROWS = 100_000_000
MORAINE_TXN_MAX_BYTES = 64 << 30
MORAINE_TXN_IDLE_TIMEOUT = 3600


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Target:
    key = ""
    label = ""
    flight = False  # serves plain Flight (W5p, W5c)
    has_storage = True  # stores what it is sent (row counts can be read back)

    def __init__(self) -> None:
        self.failed: Optional[str] = None  # set when the target cannot go on
        self.loaded = False  # holds the generated catalog

    # lifecycle
    def start(self) -> None:
        raise NotImplementedError

    def reset_empty(self) -> None:
        """An empty catalog (outside any timing)."""
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def abort(self) -> bool:
        """Stop the server hard so a blocked client call fails; False if impossible."""
        return False

    def after_load(self) -> None:
        """Outside the timing, once the catalog is loaded, before reads."""

    def connect(self):
        """A DB-API connection with the driver's defaults (autocommit off)."""
        raise NotImplementedError

    def describe(self) -> Dict[str, object]:
        return {"label": self.label}

    # moraine only
    def flight_uri(self) -> str:
        raise NotImplementedError

    def rss_reset(self) -> Optional[int]:
        """Resets moraine's peak RSS; returns its RSS now, in bytes (None for other targets)."""
        return None

    def rss(self) -> Optional[Dict[str, int]]:
        return None

    def cpu_seconds(self) -> Optional[float]:
        """moraine's CPU time so far, user and system, all its threads (None for others)."""
        return None


def count_rows(conn, where: Optional[Dict[str, str]] = None) -> Dict[str, int]:
    """Rows of each table (optionally filtered), read in a transaction of its own."""
    counts = {}
    with conn.cursor() as cur:
        for table in TABLES:
            clause = f" WHERE {where[table]}" if where else ""
            cur.execute(f"SELECT count(*) FROM {table}{clause}")
            counts[table] = int(cur.fetchone()[0])
    conn.rollback()
    return counts


class Moraine(Target):
    key = "moraine"
    label = "moraine"
    flight = True

    def __init__(self, binary: Path, workdir: Path):
        super().__init__()
        self.binary = binary.resolve()
        self.workdir = workdir
        self.server: Optional[Server] = None
        self.data: Optional[Path] = None
        self.starts = 0
        if not os.access(self.binary, os.X_OK):
            raise HarnessError(f"moraine binary {self.binary} is missing or not executable")
        try:
            out = run([str(self.binary), "--version"], "moraine --version", 30).strip()
            self.version = out.split()[-1] if out else ""  # "moraine 0.1.0"
        except HarnessError:
            self.version = ""

    def flags(self) -> List[str]:
        return ["--txn-max-rows", str(MORAINE_TXN_MAX_ROWS),
                "--txn-max-bytes", str(MORAINE_TXN_MAX_BYTES),
                "--txn-idle-timeout", str(MORAINE_TXN_IDLE_TIMEOUT)]

    def start(self) -> None:
        self.starts += 1
        self.data = temp_dir(f"data-{self.starts}-", self.workdir)
        cmd = [str(self.binary), "serve", "--listen", "127.0.0.1:0",
               "--data", str(self.data)] + self.flags()
        env = dict(os.environ)
        env.pop("MORAINE_PD", None)  # always the embedded store
        self.server = Server("moraine", cmd, self.workdir / f"moraine-{self.starts}.log",
                             r"listening on (\S+)", SERVER_START_TIMEOUT, env=env)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.data is not None:
            shutil.rmtree(self.data, ignore_errors=True)
            self.data = None

    def reset_empty(self) -> None:
        # A fresh server on a fresh data directory (startup is never timed).
        self.stop()
        self.start()

    def abort(self) -> bool:
        if self.server is None:
            return False
        self.server.kill()
        return True

    def flight_uri(self) -> str:
        assert self.server is not None
        return f"grpc://{self.server.address}"

    def after_load(self) -> None:
        # The embedded store acknowledges a commit once its log record is durable and applies
        # it to redb after that, on a thread of its own: at 1M mappings that takes seconds of
        # CPU after the load. As PostgreSQL's VACUUM ANALYZE stands for what autovacuum would
        # have done by the time DuckLake reads, the reads start once that work is done.
        waited = self.wait_idle()
        log(f"moraine: idle {waited:.1f} s after the load")

    def wait_idle(self, window: float = 0.5, busy: float = 0.02,
                  timeout: float = 600.0) -> float:
        """Waits until the server spends at most `busy` seconds of CPU in a `window` (its
        background work done); returns the seconds waited. Gives up after `timeout`."""
        started = time.monotonic()
        last = self.cpu_seconds()
        while last is not None and time.monotonic() - started < timeout:
            time.sleep(window)
            now = self.cpu_seconds()
            if now is None or now - last <= busy:
                break
            last = now
        return time.monotonic() - started

    def connect(self):
        return flight_sql.connect(self.flight_uri())

    def describe(self) -> Dict[str, object]:
        return {"label": self.label, "binary": str(self.binary), "version": self.version,
                "build": _build_profile(self.binary),
                "command": "moraine serve --listen 127.0.0.1:0 --data <fresh temp dir> "
                           + " ".join(self.flags())}

    def _proc(self, name: str) -> Path:
        assert self.server is not None
        return Path(f"/proc/{self.server.pid}/{name}")

    def rss_reset(self) -> Optional[int]:
        """Reset the peak RSS (VmHWM) of the server: `5` into /proc/PID/clear_refs. Returns
        its RSS (VmRSS) right after: where the unit starts from."""
        if self.server is None:
            return None
        try:
            self._proc("clear_refs").write_text("5")
        except OSError as err:
            log(f"cannot reset moraine's peak RSS ({err}); peaks are since its start")
        return (self.rss() or {}).get("VmRSS")

    def _read_proc(self, name: str) -> Optional[str]:
        """/proc/PID/`name` of the running server, or None (no server, or it is gone)."""
        if self.server is None:
            return None
        try:
            return self._proc(name).read_text()
        except OSError:
            return None

    def rss(self) -> Optional[Dict[str, int]]:
        status = self._read_proc("status")
        if status is None:
            return None
        values = {}
        for line in status.splitlines():
            name, _, rest = line.partition(":")
            if name in ("VmHWM", "VmRSS"):
                values[name] = int(rest.split()[0]) * 1024
        return values

    def cpu_seconds(self) -> Optional[float]:
        """utime + stime of /proc/PID/stat: every thread's, in clock ticks (10 ms here)."""
        stat = self._read_proc("stat")
        if stat is None:
            return None
        # Fields after the command name, which is in parentheses and may hold spaces:
        # state is field 3, utime 14 and stime 15.
        fields = stat.rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _build_profile(binary: Path) -> str:
    parts = binary.parts
    for profile in ("release", "debug"):
        if profile in parts:
            return profile
    return "unknown"


class Transport(Target):
    key = "transport"
    label = "transport"
    flight = True
    has_storage = False

    def __init__(self, workdir: Path, results: Path):
        super().__init__()
        self.workdir = workdir
        self.results = results
        self.server: Optional[Server] = None

    def start(self) -> None:
        benches = Path(__file__).resolve().parent.parent
        env = dict(os.environ)
        env["PYTHONPATH"] = str(benches) + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [sys.executable, "-m", "compare.transport", "--results", str(self.results)]
        self.server = Server("transport", cmd, self.workdir / "transport.log",
                             r"transport listening on (\S+)", SERVER_START_TIMEOUT, env=env,
                             cwd=benches)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def reset_empty(self) -> None:
        pass  # it keeps nothing

    def abort(self) -> bool:
        if self.server is None:
            return False
        self.server.kill()
        return True

    def flight_uri(self) -> str:
        assert self.server is not None
        return f"grpc://{self.server.address}"

    def connect(self):
        return flight_sql.connect(self.flight_uri())

    def describe(self) -> Dict[str, object]:
        return {"label": self.label,
                "what": "in-memory Flight SQL server in Python (pyarrow.flight), a separate "
                        "process: precomputed results, ingested rows discarded"}


class Postgres(Target):
    key = "postgres"
    label = "PostgreSQL 15"

    def __init__(self, workdir: Path):
        super().__init__()
        self.workdir = workdir
        self.root: Optional[Path] = None
        self.port = 0
        self.version = ""
        self._stop_token: Optional[int] = None

    def _as_postgres(self, cmd: List[str]) -> List[str]:
        # initdb and postgres refuse to run as root.
        if os.geteuid() == 0:
            if shutil.which("runuser"):
                return ["runuser", "-u", "postgres", "--"] + cmd
            return ["su", "postgres", "-s", "/bin/sh", "-c", shlex.join(cmd)]
        return cmd

    def start(self) -> None:
        missing = [b for b in ("initdb", "pg_ctl", "postgres") if shutil.which(b) is None]
        if missing:
            raise HarnessError(f"PostgreSQL binaries not on PATH: {', '.join(missing)}")
        # "postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)" -> "15.18"
        out = run(["postgres", "--version"], "postgres --version", 30).strip()
        self.version = out.replace("postgres (PostgreSQL) ", "").split()[0] if out else "?"
        if not self.version.startswith("15."):
            log(f"note: expected PostgreSQL 15, found {out}")
        # Its own temporary directory: the harness's is private to root.
        self.root = temp_dir("moraine-compare-pg-")
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam("postgres")
            except KeyError as err:
                raise HarnessError("running as root needs a `postgres` user to run "
                                   "PostgreSQL as") from err
            os.chown(self.root, user.pw_uid, user.pw_gid)
        data, sock = self.root / "data", self.root / "sock"
        run(self._as_postgres(["mkdir", "-p", str(sock)]), "mkdir socket dir", 30)
        run(self._as_postgres(["initdb", "-D", str(data), "-U", "postgres", "--auth=trust",
                               "--encoding=UTF8", "--locale=C", "--no-instructions"]),
            "initdb", 180)
        self.port = free_port()
        options = f"-p {self.port} -k {sock} -c listen_addresses=127.0.0.1"
        self._stop_token = CLEANUP.add("stop PostgreSQL", self._pg_stop)
        run(self._as_postgres(["pg_ctl", "-w", "-t", "60", "-D", str(data),
                               "-l", str(self.root / "postgres.log"), "-o", options, "start"]),
            "pg_ctl start", 90)
        with self._admin() as conn, conn.cursor() as cur:
            for ddl in DUCKLAKE_DDL:
                cur.execute(ddl)

    def _uri(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _admin(self):
        return pg_dbapi.connect(self._uri(), autocommit=True)

    def connect(self):
        return pg_dbapi.connect(self._uri())

    def _pg_stop(self, mode: str = "fast") -> None:
        assert self.root is not None
        data = self.root / "data"
        if not (data / "postmaster.pid").exists():
            return
        try:
            run(self._as_postgres(["pg_ctl", "-D", str(data), "-m", mode, "-t", "60", "stop"]),
                f"pg_ctl stop -m {mode}", 90)
        except HarnessError as err:
            log(f"{err}; killing the postmaster")
            _kill_postmaster(data)

    def stop(self) -> None:
        if self._stop_token is not None:
            CLEANUP.run_one(self._stop_token)
            self._stop_token = None

    def abort(self) -> bool:
        if self.root is None:
            return False
        self._pg_stop("immediate")
        return True

    def reset_empty(self) -> None:
        with self._admin() as conn, conn.cursor() as cur:
            cur.execute("TRUNCATE " + ", ".join(TABLES))
            # Start every load from the same state: no checkpoint left pending from the last.
            cur.execute("CHECKPOINT")

    def after_load(self) -> None:
        # What autovacuum would have done by the time DuckLake reads a loaded catalog.
        with self._admin() as conn, conn.cursor() as cur:
            cur.execute("VACUUM ANALYZE")

    def describe(self) -> Dict[str, object]:
        return {"label": self.label, "version": self.version,
                "settings": "initdb defaults (fsync, synchronous_commit on, shared_buffers "
                            "128MB), locale C, TCP on 127.0.0.1; DuckLake's DDL; VACUUM "
                            "ANALYZE after the load, TRUNCATE + CHECKPOINT before each L round"}


def _kill_postmaster(data: Path) -> None:
    try:
        pid = int((data / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    for sig in (signal.SIGQUIT, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


class Sqlite(Target):
    key = "sqlite"
    label = "SQLite"

    def __init__(self, workdir: Path):
        super().__init__()
        self.dir = workdir / "sqlite"
        self.path = self.dir / "catalog.db"
        self.version = ""
        self.settings = ""

    def start(self) -> None:
        self.reset_empty()
        with sqlite_dbapi.connect(str(self.path)) as conn, conn.cursor() as cur:
            cur.execute("SELECT sqlite_version()")
            self.version = str(cur.fetchone()[0])
            cur.execute("PRAGMA journal_mode")
            journal = str(cur.fetchone()[0])
            cur.execute("PRAGMA synchronous")
            synchronous = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(
                int(cur.fetchone()[0]), "?")
            self.settings = (f"one file, the driver's defaults: journal_mode {journal}, "
                             f"synchronous {synchronous}; DuckLake's DDL")

    def reset_empty(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        with sqlite_dbapi.connect(str(self.path)) as conn, conn.cursor() as cur:
            for ddl in DUCKLAKE_DDL:
                cur.execute(ddl)
            conn.commit()

    def stop(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def connect(self):
        return sqlite_dbapi.connect(str(self.path))

    def describe(self) -> Dict[str, object]:
        return {"label": self.label, "version": self.version, "settings": self.settings}
