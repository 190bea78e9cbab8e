"""Statistics, the JSON record and the Markdown table."""

from __future__ import annotations

import math
import os
import platform
import statistics
import subprocess
from typing import Any, Dict, List, Optional, Sequence

from .workloads import Outcome, Workload

# Report columns: the anchors, then moraine.
ANCHORS = ("postgres", "sqlite", "transport")
COLUMNS = ("postgres", "sqlite", "transport", "moraine")
LABELS = {"postgres": "PostgreSQL 15", "sqlite": "SQLite", "transport": "transport",
          "moraine": "moraine"}
# W5p runs on moraine only (and the transport anchor); PostgreSQL's figure for it is W5s's.
PG_STAND_IN = {"W5p": "W5s"}


def p99(values: Sequence[float]) -> float:
    """Nearest-rank 99th percentile: the maximum when there are fewer than 100 values."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def summarize(workload: Workload, outcome: Outcome) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    if outcome.skipped:
        out["skipped"] = outcome.skipped
    if outcome.error:
        out["error"] = outcome.error
    samples = outcome.samples
    if not samples:
        return out
    seconds = [s.seconds for s in samples]
    out["rounds"] = len(samples)
    out["seconds"] = seconds
    out["rows_per_round"] = samples[0].rows
    out["median_s"] = statistics.median(seconds)
    out["p99_s"] = p99(seconds)
    out["rows_per_s"] = statistics.median(s.rows / s.seconds for s in samples)
    if workload.rate:
        rates = [s.commits / s.seconds for s in samples]
        latencies = [x for s in samples for x in s.latencies]
        out["commits_per_round"] = samples[0].commits
        out["commits_per_s"] = rates
        out["median_commits_per_s"] = statistics.median(rates)
        if latencies:
            out["commit_latencies_s"] = [round(x, 6) for x in latencies]
            out["commit_latency_median_ms"] = statistics.median(latencies) * 1000
            out["commit_latency_p99_ms"] = p99(latencies) * 1000
            out["commit_latency_samples"] = len(latencies)
    peaks = [s.rss_peak for s in samples if s.rss_peak is not None]
    if peaks:
        out["peak_rss_bytes"] = max(peaks)
    growths = [s.rss_peak - s.rss_start for s in samples
               if s.rss_peak is not None and s.rss_start is not None]
    if growths:
        out["peak_rss_growth_bytes"] = max(growths)
    cpu = [s.cpu_seconds for s in samples if s.cpu_seconds is not None]
    if cpu:
        out["server_cpu_s"] = cpu
        out["server_cpu_median_s"] = statistics.median(cpu)
        if workload.rate and samples[0].commits:
            out["server_cpu_per_commit_ms"] = statistics.median(
                s.cpu_seconds / s.commits * 1000 for s in samples
                if s.cpu_seconds is not None and s.commits)
    return out


# moraine's CPU is read in clock ticks (10 ms on Linux): shown for units at least this long.
CPU_SHOWN_FROM_S = 0.1


def fmt_server_cpu(summary: Optional[Dict[str, Any]]) -> str:
    """moraine's median CPU time per unit (per commit for W5 rows), or — for units too short
    for clock ticks to measure."""
    if not summary or "server_cpu_median_s" not in summary:
        return "—"
    if summary.get("median_s", 0.0) < CPU_SHOWN_FROM_S:
        return "—"
    per_commit = summary.get("server_cpu_per_commit_ms")
    if per_commit is not None:
        return f"{per_commit * 1000:,.0f} µs/commit"
    return fmt_time(summary["server_cpu_median_s"])


def ratios(summaries: Dict[str, Dict[str, Dict[str, Any]]], rate_keys: Sequence[str]
           ) -> Dict[str, Dict[str, float]]:
    """moraine's time over each anchor's, per workload (for rates: the anchor's commits/s over
    moraine's, which is the same thing per commit). Below 1: moraine is faster."""
    out: Dict[str, Dict[str, float]] = {}
    for key, per_target in summaries.items():
        mine = per_target.get("moraine", {})
        row = {}
        for anchor in ANCHORS:
            theirs = per_target.get(anchor, {})
            if anchor == "postgres" and key in PG_STAND_IN:
                theirs = summaries.get(PG_STAND_IN[key], {}).get("postgres", {})
            if key in rate_keys:
                a, m = theirs.get("median_commits_per_s"), mine.get("median_commits_per_s")
                if a and m:
                    row[anchor] = a / m
            else:
                a, m = theirs.get("median_s"), mine.get("median_s")
                if a and m:
                    row[anchor] = m / a
        if row:
            out[key] = row
    return out


# --- machine ---------------------------------------------------------------------------------

def machine() -> Dict[str, Any]:
    info: Dict[str, Any] = {"uname": " ".join(platform.uname()), "nproc": os.cpu_count(),
                            "kernel": f"{platform.system()} {platform.release()}",
                            "python": platform.python_version()}
    try:
        info["uname"] = subprocess.run(["uname", "-a"], capture_output=True, text=True,
                                       timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        info["nproc"] = int(subprocess.run(["nproc"], capture_output=True, text=True,
                                           timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                info["memory_bytes"] = int(line.split()[1]) * 1024
                break
    except OSError:
        pass
    return info


# --- formatting ------------------------------------------------------------------------------

def fmt_time(seconds: float) -> str:
    if seconds < 1:
        ms = seconds * 1000
        return f"{ms:.3g} ms" if ms < 100 else f"{ms:.0f} ms"
    return f"{seconds:.3g} s" if seconds < 100 else f"{seconds:.0f} s"


def fmt_rate(per_s: float, unit: str = "commits/s") -> str:
    if per_s >= 1e6:
        return f"{per_s / 1e6:.3g}M {unit}"
    if per_s >= 1e4:
        return f"{per_s / 1e3:.3g}k {unit}"
    return f"{per_s:.3g} {unit}" if per_s < 100 else f"{per_s:,.0f} {unit}"


def fmt_bytes(n: Optional[int]) -> str:
    if n is None:
        return "—"
    if n >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    return f"{n / (1 << 20):.0f} MiB"


def fmt_ratio(x: Optional[float]) -> str:
    if x is None:
        return "—"
    return f"{x:.2f}×" if x < 10 else f"{x:.1f}×" if x < 100 else f"{x:.0f}×"


def _cell(summary: Dict[str, Any], rate: bool, notes: List[str]) -> str:
    if "error" in summary and not summary.get("rounds"):
        notes.append(str(summary["error"]))
        return f"error [{len(notes)}]"
    if "skipped" in summary and not summary.get("rounds"):
        return "—"
    if not summary.get("rounds"):
        return "—"
    text = (fmt_rate(summary["median_commits_per_s"]) if rate
            else fmt_time(summary["median_s"]))
    if "error" in summary:
        notes.append(str(summary["error"]))
        text += f" (error [{len(notes)}])"
    return text


def markdown(record: Dict[str, Any]) -> str:
    cat = record["catalog"]
    mach = record["machine"]
    workloads = record["workloads"]
    moraine = record["targets"].get("moraine")
    mem = mach.get("memory_bytes")
    build = (f" — moraine {moraine.get('version') or ''} ({moraine.get('build', '?')} build)"
             if moraine else "")
    lines = [
        f"moraine against its anchors — scale {record['scale']}: {cat['mappings']:,} mappings, "
        f"{cat['name_rows']:,} name rows, {cat['data_files']:,} data files, "
        f"{cat['tables']:,} tables (seed {record['seed']}) — {record['date']} — "
        f"{mach.get('cpu', '?')}, {mach.get('nproc', '?')} CPUs, "
        f"{fmt_bytes(mem) if mem else '?'} RAM, {mach.get('kernel', '?')}"
        f"{build} — {record['rounds']} round{'s' if record['rounds'] != 1 else ''}",
        "",
        "| workload | PostgreSQL 15 | SQLite | transport | moraine | moraine/PG | "
        "moraine/transport | moraine peak RSS | moraine CPU |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    notes: List[str] = []
    ratio = record.get("ratios", {})
    for key, w in workloads.items():
        per = w["targets"]
        rate = w["kind"] == "rate"
        cells = []
        for col in COLUMNS:
            summary = per.get(col)
            if col == "postgres" and key in PG_STAND_IN and not summary:
                stand_in = workloads.get(PG_STAND_IN[key], {}).get("targets", {}).get(col)
                if stand_in and stand_in.get("rounds"):
                    cells.append(_cell(stand_in, True, notes) + f" ({PG_STAND_IN[key]})")
                    continue
            cells.append(_cell(summary, rate, notes) if summary else "—")
        r = ratio.get(key, {})
        peak = (per.get("moraine") or {}).get("peak_rss_bytes")
        lines.append(f"| **{key}** {w['label']} | " + " | ".join(cells) + " | "
                     f"{fmt_ratio(r.get('postgres'))} | {fmt_ratio(r.get('transport'))} | "
                     f"{fmt_bytes(peak)} | {fmt_server_cpu(per.get('moraine'))} |")
    lines += ["", *legend(record)]
    if notes:
        lines += ["", "Errors:", ""]
        lines += [f"{i}. {_one_line(n)}" for i, n in enumerate(notes, 1)]
    lines += ["", *details(record)]
    return "\n".join(lines) + "\n"


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "…"


def legend(record: Dict[str, Any]) -> List[str]:
    cat = record["catalog"]
    plan = record["read_plan"]
    workloads = record["workloads"]
    out = [
        "Each figure is the median over the rounds (workloads run in interleaved rounds: every "
        "target once per round). Times are client-side wall times through the real ADBC "
        "driver (`adbc_driver_flightsql`, `_postgresql`, `_sqlite` 1.13); W5 rows are "
        "commits/s. **Ratios are moraine's time over the anchor's** (for commits/s: the "
        "anchor's commits/s over moraine's, i.e. time per commit): below 1 means moraine is "
        "faster, 2× means it takes twice as long. *transport* is an in-memory Flight SQL "
        "server that returns precomputed results and discards writes: the floor the protocol "
        "and client allow. PostgreSQL's W5p cell is its W5s (ADBC) figure. Peak RSS is "
        "moraine's VmHWM (reset before each unit), the maximum over rounds; its growth is that "
        "peak less moraine's VmRSS when the unit started. moraine CPU is the server "
        "process's user and system time, all threads, from the unit's start to its end "
        "(what the server still does after that, such as applying the last commit to redb, "
        "is not counted), the median over rounds, per commit for W5 rows; it is read in "
        "clock ticks of 10 ms, so it is shown only for units of 100 ms or more. Beside the "
        "wall time it tells how much of a unit the server spent working, and how much "
        "waiting for the client.",
        "",
        f"W3's cursor returns the last 10 mappings (mapping_id >= {plan['cursor']}). "
        f"W4m reads table {plan['w4m']['table_id']} ({plan['w4m']['mappings']:,} mappings, "
        f"{plan['w4m']['name_rows']:,} name rows); W4L the largest, table "
        f"{plan['w4l']['table_id']} ({plan['w4l']['mappings']:,} mappings, "
        f"{plan['w4l']['name_rows']:,} name rows). Catalog generated in "
        f"{cat['generation_s']:.1f} s.",
    ]
    scaling = record.get("w5c_over_w5p")
    if scaling:
        parts = [f"{LABELS[k]} {v:.2f}×" for k, v in scaling.items()]
        writers = workloads.get("W5c", {}).get("writers")
        out += ["", f"W5c/W5p ({writers} writers over 1, commits/s): " + ", ".join(parts) + "."]
    bounds = []
    for key in ("L", "W5b"):
        payload = workloads.get(key, {}).get("payload_bytes")
        moraine = workloads.get(key, {}).get("targets", {}).get("moraine", {})
        peak, growth = moraine.get("peak_rss_bytes"), moraine.get("peak_rss_growth_bytes")
        if payload and peak:
            bound = f"{key} {fmt_bytes(payload)}, moraine's peak RSS {peak / payload:.2f}× it"
            if growth is not None:
                bound += (f" (its growth over the RSS the unit started from, "
                          f"{growth / payload:.2f}× it)")
            bounds.append(bound)
    if bounds:
        out += ["", "Payload (the Arrow size of the rows a unit writes): " + "; ".join(bounds)
                + "."]
    final = record.get("moraine_final_rss_bytes")
    if final and final.get("VmRSS"):
        out += ["", f"moraine's RSS at the end of the run: {fmt_bytes(final['VmRSS'])} "
                    f"(VmRSS)."]
    out += ["", "Targets:", ""]
    for key in COLUMNS:
        t = record["targets"].get(key)
        if not t:
            continue
        if key == "moraine":
            text = (f"moraine {t.get('version', '')}, {t.get('build', '?')} build: "
                    f"`{t.get('command', '')}` (staging limits raised for the one-transaction "
                    "load; a fresh server and data directory for each L round)")
        elif key == "postgres":
            text = f"PostgreSQL {t.get('version', '')}: {t.get('settings', '')}"
        elif key == "sqlite":
            text = f"SQLite {t.get('version', '')}: {t.get('settings', '')}"
        else:
            text = f"transport: {t.get('what', '')}"
        if t.get("failed"):
            text += f". **Left out: {_one_line(t['failed'], 300)}**"
        out.append(f"- {text}")
    return out


def details(record: Dict[str, Any]) -> List[str]:
    workloads = record["workloads"]
    out = ["<details><summary>Medians, p99 and throughput per target</summary>", "",
           "p99 is nearest-rank; with fewer than 100 samples it is the maximum. For W5 rows "
           "the latency columns are per commit, over all rounds.", "",
           "| workload | target | median | p99 | rows/s | commit latency median / p99 | rounds |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for key, w in workloads.items():
        for col in COLUMNS:
            s = w["targets"].get(col)
            if not s or not s.get("rounds"):
                continue
            latency = ""
            if "commit_latency_median_ms" in s:
                latency = (f"{fmt_time(s['commit_latency_median_ms'] / 1000)} / "
                           f"{fmt_time(s['commit_latency_p99_ms'] / 1000)}")
            out.append(f"| {key} | {LABELS[col]} | {fmt_time(s['median_s'])} | "
                       f"{fmt_time(s['p99_s'])} | {fmt_rate(s['rows_per_s'], 'rows/s')} | "
                       f"{latency} | {s['rounds']} |")
    out += ["", "</details>"]
    return out
