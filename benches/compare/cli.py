"""Command line and orchestration of benches/compare.py (see its docstring)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Dict, List, Optional

import pyarrow.ipc as ipc

from . import report
from .catalog import generate
from .procs import (CLEANUP, HarnessError, UnitTimeout, Watchdog, install_signal_handlers, log,
                    temp_dir)
from .targets import Moraine, Postgres, Sqlite, Target, Transport
from .workloads import (ALL_WORKLOADS, BulkCommit, ConcurrentFlightCommits, FlightCommits, Load,
                        Outcome, SequentialCommits, Workload, chunked, load_catalog, read_plan)

SCALES = {"small": 10_000, "medium": 100_000, "large": 1_000_000}
DEFAULT_ROUNDS = {"small": 5, "medium": 5, "large": 3}
W5B_MAPPINGS = {"small": 10_000, "medium": 100_000, "large": 100_000}
UNIT_TIMEOUT_S = {"small": 600, "medium": 1800, "large": 7200}
DEFAULT_SEED = 20251201
ALL_TARGETS = ("postgres", "sqlite", "transport", "moraine")
BENCHES = Path(__file__).resolve().parent.parent


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="compare.py",
        description="moraine against PostgreSQL 15, SQLite and a Flight transport anchor, "
                    "on a synthetic DuckLake catalog, through real ADBC clients.")
    ap.add_argument("--scale", choices=sorted(SCALES), default="medium",
                    help="small = 10k mappings, medium = 100k, large = 1M (default medium)")
    ap.add_argument("--mappings", type=int,
                    help="override the scale's mapping count (at least 100)")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--rounds", type=int, help="default 5 (3 at large)")
    ap.add_argument("--binary", type=Path, help="the moraine binary (needed for target moraine)")
    ap.add_argument("--targets", default=",".join(ALL_TARGETS),
                    help=f"comma-separated subset of {','.join(ALL_TARGETS)}")
    ap.add_argument("--workloads", default=",".join(ALL_WORKLOADS),
                    help=f"comma-separated subset of {','.join(ALL_WORKLOADS)}")
    ap.add_argument("--commits", type=int, default=300,
                    help="commits per round of W5s, W5p and W5c (default 300)")
    ap.add_argument("--w5b-mappings", type=int,
                    help="mappings in W5b's transaction (default 100k; 10k at small)")
    ap.add_argument("--writers", type=int, default=8, help="W5c's concurrent writers")
    ap.add_argument("--unit-timeout", type=float,
                    help="seconds one timed unit (or its setup) may take before its target is "
                         "stopped (default 600 small, 1800 medium, 7200 large)")
    ap.add_argument("--out-dir", type=Path, default=BENCHES / "results",
                    help="where compare-<scale>.json and .md go (default benches/results)")
    args = ap.parse_args(argv)

    args.targets = _subset(ap, "--targets", args.targets, ALL_TARGETS)
    args.workloads = _subset(ap, "--workloads", args.workloads, ALL_WORKLOADS)
    if args.mappings is not None and args.mappings < 100:
        ap.error("--mappings must be at least 100")
    if args.rounds is not None and args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if args.commits < 1 or args.writers < 1:
        ap.error("--commits and --writers must be at least 1")
    if "moraine" in args.targets and args.binary is None:
        ap.error("target moraine needs --binary PATH (or leave it out of --targets)")
    return args


def _subset(ap: argparse.ArgumentParser, flag: str, value: str, allowed) -> List[str]:
    chosen = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in allowed]
    if unknown or not chosen:
        ap.error(f"{flag}: unknown {', '.join(unknown) or '(empty)'}; choose from "
                 f"{', '.join(allowed)}")
    return [v for v in allowed if v in chosen]  # canonical order


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    install_signal_handlers()
    try:
        return Harness(args).run()
    except HarnessError as err:
        log(f"error: {err}")
        return 2
    finally:
        CLEANUP.run()


class Harness:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.scale = args.scale
        self.mappings = args.mappings or SCALES[args.scale]
        self.scale_label = args.scale if args.mappings is None else f"{self.mappings}-mappings"
        self.rounds = args.rounds or DEFAULT_ROUNDS[args.scale]
        self.unit_timeout = args.unit_timeout or UNIT_TIMEOUT_S[args.scale]
        self.w5b_mappings = args.w5b_mappings or W5B_MAPPINGS[args.scale]
        self.targets: List[Target] = []
        self.loaded_ready = False
        self.next_id_after_load = 0

    # --- the run ---------------------------------------------------------------------------

    def run(self) -> int:
        args = self.args
        started = dt.datetime.now(dt.timezone.utc)
        log(f"scale {self.scale_label}: {self.mappings:,} mappings, seed {args.seed}, "
            f"{self.rounds} rounds; targets {', '.join(args.targets)}; workloads "
            f"{', '.join(args.workloads)}")
        t0 = time.perf_counter()
        catalog = generate(self.mappings, args.seed)
        generation_s = time.perf_counter() - t0
        self.next_id_after_load = catalog.next_id
        log(f"catalog: {catalog.mappings:,} mappings, {catalog.name_mapping.num_rows:,} name "
            f"rows, {catalog.data_file.num_rows:,} data files, {len(catalog.schemas):,} tables "
            f"({generation_s:.1f} s)")
        plan = read_plan(catalog)
        load_tables = [(name, chunked(table)) for name, table in catalog.tables()]
        workdir = temp_dir("moraine-compare-")

        self.targets = self._make_targets(workdir, plan)
        for target in self.targets:
            try:
                with Watchdog(self.unit_timeout, f"starting {target.label}", target.abort):
                    target.start()
                log(f"{target.label}: started")
            except HarnessError as err:
                target.failed = f"did not start: {err}"
                log(f"{target.label} is left out: {target.failed}")
            CLEANUP.add(f"stop {target.label}", target.stop)

        load = Load(catalog, load_tables)
        workloads: Dict[str, Workload] = {"L": load}
        workloads.update({r.key: r for r in plan.reads})
        workloads["W5s"] = SequentialCommits(catalog, args.commits, 10)
        workloads["W5b"] = BulkCommit(catalog, self.w5b_mappings)
        workloads["W5p"] = FlightCommits(catalog, args.commits, 10, self.unit_timeout)
        workloads["W5c"] = ConcurrentFlightCommits(catalog, args.commits, 10,
                                                   self.unit_timeout, args.writers)

        outcomes: Dict[str, Dict[str, Outcome]] = {}
        for key in args.workloads:
            workload = workloads[key]
            if key != "L":
                self._ensure_loaded(load_tables, catalog.rows)
            log(f"== {key}: {workload.describe()['title']}")
            outcomes[key] = self._run_rounds(workload)

        final_rss = None
        for target in self.targets:
            if target.key == "moraine" and not target.failed:
                final_rss = target.rss()

        record = self._record(started, catalog, generation_s, plan, workloads, outcomes,
                              final_rss)
        self._write(record)
        failures = [f"{k} on {report.LABELS[t]}: {s['error']}"
                    for k, w in record["workloads"].items()
                    for t, s in w["targets"].items() if "error" in s]
        failures += [f"{t.label}: {t.failed}" for t in self.targets if t.failed]
        if failures:
            log(f"finished with {len(failures)} failure(s), recorded in the report:")
            for failure in failures:
                log(f"  {report._one_line(failure, 300)}")
            return 1
        log("finished")
        return 0

    def _make_targets(self, workdir: Path, plan) -> List[Target]:
        targets: List[Target] = []
        for key in self.args.targets:
            if key == "postgres":
                targets.append(Postgres(workdir))
            elif key == "sqlite":
                targets.append(Sqlite(workdir))
            elif key == "transport":
                targets.append(Transport(workdir, self._transport_results(workdir, plan)))
            elif key == "moraine":
                targets.append(Moraine(self.args.binary, workdir))
        return targets

    def _transport_results(self, workdir: Path, plan) -> Path:
        """The read workloads' answers as Arrow IPC files, in large record batches."""
        out = workdir / "transport-results"
        out.mkdir()
        entries = []
        t0 = time.perf_counter()
        for i, read in enumerate(plan.reads):
            if read.key not in self.args.workloads:
                continue
            table = chunked(plan.results[read.sql]())
            path = out / f"r{i}.arrow"
            with ipc.new_file(str(path), table.schema) as writer:
                writer.write_table(table)
            entries.append({"sql": read.sql, "file": path.name, "rows": table.num_rows})
        (out / "manifest.json").write_text(json.dumps({"results": entries}))
        plan.results.clear()  # the answers live in the files now; free the harness's copies
        log(f"transport anchor: {len(entries)} precomputed results "
            f"({time.perf_counter() - t0:.1f} s)")
        return out

    def _ensure_loaded(self, load_tables, rows: int) -> None:
        """Every live target holds the loaded catalog (loaded outside any timing)."""
        for target in self.targets:
            if target.failed or target.loaded:
                continue
            log(f"{target.label}: loading the catalog (not timed)")
            try:
                with Watchdog(self.unit_timeout, f"loading {target.label}", target.abort):
                    target.reset_empty()
                    load_catalog(target, load_tables, rows)
            except HarnessError as err:
                target.failed = f"could not load the catalog: {err}"
                log(f"{target.label} is left out: {target.failed}")
            except Exception as err:
                target.failed = f"could not load the catalog: {type(err).__name__}: {err}"
                log(f"{target.label} is left out: {target.failed}")
        if not self.loaded_ready:
            self.loaded_ready = True
            for target in self.targets:
                if target.failed:
                    continue
                try:
                    with Watchdog(self.unit_timeout, f"preparing {target.label}", target.abort):
                        target.after_load()
                except Exception as err:
                    target.failed = f"after the load: {type(err).__name__}: {err}"
                    log(f"{target.label} is left out: {target.failed}")

    def _run_rounds(self, workload: Workload) -> Dict[str, Outcome]:
        active = [t for t in self.targets if workload.applies(t)]
        outcomes = {t.key: Outcome() for t in active}
        for target in active:
            if target.failed:
                outcomes[target.key].skipped = target.failed
        try:
            for r in range(self.rounds):
                runnable = [t for t in active
                            if not t.failed and outcomes[t.key].error is None]
                if not runnable:
                    break
                data = workload.prepare(r)
                for target in runnable:
                    what = f"{workload.key} round {r + 1}/{self.rounds} on {target.label}"
                    outcome = outcomes[target.key]
                    try:
                        with Watchdog(self.unit_timeout, what, target.abort):
                            sample = workload.run(target, data)
                    except Exception as err:
                        outcome.error = f"round {r + 1}: {type(err).__name__}: {err}"
                        log(f"{what}: FAILED: {report._one_line(str(err), 300)}")
                        workload.drop_session(target)
                        if isinstance(err, UnitTimeout) or not _alive(target):
                            target.failed = f"stopped during {what}: {err}"
                        continue
                    outcome.samples.append(sample)
                    log(f"{what}: {_progress(workload, sample)}")
        finally:
            # Closing sends CloseSession; bounded like everything else.
            with Watchdog(120, f"closing {workload.key}'s connections", None):
                workload.close()
        return outcomes

    # --- the record ------------------------------------------------------------------------

    def _record(self, started, catalog, generation_s, plan, workloads, outcomes, final_rss):
        sizes = catalog.table_sizes()
        largest = max(sizes.items(), key=lambda kv: (kv[1][0], -kv[0]))
        summaries = {key: {t: report.summarize(workloads[key], o) for t, o in per.items()}
                     for key, per in outcomes.items()}
        rate_keys = [k for k in outcomes if workloads[k].rate]
        record = {
            "harness": "benches/compare.py",
            "scale": self.scale_label,
            "seed": self.args.seed,
            "date": started.strftime("%Y-%m-%d %H:%M UTC"),
            "rounds": self.rounds,
            "unit_timeout_s": self.unit_timeout,
            "machine": report.machine(),
            "versions": _versions(),
            "git_commit": _git_commit(),
            "catalog": {
                "mappings": catalog.mappings,
                "name_rows": catalog.name_mapping.num_rows,
                "data_files": catalog.data_file.num_rows,
                "data_files_without_mapping": catalog.data_file.column("mapping_id").null_count,
                "tables": len(sizes),
                "mean_name_rows_per_mapping": catalog.name_mapping.num_rows / catalog.mappings,
                "largest_table": {"table_id": largest[0], "mappings": largest[1][0],
                                  "name_rows": largest[1][1]},
                "largest_tables_mappings": sorted((m for m, _ in sizes.values()),
                                                  reverse=True)[:10],
                "median_table_mappings": statistics.median(m for m, _ in sizes.values()),
                "smallest_table_mappings": min(m for m, _ in sizes.values()),
                "next_file_id_after_load": self.next_id_after_load,
                "generation_s": generation_s,
            },
            "read_plan": {
                "cursor": plan.cursor,
                "w4m": dict(zip(("table_id", "mappings", "name_rows"), plan.w4m_table)),
                "w4l": dict(zip(("table_id", "mappings", "name_rows"), plan.w4l_table)),
            },
            "targets": {t.key: {**t.describe(), **({"failed": t.failed} if t.failed else {})}
                        for t in self.targets},
            "workloads": {},
            "ratios": report.ratios(summaries, rate_keys),
            "ratio_definition": "moraine median time / anchor median time (for commits/s: "
                                "anchor commits/s / moraine commits/s); < 1: moraine faster",
            "p99_definition": "nearest rank; the maximum when there are fewer than 100 samples",
            "moraine_final_rss_bytes": final_rss,
        }
        for key in outcomes:
            w = workloads[key]
            record["workloads"][key] = {
                **w.describe(), "label": w.label(), "kind": "rate" if w.rate else "time",
                "targets": summaries[key]}
        w5c = summaries.get("W5c", {})
        w5p = summaries.get("W5p", {})
        scaling = {}
        for t in ("moraine", "transport"):
            a = w5c.get(t, {}).get("median_commits_per_s")
            b = w5p.get(t, {}).get("median_commits_per_s")
            if a and b:
                scaling[t] = a / b
        if scaling:
            record["w5c_over_w5p"] = scaling
        return record

    def _write(self, record) -> None:
        out = self.args.out_dir
        out.mkdir(parents=True, exist_ok=True)
        stem = f"compare-{self.scale_label}"
        (out / f"{stem}.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
        text = report.markdown(record)
        (out / f"{stem}.md").write_text(text)
        log(f"wrote {out / (stem + '.json')} and {out / (stem + '.md')}")
        print(text)


def _alive(target: Target) -> bool:
    server = getattr(target, "server", None)
    if server is not None:
        return server.alive()
    root = getattr(target, "root", None)
    if root is not None:
        return (root / "data" / "postmaster.pid").exists()
    return True


def _progress(workload: Workload, sample) -> str:
    text = report.fmt_time(sample.seconds)
    if workload.rate and sample.seconds > 0:
        text += f", {report.fmt_rate(sample.commits / sample.seconds)}"
    if sample.seconds > 0:
        text += f", {report.fmt_rate(sample.rows / sample.seconds, 'rows/s')}"
    if sample.rss_peak:
        text += f", peak RSS {report.fmt_bytes(sample.rss_peak)}"
    if sample.cpu_seconds is not None:
        text += f", server CPU {report.fmt_time(sample.cpu_seconds)}"
    return text


def _versions() -> Dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for package in ("pyarrow", "adbc-driver-manager", "adbc-driver-flightsql",
                    "adbc-driver-postgresql", "adbc-driver-sqlite"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = "not installed"
    return out


def _git_commit() -> Optional[str]:
    try:
        done = subprocess.run(["git", "-C", str(BENCHES), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None
