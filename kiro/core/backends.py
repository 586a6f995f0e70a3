"""Where a workspace's loops run (SPEC §12): the `Backend` protocol, its `local` implementation, the
choice between backends (`uses_temporal`, `backend_for`), and the one way kiro starts itself in the
background (`start_in_background`: a detached loop, `kiro loop watch --detach`, the temporal workspace
worker).

The temporal implementation lives in `kiro.temporal.commands` (above core); it is found by name in
`BACKENDS`, as a plugin is, so that core imports nothing of the layer above it.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kiro.errors import RunError, UserError

if TYPE_CHECKING:
    from kiro.core.engine import Outcome
    from kiro.core.front import Front
    from kiro.core.looprun import LoopRun
    from kiro.store.statestore import StateStore
    from kiro.store.workspace import Workspace

BACKENDS = {"local": "kiro.core.backends:LocalBackend", "temporal": "kiro.temporal.commands:TemporalBackend"}
"""`backend.kind` -> the class that runs its loops ("module:Class", imported when first chosen)."""

TEMPORAL_MISSING = ("backend: temporal needs the temporal extra: pip install 'kiro-loop[temporal]' (in a checkout of "
                    "kiro: pip install -e '.[temporal]')")
STARTED_WITHIN = 30.0  # seconds a process started in the background has to say it is up


class Backend(Protocol):
    """What a front end (the CLI, `kiro serve`, `kiro loop watch`) needs of the place loops run."""

    name: str
    detaches_itself: bool  # True: a loop runs without a process of ours (a workflow); False: `--detach` starts one
    unbuilt: frozenset[str]  # options and commands this backend does not offer yet, as the person types them

    def preflight(self, ws: Workspace, config: Path | None) -> None:
        """Before anything is written: what the backend needs is there (a server, a git commit)."""

    def run(self, runs: list[LoopRun], *, detach: bool, front: Front) -> list[Outcome]:
        """Run loops prepared by `kiro.core.runner` (lock held), to their outcomes (none when `detach`)."""

    def force_stop(self, store: StateStore, task_id: str, front: Front) -> None:
        """`kiro loop stop --force`: end the running loop's step now (its state saved)."""


def backend_for(ws: Workspace, config: Path | None) -> Backend:
    """The backend that runs this workspace's loops (config `backend.kind`)."""
    kind = "temporal" if uses_temporal(ws, config) else "local"
    module, _, name = BACKENDS[kind].partition(":")
    cls: Any = getattr(importlib.import_module(module), name)
    backend: Backend = cls()
    return backend


def uses_temporal(ws: Workspace, config: Path | None) -> bool:
    """SPEC §12: does this workspace run its loops on the temporal backend? The config is resolved only when
    the word appears in the config file or a KIRO_BACKEND* variable is set, so the local path pays nothing."""
    path = config or ws.root / "config" / "autonomous_loop.yaml"
    from kiro.fs import safeio

    try:  # the one safe reader: a FIFO, device or symlink loop in the config's place must not hang here
        text = safeio.read_bytes(path, limit=safeio.CONFIG_MAX_BYTES).decode("utf-8", "replace")
    except (OSError, safeio.UnreadableFile):
        text = ""  # the local path reads the config again and names what is wrong with it
    if "temporal" not in text and not any(k.startswith("KIRO_BACKEND") for k in os.environ):
        return False
    from kiro.store.settings import settings_for

    if settings_for(ws, config_file=config).config.backend.kind != "temporal":
        return False
    try:
        import temporalio  # noqa: F401
    except ImportError:
        raise UserError(TEMPORAL_MISSING) from None
    return True


