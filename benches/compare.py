#!/usr/bin/env python3
"""moraine against PostgreSQL 15, SQLite and a Flight transport anchor, on one synthetic
DuckLake catalog, through the real ADBC clients.

`python benches/compare.py --scale {small,medium,large} --binary target/release/moraine`
generates a deterministic DuckLake catalog (10k, 100k or 1M foreign-file mappings with their
name rows and data files; `--mappings N` and `--seed` override), starts every target on
temporary storage — `moraine serve`, a throwaway PostgreSQL 15 cluster, a SQLite file and an
in-memory Flight SQL server that answers with precomputed results (the transport floor) — and
runs the workloads in interleaved rounds: L (load the catalog in one transaction), W1-W4 (reads,
DuckLake's mapping load and its cursor and per-table forms), W5s/W5b (commits through ADBC
ingest), W5p/W5c (one-stream plain Flight commits, sequential and concurrent; moraine and the
transport anchor only). Every result is checked against the generator. Medians, p99, rows/s,
moraine-to-anchor ratios and moraine's peak RSS go to `benches/results/compare-<scale>.json`
and `.md`; progress goes to stderr. `--targets`, `--workloads` and `--rounds` pick a subset;
`--help` lists the rest. `benches/compare-env` (or `just bench-compare`) builds the pinned venv
from benches/requirements.txt and runs it. Exit status: 0 when everything ran and checked out,
1 when the report records a failure, 2 when the harness could not run, 3 when a stuck unit
ended the run.
"""

import sys
from pathlib import Path

if sys.version_info < (3, 10):
    sys.exit("benches/compare.py needs Python 3.10 or newer")

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare.cli import main  # noqa: E402  (the package sits beside this file)

if __name__ == "__main__":
    sys.exit(main())
