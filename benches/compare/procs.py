"""Processes, temporary directories and bounded waits.

Everything the harness starts or creates is registered in `CLEANUP`, which runs once: at the
end of `main` (its `finally`), at interpreter exit (`atexit`), on SIGTERM/SIGINT (turned into
`SystemExit`, so `finally` blocks run), and before a watchdog ends a stuck run. Servers started
directly are also told to die with the harness (`PR_SET_PDEATHSIG`), so even a SIGKILLed
harness leaves no moraine or transport process behind.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence

_PR_SET_PDEATHSIG = 1
try:  # loaded here, not in the forked child (no dlopen between fork and exec)
    _LIBC: Optional[ctypes.CDLL] = ctypes.CDLL(None, use_errno=True)
except OSError:
    _LIBC = None


def log(message: str) -> None:
    """A progress line on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class HarnessError(RuntimeError):
    """A failure with a message meant for the person running the benchmark."""


class Cleanup:
    """Undo actions, run last-registered first, each at most once, errors logged not raised."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._actions: List[tuple] = []
        self._next = 0

    def add(self, what: str, action: Callable[[], None]) -> int:
        with self._lock:
            self._next += 1
            self._actions.append((self._next, what, action))
            return self._next

    def remove(self, token: int) -> None:
        with self._lock:
            self._actions = [a for a in self._actions if a[0] != token]

    def run_one(self, token: int) -> None:
        """Run one action now (and forget it)."""
        with self._lock:
            found = [a for a in self._actions if a[0] == token]
            self._actions = [a for a in self._actions if a[0] != token]
        for _, what, action in found:
            _run(what, action)

    def run(self) -> None:
        with self._lock:
            actions, self._actions = self._actions, []
        for _, what, action in reversed(actions):
            _run(what, action)


def _run(what: str, action: Callable[[], None]) -> None:
    try:
        action()
    except Exception as err:  # cleanup goes on
        log(f"cleanup: {what} failed: {err}")


CLEANUP = Cleanup()
atexit.register(CLEANUP.run)


def _exit_on_signal(signum, _frame):
    raise SystemExit(128 + signum)


def install_signal_handlers() -> None:
    """SIGTERM and SIGINT end the run through SystemExit, so every `finally` runs."""
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGINT, _exit_on_signal)


def temp_dir(prefix: str, base: Optional[Path] = None) -> Path:
    import tempfile
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=str(base) if base else None))
    CLEANUP.add(f"remove {path}", lambda: shutil.rmtree(path, ignore_errors=True))
    return path


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the harness's (forking) thread ends. Without
    prctl (not Linux) the cleanup still runs on every orderly exit."""
    if _LIBC is not None and hasattr(_LIBC, "prctl"):
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def run(cmd: Sequence[str], what: str, timeout: float, **kwargs) -> str:
    """Run a command to completion within `timeout` seconds; its output on success, a
    HarnessError with the output's tail on failure."""
    try:
        done = subprocess.run(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as err:
        raise HarnessError(f"{what}: no answer within {timeout:.0f} s "
                           f"({' '.join(cmd)})") from err
    except OSError as err:
        raise HarnessError(f"{what}: cannot run {cmd[0]}: {err}") from err
    if done.returncode != 0:
        raise HarnessError(f"{what} failed (exit {done.returncode}): {tail(done.stdout)}")
    return done.stdout


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


class Server:
    """A server process whose output goes to a log file; ready when a line matches."""

    def __init__(self, name: str, cmd: Sequence[str], log_path: Path, ready: str,
                 timeout: float, env: Optional[dict] = None, cwd: Optional[Path] = None):
        self.name = name
        self.log_path = log_path
        self._log_file = open(log_path, "w")
        try:
            self.proc = subprocess.Popen(list(cmd), stdout=self._log_file,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, cwd=str(cwd) if cwd else None,
                                         preexec_fn=_die_with_parent)
        except OSError as err:
            self._log_file.close()
            raise HarnessError(f"{name}: cannot start {cmd[0]}: {err}") from err
        self._token = CLEANUP.add(f"stop {name} (pid {self.proc.pid})", self._stop)
        try:
            self.address = self._wait_ready(re.compile(ready), timeout)
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self) -> str:
        try:
            return tail(self.log_path.read_text(errors="replace"))
        except OSError:
            return ""

    def _wait_ready(self, pattern: re.Pattern, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log_path.read_text(errors="replace")
            match = pattern.search(text)
            if match:
                return match.group(1)
            if self.proc.poll() is not None:
                raise HarnessError(f"{self.name} exited ({self.proc.returncode}) before it "
                                   f"was ready: {self.log_tail()}")
            time.sleep(0.05)
        raise HarnessError(f"{self.name} was not ready within {timeout:.0f} s: "
                           f"{self.log_tail()}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """Immediately (the watchdog's way): the client's blocked call then fails."""
        if self.proc.poll() is None:
            self.proc.kill()

    def _stop(self) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(30)
                except subprocess.TimeoutExpired:
                    log(f"{self.name} did not stop within 30 s of SIGTERM: killing it")
                    self.proc.kill()
                    self.proc.wait(30)
        finally:
            self._log_file.close()

    def stop(self) -> None:
        CLEANUP.run_one(self._token)


class UnitTimeout(HarnessError):
    pass


class Watchdog:
    """Bounds one unit of work. After `seconds` it calls `abort` (which kills the stuck
    target's server, so the client's blocked call fails and the unit ends with an error); if
    the unit has still not returned `grace` seconds later, or there is nothing to abort, it
    cleans up and ends the whole run with exit code 3."""

    def __init__(self, seconds: float, what: str, abort: Optional[Callable[[], bool]],
                 grace: float = 60.0):
        self.seconds = seconds
        self.what = what
        self.abort = abort
        self.grace = grace
        self.fired = False
        self._timers: List[threading.Timer] = []

    def __enter__(self) -> "Watchdog":
        self._arm(self.seconds, self._fire)
        return self

    def _arm(self, seconds: float, action: Callable[[], None]) -> None:
        timer = threading.Timer(seconds, action)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def _fire(self) -> None:
        self.fired = True
        log(f"TIMEOUT: {self.what} took longer than {self.seconds:.0f} s")
        aborted = False
        if self.abort is not None:
            try:
                aborted = self.abort()
            except Exception as err:
                log(f"aborting {self.what} failed: {err}")
        if aborted:
            self._arm(self.grace, self._give_up)
        else:
            self._give_up()

    def _give_up(self) -> None:
        log(f"{self.what} is still stuck: cleaning up and ending the run (exit 3)")
        CLEANUP.run()
        sys.stderr.flush()
        os._exit(3)

    def __exit__(self, exc_type, exc, tb) -> bool:
        for timer in self._timers:
            timer.cancel()
        if self.fired and exc_type is None:
            raise UnitTimeout(f"{self.what} timed out after {self.seconds:.0f} s")
        if self.fired and exc is not None and not isinstance(exc, UnitTimeout):
            raise UnitTimeout(f"{self.what} timed out after {self.seconds:.0f} s "
                              f"(the target was stopped: {exc})") from exc
        return False
