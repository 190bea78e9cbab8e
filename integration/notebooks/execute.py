"""Runs catalog.ipynb against a fresh moraine server and writes it back with its outputs.

    MORAINE_BIN=<target dir>/debug/moraine python integration/notebooks/execute.py

with the Python suite's venv (integration/python/requirements.txt), from any directory. The
server gets a new data directory with DuckLake's recorded commits
(integration/fixtures/ducklake-0.3/steps.json) imported by `moraine import`, and listens on a
free port of 127.0.0.1; it is stopped, and the directory removed, afterwards. The notebook is
executed by an ipykernel of this very interpreter, with MORAINE_URI naming the server and
matplotlib on its Agg backend, and written in place (`--output PATH` writes it elsewhere). A
failing cell stops the run with that cell's error, and nothing is written.

integration/python/test_notebook.py runs the same notebook through `execute_notebook` below.
Without MORAINE_BIN, the debug binary in cargo's target directory is used.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Dict, Iterator, Optional

import nbformat
from ipykernel.kernelspec import write_kernel_spec
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from traitlets import default

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
NOTEBOOK = HERE / "catalog.ipynb"
FIXTURE = REPO / "integration" / "fixtures" / "ducklake-0.3" / "steps.json"

KERNEL_NAME = "moraine-notebook"
CELL_TIMEOUT_S = 120
IMPORT_TIMEOUT_S = 120
STARTUP_TIMEOUT_S = 60
SHUTDOWN_TIMEOUT_S = 20
LISTENING = re.compile(r"moraine listening on (\S+)")


# --------------------------------------------------------------------------------------------
# Executing the notebook.


def _kernel_manager_class(kernel_dir: Path) -> type:
    """An AsyncKernelManager that finds kernels in `kernel_dir` only, so neither a user's nor
    the system's kernelspecs can stand in for the one written there, and talks to its kernel
    over Unix sockets in that directory rather than TCP ports."""

    class KernelManager(AsyncKernelManager):
        @default("kernel_spec_manager")
        def _kernel_spec_manager_default(self) -> KernelSpecManager:
            return KernelSpecManager(kernel_dirs=[str(kernel_dir)], ensure_native_kernel=False)

        @default("transport")
        def _transport_default(self) -> str:
            return "ipc"

        @default("ip")
        def _ip_default(self) -> str:
            return str(kernel_dir / "kernel-ipc")

    return KernelManager


def execute_notebook(nb: nbformat.NotebookNode, uri: str, workdir: Path,
                     token: Optional[str] = None) -> nbformat.NotebookNode:
    """Executes `nb` in place (outputs replaced) against the server at `uri`, in a kernel of
    this interpreter (`sys.executable`), started in `workdir`, and returns it. A failing cell
    raises nbclient's CellExecutionError, which carries the cell's traceback."""
    # The kernelspec and the kernel's sockets, in a short path (a Unix socket's path is
    # limited to about 100 bytes).
    kernel_dir = Path(tempfile.mkdtemp(prefix="moraine-kernel-"))
    try:
        # ipykernel's own kernelspec for this interpreter; frozen modules off, as ipykernel's
        # installer does on 3.11+, so the debugger does not warn about them on startup.
        python_arguments = ["-Xfrozen_modules=off"] if sys.version_info >= (3, 11) else []
        write_kernel_spec(kernel_dir / KERNEL_NAME, python_arguments=python_arguments,
                          overrides={"display_name": "Python 3 (moraine notebook)"})

        env = dict(os.environ)
        env.update(MORAINE_URI=uri, MPLBACKEND="Agg", PYDEVD_DISABLE_FILE_VALIDATION="1")
        env.pop("MORAINE_TOKEN", None)
        if token is not None:
            env["MORAINE_TOKEN"] = token

        client = NotebookClient(
            nb,
            kernel_name=KERNEL_NAME,
            kernel_manager_class=_kernel_manager_class(kernel_dir),
            extra_arguments=["--InteractiveShell.colors=nocolor"],  # plain tracebacks
            timeout=CELL_TIMEOUT_S,
            record_timing=False,  # no timestamps in the cells' metadata
            resources={"metadata": {"path": str(workdir)}},
        )
        client.execute(env=env)
    finally:
        shutil.rmtree(kernel_dir, ignore_errors=True)
    # The notebook names the usual kernel, not this run's temporary one.
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    return nb


# --------------------------------------------------------------------------------------------
# A server on the imported fixture.


def moraine_bin() -> Path:
    env = os.environ.get("MORAINE_BIN")
    if env:
        return Path(env)
    meta = subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps"],
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    return Path(json.loads(meta.stdout)["target_directory"]) / "debug" / "moraine"


def _server_env() -> Dict[str, str]:
    env = dict(os.environ)
    env["RUST_LOG"] = "info"  # the `listening on` line is logged at info
    env["NO_COLOR"] = "1"
    for name in ("MORAINE_LISTEN", "MORAINE_DATA"):
        env.pop(name, None)
    return env


@contextlib.contextmanager
def fixture_server(binary: Path, root: Path) -> Iterator[str]:
    """`moraine import` of the fixture into a new data directory under `root`, then
    `moraine serve` on it on a free port of 127.0.0.1; yields its grpc:// URI and stops it."""
    data = root / "data"
    done = subprocess.run([str(binary), "import", "--data", str(data), str(FIXTURE)],
                          capture_output=True, text=True, errors="replace", env=_server_env(),
                          stdin=subprocess.DEVNULL, timeout=IMPORT_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"moraine import exited {done.returncode}:\n{done.stdout}{done.stderr}")

    # Endpoints of 256 bytes, so that the fixture's small tables divide as large ones do.
    proc = subprocess.Popen([str(binary), "serve", "--data", str(data), "--listen", "127.0.0.1:0",
                             "--endpoint-bytes", "256"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=_server_env(), text=True,
                            errors="replace")
    lines = []
    address: list = []
    listening = threading.Event()

    def drain() -> None:  # reads the server's output for its whole life, so it never blocks
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            m = LISTENING.search(line)
            if m and not listening.is_set():
                address.append(m.group(1))
                listening.set()
        listening.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        if not listening.wait(STARTUP_TIMEOUT_S) or not address:
            raise RuntimeError("moraine serve did not start listening; its output:\n"
                               + "\n".join(lines))
        yield f"grpc://{address[0]}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(SHUTDOWN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reader.join(5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=NOTEBOOK,
                        help="where to write the executed notebook (default: in place)")
    args = parser.parse_args()

    nb = nbformat.read(NOTEBOOK, as_version=4)
    root = Path(tempfile.mkdtemp(prefix="moraine-notebook-"))
    try:
        with fixture_server(moraine_bin(), root) as uri:
            execute_notebook(nb, uri, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    nbformat.validate(nb)
    nbformat.write(nb, args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