def start_in_background(argv: list[str], *, out: Path, cwd: Path, ready: Callable[[int], bool] | None = None,
                        keep_fd: int | None = None) -> int | None:
    """Run `python -m kiro ARGV` in its own session (closing the terminal does not end it), its output
    appended to `out`, and wait until `ready(pid)` says it is up: None then; its exit code when it ended
    first. No `ready`: None once it is started (a loop handed its lock as `keep_fd`, the descriptor it
    inherits: kiro.core.api.in_background). The process never sees the token of `kiro serve`. RunError
    when it is neither up nor ended within STARTED_WITHIN seconds."""
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "KIRO_SERVE_TOKEN"}
    env["PYTHONUNBUFFERED"] = "1"
    with open(out, "ab") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "kiro", *argv], stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=cwd, env=env,
                                pass_fds=() if keep_fd is None else (keep_fd,))
    # waited for when it ends, by a thread of its own: a process that lives on (`kiro serve`) leaves no zombie
    threading.Thread(target=proc.wait, name=f"kiro {argv[0]} in the background", daemon=True).start()
    if ready is None:
        return None
    deadline = time.monotonic() + STARTED_WITHIN
    while time.monotonic() < deadline:
        code = proc.poll()
        if ready(proc.pid):
            return None
        if code is not None:
            return code
        time.sleep(0.05)
    raise RunError(f"`kiro {' '.join(argv[:2])}` in the background did not start within {STARTED_WITHIN:.0f} s; "
                   f"see {out}")


def wait_unlocked(store: StateStore, task_id: str, seconds: float) -> bool:
    """Wait until no process holds the loop's lock; False when one still does after `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not store.is_locked(task_id):
            return True
        time.sleep(0.05)
    return False


class LocalBackend:
    """Loops run in this process (`kiro loop start`), or in a process of their own started in the
    background (`--detach`, by `kiro.core.api`)."""

    name = "local"
    detaches_itself = False
    unbuilt: frozenset[str] = frozenset()

    def preflight(self, ws: Workspace, config: Path | None) -> None:
        return None

    def run(self, runs: list[LoopRun], *, detach: bool, front: Front) -> list[Outcome]:
        import asyncio

        from kiro.core.runner import run_loops

        assert not detach, "a local loop in the background is a process of its own (kiro.core.api)"
        return asyncio.run(run_loops(runs, front.listeners(len(runs))))

    def force_stop(self, store: StateStore, task_id: str, front: Front) -> None:
        """SIGTERM (the loop saves its state and stops), SIGKILL after 10 s; a killed loop's `[-]` box is
        taken back here, since it could not do it itself. Only a process that holds the loop's lock is
        signalled: the pid the lock table names took it, and may have ended (a `kill -9`) while a process it
        started still holds a copy, its pid free for any other process to get (`loop_processes`)."""
        pid = store.holder_pid(task_id)
        if pid is None:
            front.warning(f"loop {task_id}: no process id recorded; cannot signal it")
            return
        kiro, others = loop_processes(store, task_id, pid)
        if not kiro and not others:  # none this process may look at: a --detach loop's own, before it names itself
            pid, kiro = _named_holder(store, task_id, pid)
        if kiro:
            targets = [pid]
            siblings = _loops_of(store, pid, but=task_id)
            if siblings:  # `kiro loop start --task A --task B`: one process, and a signal reaches all its loops
                front.warning(f"process {pid} also runs loop {', '.join(siblings)}: those stop too (state saved; "
                              f"`kiro loop resume --task-id ID` continues each)")
        elif others:
            names = ", ".join(map(str, others))
            front.warning(f"loop {task_id}: process {pid}, which took its lock, has ended; process {names}, which "
                          f"it started, holds the lock: ending it")
            targets = others
        else:
            if store.is_locked(task_id):
                lock = store.ws.relative_name(store.ws.lock_file(task_id))
                raise RunError(f"loop {task_id}: process {pid}, which took its lock, has ended, and its lock file "
                               f"{lock} is held by a process kiro may not look at (`fuser -v {lock}` names it); the "
                               f"loop is stopped when that process ends")
            _take_back_box(store, task_id)
            front.line(f"loop {task_id}: its process {pid} had already ended; nothing is left to stop; resume "
                       f"picks up from the last saved state")
            return
        for target in targets:
            with contextlib.suppress(ProcessLookupError):
                os.kill(target, signal.SIGTERM)
        if wait_unlocked(store, task_id, 10):
            if kiro:
                front.line(f"loop {task_id} (process {pid}) stopped; state saved")
            else:
                _take_back_box(store, task_id)
                front.line(f"loop {task_id}: its processes ended; resume picks up from the last saved state")
            return
        holding = _holding(store, task_id)  # those that hold it now: the pid of one that ended is free
        for target in holding:
            with contextlib.suppress(ProcessLookupError):
                os.kill(target, signal.SIGKILL)
        if not wait_unlocked(store, task_id, 5):
            who = f"process {', '.join(map(str, holding))}" if holding else "a process kiro may not look at"
            raise RunError(f"loop {task_id}: {who} still holds its lock after SIGKILL")
        _take_back_box(store, task_id)
        killed = ", ".join(map(str, holding or targets))
        front.warning(f"loop {task_id} (process {killed}) did not stop within 10 s and was killed; resume picks up "
                      f"from the last saved state")


ENDED_HOLDER_WAIT = 2.0  # seconds: the lock of a loop whose process has ended is let go by then (its steps reaped)


def loop_processes(store: StateStore, task_id: str, pid: int) -> tuple[bool, list[int]]:
    """Who holds the loop's lock, whose process the kernel's lock table names as `pid`: (True, []) when that
    process is there and holds it (or this process cannot tell: not Linux, or its descriptors may not be
    read); else (False, the processes that hold the lock now, children of the ended `pid`)."""
    from kiro.fs import locks

    if _still_holds(store, task_id, pid):
        return True, []
    return False, [p for p in locks.holders(store.ws.lock_file(task_id)) or [] if p != pid]


def _loops_of(store: StateStore, pid: int, *, but: str) -> list[str]:
    """The other loops whose lock process `pid` holds (the loops it runs), by the kernel's lock table."""
    from kiro.fs import locks

    prefix, suffix = "autonomous_loop_", ".lock"
    try:
        names = [n for n in os.listdir(store.ws.state_dir) if n.startswith(prefix) and n.endswith(suffix)]
    except OSError:
        return []
    found = [n[len(prefix):-len(suffix)] for n in names]
    return sorted(t for t in found if t != but and locks.holder_pid(store.ws.lock_file(t)) == pid)


