"""The example notebook, integration/notebooks/catalog.ipynb, run top to bottom by a real
Jupyter kernel against a fresh server on the imported fixture.

The notebook is executed in memory with nbclient (through integration/notebooks/execute.py's
`execute_notebook`, which `execute.py` itself uses to refresh the committed copy), by an
ipykernel of this interpreter with MORAINE_URI naming the server and matplotlib on Agg; a
failing cell fails the test with the cell's traceback (nbclient's CellExecutionError). The
committed notebook is never rewritten: the executed copy goes to the test's temporary
directory. Beyond running, the test checks what the cells showed (the plot as a PNG, the row
counts of the fixture, the new mapping read back) and what the server holds afterwards.
"""

from __future__ import annotations

import base64
import importlib.util

import nbformat
import pytest

from conftest import COLUMN_MAPPING, DATA_FILE, NAME_MAPPING, REPO, autocommit_cursor, diff_states
from test_writes_pyarrow import read_committed

NOTEBOOKS = REPO / "integration" / "notebooks"
NOTEBOOK = NOTEBOOKS / "catalog.ipynb"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _execute_module():
    spec = importlib.util.spec_from_file_location("notebook_execute", NOTEBOOKS / "execute.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def text_of(cell) -> str:
    """Everything a code cell printed or displayed as text."""
    parts = []
    for out in cell.outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type in ("execute_result", "display_data"):
            parts.append(out.data.get("text/plain", ""))
    return "\n".join(parts)


def pngs_of(cell) -> list:
    return [base64.b64decode(out.data["image/png"]) for out in cell.outputs
            if out.output_type == "display_data" and "image/png" in out.data]


def check_plot(cells, what: str) -> None:
    pngs = pngs_of(cells["plot"])
    assert len(pngs) == 1, f"{what}: the plot cell displayed {len(pngs)} PNG images, not one"
    assert pngs[0].startswith(PNG_MAGIC) and len(pngs[0]) > 5000, \
        f"{what}: the plot cell's image is no real PNG ({len(pngs[0])} bytes)"


def test_committed_notebook_carries_its_outputs():
    """The committed copy is the executed one (the README links to it): every code cell ran,
    in order, and the plot is there."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), \
        "the committed notebook was not executed top to bottom: run integration/notebooks/execute.py"
    errors = [c.id for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, f"the committed notebook holds errors in cells {errors}"
    check_plot({c.id: c for c in code}, "committed notebook")


def test_notebook_runs_against_the_fixture(server_factory, expected, tmp_path):
    running = server_factory("notebook", extra_args=["--endpoint-bytes", "256"])
    committed = NOTEBOOK.read_bytes()
    nb = nbformat.reads(committed.decode("utf-8"), as_version=4)
    try:
        _execute_module().execute_notebook(nb, running.uri, tmp_path)
    finally:
        nbformat.write(nb, tmp_path / "catalog.executed.ipynb")  # to look at after a failure
    assert NOTEBOOK.read_bytes() == committed, "executing the notebook changed the committed file"

    cells = {c.id: c for c in nb.cells if c.cell_type == "code"}
    noisy = {i: text_of(c) for i, c in cells.items()
             if any(o.output_type == "stream" and o.name == "stderr" for o in c.outputs)}
    assert not noisy, f"cells wrote to stderr (warnings?): {noisy}"

    check_plot(cells, "executed notebook")
    n_names, n_files = len(expected[NAME_MAPPING]), len(expected[DATA_FILE])
    assert f"{n_names} rows from" in text_of(cells["endpoints"]), text_of(cells["endpoints"])
    assert f"count(*) says {n_names}" in text_of(cells["endpoints"])
    assert f"{n_files} data files from" in text_of(cells["partitions"]), text_of(cells["partitions"])

    # The new mapping: ids after the fixture's largest (mapping and data-file ids share
    # DuckLake's counter), on the table id after the largest.
    mapping_id = max([r[0] for r in expected[COLUMN_MAPPING]]
                     + [r[0] for r in expected[DATA_FILE]]) + 1
    table_id = max(r[1] for r in expected[COLUMN_MAPPING]) + 1
    shown = text_of(cells["read-back"])
    assert f"mapping {mapping_id} (table {table_id}): 5 name rows, data file {mapping_id + 1}" \
        in shown, shown
    assert "\npayload  (column 1" in shown and "\n    kind  (column 2" in shown, \
        f"the read-back tree does not nest `kind` under `payload`:\n{shown}"

    # The server holds it, and nothing else changed.
    with autocommit_cursor(running.uri) as cur:
        cur.execute("SELECT column_id, parent_column FROM ducklake_name_mapping "
                    "WHERE mapping_id = ? ORDER BY column_id", (mapping_id,))
        names = cur.fetchall()
        cur.execute("SELECT data_file_id, table_id FROM ducklake_data_file WHERE mapping_id = ?",
                    (mapping_id,))
        files = cur.fetchall()
    assert len(names) == 5 and any(parent is not None for _, parent in names), names
    assert files == [(mapping_id + 1, table_id)], files
    ours = lambda row: row["mapping_id"] == mapping_id  # noqa: E731
    after = read_committed(running.uri)
    rest = (after.without_rows(COLUMN_MAPPING, ours).without_rows(NAME_MAPPING, ours)
            .without_rows(DATA_FILE, ours))
    diff = diff_states(rest, expected)
    if diff:
        pytest.fail(f"the notebook changed more than its own mapping:\n{diff}", pytrace=False)