def _named_holder(store: StateStore, task_id: str, ended: int) -> tuple[int, bool]:
    """The loop's lock, taken by process `ended`, which has ended, is held by no process this one may look at:
    wait up to ENDED_HOLDER_WAIT for it to be let go, or for the lock table to name a live holder (a `--detach`
    loop's process takes the lock it inherited over in its first second). (its pid, True) when one is named."""
    deadline = time.monotonic() + ENDED_HOLDER_WAIT
    while store.is_locked(task_id):
        now = store.holder_pid(task_id)
        if now is not None and now != ended and _still_holds(store, task_id, now):
            return now, True
        if time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    return ended, False


def _holding(store: StateStore, task_id: str) -> list[int]:
    """The processes that hold the loop's lock now (`loop_processes`): none once it is let go."""
    pid = store.holder_pid(task_id)
    if pid is None:
        return []
    kiro, others = loop_processes(store, task_id, pid)
    return [pid] if kiro else others


def _still_holds(store: StateStore, task_id: str, pid: int) -> bool:
    """Process `pid` is there and holds the loop's lock (true when this process cannot tell: `loop_processes`)."""
    from kiro.fs import locks

    if not locks.process_exists(pid):
        return False
    if not locks.PROC_LOCKS.exists():
        return True
    try:
        st = os.stat(store.ws.lock_file(task_id))
    except OSError:
        return False  # let go, and its file removed
    return locks.holds(pid, st) is not False


def _take_back_box(store: StateStore, task_id: str) -> None:
    """The loop's process was killed, so its `[-]` box stays in the task file: take it back to `[ ]`, under the
    loop's lock (unless a start or resume took the lock first: that one does it)."""
    from kiro.core.resolved import release_in_progress_box
    from kiro.errors import Conflict

    try:
        lock = store.acquire(task_id)
    except Conflict:
        return
    try:
        state = store.load(task_id).state
        if state.current_step is not None:
            release_in_progress_box(store.ws, store.ws.absolute(state.task_path), task_id,
                                    state.current_step.step_id)
    finally:
        store.release(task_id, lock)
