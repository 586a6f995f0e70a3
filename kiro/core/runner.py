"""Preparing loops to run: resolve the config, find or create the state, take the lock, choose the
executor. The CLI calls these; the engine runs what they return.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiro import executors, timeutil
from kiro.core import heap, resolved
from kiro.core.looprun import LoopRun, names_schedule
from kiro.errors import Conflict, ExecutorError, KiroError, LockHeld, TaskNotFound, UserError, contained
from kiro.fs import diskfull, safeio
from kiro.fs.atomic import Staged
from kiro.fs.locks import Flock
from kiro.status import Status, StopReason
from kiro.store import approval, cleanup, kirospec, taskmap, tasks
from kiro.store.config import FRONTMATTER_KEYS, Config
from kiro.store.redact import Redactor
from kiro.store.settings import Located, settings_for
from kiro.store.state import LoopState, effective_status
from kiro.store.statestore import StateStore
from kiro.store.unbuilt import not_built_warnings
from kiro.store.workspace import START_GUARD, Workspace, check_task_id, is_task_id, locate_task

# What only running a loop needs (the engine, its features and listeners, git) is imported where a loop runs:
# `kiro loop start --detach` prepares its loop with these functions and runs none (tests/test_detach.py).
if TYPE_CHECKING:
    from kiro.core.engine import Outcome
    from kiro.core.hooks import Feature
    from kiro.executors.base import Executor
    from kiro.store.events import Listener

__all__ = ["Located", "settings_for", "prepare_start", "prepare_resume", "run_loops", "LoopIndex", "StartBatch"]


class AlreadyFinished(Conflict):
    """`resume` of a loop that has nothing left to do: not an error for a script (exit 0)."""

    exit_code = 0


def nothing_to_start(task: tasks.TaskFile, real: str, include_optional: bool) -> bool:
    """A task file without a loop that a watch leaves alone and `start` refuses (saying so, exit 0): a finished
    file (a Kiro spec's, which stays put: every step it would run is done, so a completed spec is not started
    again) that no schedule runs again."""
    return bool(task.is_complete(include_optional) and task.counts().total and (
        kirospec.in_spec_folder(real) or all(s.done for s in task.steps)) and task.frontmatter.get("schedule") is None)


def _check_schedule(task: tasks.TaskFile, label: str) -> None:
    """A bad `schedule:` is one clear line, before anything starts."""
    if names_schedule(task):
        from kiro.core import schedule

        schedule.of_task(task, label)


def new_task_id(store: StateStore) -> str:
    """`task_YYYYMMDD_HHMMSS`, with a suffix when that id is taken (SPEC §4)."""
    base = "task_" + timeutil.now().strftime("%Y%m%d_%H%M%S")
    candidate, n = base, 1
    while store.exists(candidate) or store.ws.lock_file(candidate).exists():
        n += 1
        candidate = f"{base}_{n}"
    return candidate


def unused_command_warning(cfg: Config, executor_name: str) -> list[str]:
    """A configured agent command line that the chosen executor will not run is said, not ignored."""
    if executor_name == "command" or not (cfg.executor_command or cfg.agent):
        return []
    what = f"executor_command {cfg.executor_command!r}" if cfg.executor_command else f"agent {cfg.agent!r}"
    return [f"{what} is configured but this loop uses the {executor_name} executor (executor: {executor_name}); "
            f"it will not run"]


def choose_executor(cfg: Config, task: tasks.TaskFile, recorded: str | None = None) -> str:
    """SPEC §5: an explicit choice (flag, frontmatter, env, config), else the one recorded when the
    loop started, else command when `executor_command` or `agent` is set (an OPENAI_API_KEY that an
    agent CLI needs never switches kiro to its own openai executor), else openai when an endpoint
    is configured, else shell when the current step has a command block, else an error naming the
    ways to configure one."""
    if cfg.executor:
        return cfg.executor
    if cfg.executor_command or cfg.agent:
        return "command"
    if recorded:
        return recorded
    if os.environ.get(cfg.llm.api_key_env) or cfg.llm.base_url or os.environ.get("OPENAI_BASE_URL"):
        return "openai"
    step = task.current_step(cfg.include_optional)
    if step is None or step.command:
        return "shell"
    raise ExecutorError(
        f"no executor for {task.path}: step {step.id} has no ```sh block, and no model endpoint is configured; "
        f"choose one with --executor shell|command|openai or --agent claude|codex|..., `executor:` / `agent:` in "
        f"the task's frontmatter or config/autonomous_loop.yaml, or set {cfg.llm.api_key_env} / llm.base_url "
        f"for the openai executor"
    )


@contextlib.contextmanager
def _workspace_guard(store: StateStore) -> Any:
    """Held while a loop is created, so two `start`s of one task cannot both create a loop."""
    path = store.ws.state_dir / START_GUARD
    path.parent.mkdir(parents=True, exist_ok=True)
    store.probe_lock_file(path)
    lock = Flock(path)
    lock.acquire(30)
    with lock:
        yield


class LoopIndex:
    """The workspace's unfinished loops, kept current cheaply: `refresh()` stats every state file
    but reads only those that changed since the last look. For callers that look up many task
    files (several `--task`, the watch supervisor) without reading every state file each time."""

    FULL_EVERY = 0.5  # seconds: look at every state file at least this often, whatever the folder says

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self._seen: dict[Path, int] = {}
        self._loops: dict[Path, LoopState] = {}
        self._folder_stamp: tuple[int, int] | None = None
        self._full_at = -math.inf
        self._by_task: dict[str, LoopState] | None = None  # task_path -> unfinished loop (built on demand)
        self._by_id: dict[str, LoopState] | None = None
        self.refresh()

    def _stamp(self) -> tuple[int, int] | None:
        try:
            folder = self.store.ws.state_dir.stat().st_mtime_ns
        except OSError:
            return None
        try:
            starts = os.stat(_generation_file(self.store)).st_size
        except OSError:
            starts = -1
        return folder, starts

    def refresh(self) -> None:
        """Cheap when nothing changed. A loop is created only under the start guard, and every
        creation (in any process) adds a byte to `.state/.starts`; a state file replaced or removed
        moves the folder's mtime. When neither moved, nothing is read; every file is looked at
        anyway at least every FULL_EVERY seconds (a change within the folder clock's tick)."""
        stamp = self._stamp()
        now = time.monotonic()
        if stamp is not None and stamp == self._folder_stamp and now - self._full_at < self.FULL_EVERY:
            return
        self._folder_stamp, self._full_at = stamp, now
        present: set[Path] = set()
        folder = self.store.ws.state_dir
        for p in folder.glob("autonomous_loop_*.json") if folder.is_dir() else []:
            present.add(p)
            try:
                mtime = p.stat().st_mtime_ns
            except OSError:
                continue
            if self._seen.get(p) == mtime:
                continue
            self._seen[p] = mtime
            st = self.store.try_read(p)
            if st is None:  # corrupt: what its newest good backup says, if anything
                tid = p.name[len("autonomous_loop_"):-len(".json")]
                try:
                    st = self.store.load(tid).state
                except KiroError:
                    st = None
            if st is None:
                self._loops.pop(p, None)
            else:
                self._loops[p] = st
            self._by_task = self._by_id = None
        for gone in set(self._loops) - present:
            self._loops.pop(gone, None)
            self._seen.pop(gone, None)
            self._by_task = self._by_id = None

    def note(self, state: LoopState, *, written: bool = True) -> None:
        """A loop this process just created (under the start guard): known without reading it back,
        and the folder's change that its files made is not a reason for the next look. `written=False`:
        its files are still being written (a `StartBatch`); the batch holds the guard until they are,
        and the next look after it reads the state file (its mtime is not known yet)."""
        path = self.store.path(state.task_id)
        self._loops[path] = state
        if self._by_task is not None and self._by_id is not None and state.status != Status.COMPLETED:
            self._by_task[state.task_path] = state
            self._by_id[state.task_id] = state
        if written:
            with contextlib.suppress(OSError):
                self._seen[path] = path.stat().st_mtime_ns
            self._folder_stamp = self._stamp()

    def unfinished(self) -> list[LoopState]:
        return [st for st in self._loops.values() if st.status != Status.COMPLETED]

    def lookup(self, task_path: str, task_id: str | None) -> LoopState | None:
        """The unfinished loop of this task file (or with this task id): one dict look-up, not a scan
        of every loop (a thousand loops started together)."""
        if self._by_task is None or self._by_id is None:
            by_task: dict[str, LoopState] = {}
            by_id: dict[str, LoopState] = {}
            for st in self.unfinished():
                by_task.setdefault(st.task_path, st)
                by_id.setdefault(st.task_id, st)
            self._by_task, self._by_id = by_task, by_id
        found = self._by_task.get(task_path)
        if found is None and task_id:
            found = self._by_id.get(task_id)
        if found is not None and found.status == Status.COMPLETED:  # finished since (a loop run here)
            self._by_task = self._by_id = None
            return self.lookup(task_path, task_id)
        return found


class StartBatch:
    """Loops started together (`kiro loop start --task a --task b ...`): the start guard is taken
    once and held until every new loop's state file and task file record are on disk, and one look at
    the state files serves the whole batch (no other process creates a loop while the guard is
    held; the batch's own loops are in the index). The loops' first writes are made once every loop
    is prepared, staged (kiro.fs.atomic.Staged): written unsynced, made durable by one flush of the file
    system, renamed into place, the names made durable by one more. Use as a context manager:
    leaving it makes the writes (raising the first that failed) and lets go of the guard."""

    def __init__(self) -> None:
        self._guards: dict[Path, Flock] = {}
        self._looked: set[Path] = set()
        self._jobs: list[Callable[[Staged], object]] = []
        self._settings: dict[str, tuple[Config, Workspace, Redactor]] = {}
        self._swept: set[Path] = set()
        self._started: dict[Path, tuple[StateStore, int]] = {}  # state folder -> loops created there
        self._task_files: dict[Path, list[tuple[str, Path]]] = {}  # state folder -> its new loops' task files
        self._heap = contextlib.ExitStack()

    def settings(self, ws0: Workspace, *, config_file: Path | None, task: tasks.TaskFile,
                 overrides: Mapping[str, Any] | None) -> Located:
        """`settings_for`, resolved once for the loops of the batch that share a workspace, config
        file, frontmatter and flags (the config is read-only once resolved; each loop still gets its
        own StateStore); the checks of the folders the config names are made once with it. Errors
        are not kept: a loop whose settings are bad raises as it would alone."""
        try:
            own = {k: v for k, v in task.frontmatter.items() if k in FRONTMATTER_KEYS}  # what the config reads
            key = json.dumps([str(ws0.root), str(config_file), own, overrides or {}], sort_keys=True)
        except (TypeError, ValueError):
            key = None
        cached = self._settings.get(key) if key is not None else None
        if cached is None:
            loc = settings_for(ws0, config_file=config_file, task=task, overrides=overrides)
            _check_project_dir(loc.ws, loc.config)
            loc.ws.ensure_folders()
            _git_preflight(loc.config, loc.ws.root / loc.config.project_dir)
            cached = (loc.config, loc.ws, loc.store.redact)
            if key is not None:
                self._settings[key] = cached
            return loc
        cfg, ws, redact = cached
        return Located(ws, StateStore(ws, redact), cfg)

    def sweep(self, ws: Workspace, task_path: Path) -> None:
        """`cleanup.remove_stale_temp_files`: the workspace's folders once per batch, each task's folder once."""
        whole = ws.state_dir not in self._swept
        self._swept.add(ws.state_dir)
        if whole or task_path.parent not in self._swept:
            self._swept.add(task_path.parent)
            cleanup.remove_stale_temp_files(ws, task_path, workspace_folders=whole)

    @contextlib.contextmanager
    def guard(self, store: StateStore) -> Iterator[None]:
        path = store.ws.state_dir / START_GUARD
        if path not in self._guards:
            path.parent.mkdir(parents=True, exist_ok=True)
            store.probe_lock_file(path)
            lock = Flock(path)
            lock.acquire(30)
            self._guards[path] = lock
        yield

    def count_start(self, store: StateStore) -> None:
        """A loop created: `.state/.starts` gets its byte when the batch's writes are done, one write
        for all of the folder's loops, before the guard is let go."""
        folder = store.ws.state_dir
        self._started[folder] = (store, self._started.get(folder, (store, 0))[1] + 1)

    def remember(self, state_dir: Path, task_id: str, task_path: Path) -> None:
        """A new loop's task file, recorded in kiro's state (kiro.store.taskmap) with one write per folder."""
        self._task_files.setdefault(state_dir, []).append((task_id, task_path))

    def first_look(self, store: StateStore) -> bool:
        """True once per state folder: the look at its state files under the guard."""
        folder = store.ws.state_dir
        if folder in self._looked:
            return False
        self._looked.add(folder)
        return True

    def write(self, job: Callable[[Staged], object]) -> None:
        """Queued now, made when the batch ends, after every loop is prepared (made side by side with
        the preparing, the writes took turns with it at the interpreter lock and both went slower)."""
        self._jobs.append(job)

    def finish(self) -> None:
        staged = Staged()
        try:
            jobs, self._jobs = self._jobs, []
            for job in jobs:
                job(staged)
            task_files, self._task_files = self._task_files, {}
            for state_dir, loops in task_files.items():
                taskmap.remember_all(state_dir, loops, staged)
            staged.commit()
        finally:
            staged.discard()  # what a failed job or commit left unplaced
            started, self._started = self._started, {}
            try:
                for store, n in started.values():
                    _count_start(store, n)
            finally:
                for lock in self._guards.values():
                    lock.release()
                self._guards.clear()
                self._heap.close()

    def __enter__(self) -> StartBatch:
        self._heap.enter_context(heap.long_lived())  # many loops' objects made at once (kiro.core.heap)
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None:  # a start of the batch was refused: the batch creates no loop
            self._jobs, self._task_files, self._started = [], {}, {}
        self.finish()


def _generation_file(store: StateStore) -> Path:
    return store.ws.state_dir / ".starts"


def _count_start(store: StateStore, n: int = 1) -> None:
    """One byte per loop created, so every `LoopIndex` (in any process) learns that it must look."""
    fd = os.open(_generation_file(store), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"." * n)
    finally:
        os.close(fd)


def find_loop_for_task(store: StateStore, task_path: Path, task_id_hint: str | None,
                       index: LoopIndex | None = None, *, refresh: bool = True,
                       rel: str | None = None) -> LoopState | None:
    """The unfinished loop, if any, that already works on this task file. `refresh=False`: the
    caller refreshed `index` itself, once for many look-ups (the watch supervisor's scan). `rel`:
    the caller's `store.ws.relative(task_path)` (a realpath walk), when it has it."""
    if rel is None:
        rel = store.ws.relative(task_path)
    if index is None:
        index = LoopIndex(store)
    elif refresh:
        index.refresh()
    if task_id_hint is not None and not is_task_id(task_id_hint):
        task_id_hint = None  # not an id kiro made (prepare_start refuses it): it names no loop
    found = index.lookup(rel, task_id_hint)
    if found is not None:
        return found
    if task_id_hint and store.path(task_id_hint).exists():
        store.load(task_id_hint)  # the task's own loop has a state nobody can read: say so, start nothing
    return None


def kept_overrides(overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """The command-line settings a loop keeps for its resumes (executor, agent, model): those given.
    The loop's limits are fields of its state already."""
    return {k: v for k, v in (overrides or {}).items() if v is not None and not k.startswith("autonomous_loop.")}


def _check_kiro_task_id(ws: Workspace, path: Path, task: tasks.TaskFile) -> None:
    """The `kiro_task_id` a task file names is a task id (it names the loop's files), or one clear line
    naming the file and line: before anything is made."""
    hint = task.frontmatter.get("kiro_task_id")
    if hint is None:
        return
    try:
        check_task_id(hint)
    except UserError as exc:
        line = task.frontmatter_lines.get("kiro_task_id", 2)
        raise UserError(f"{ws.relative_name(path)}:{line}: frontmatter key 'kiro_task_id': {exc}; delete that "
                        f"line (kiro keeps the loop's id in its own state)") from None


def task_id_hint(ws: Workspace, path: Path, task: tasks.TaskFile) -> str | None:
    """The loop a task file belongs to: the `kiro_task_id` of its frontmatter, when a person wrote one there,
    else the one kiro's state records for it (kiro.store.taskmap)."""
    hint = task.frontmatter.get("kiro_task_id")
    if isinstance(hint, str):
        return hint
    return taskmap.task_id_for(ws.state_dir, path)


def _id_in_file(task: tasks.TaskFile) -> bool:
    """The person asked for the loop's id in the task file: its frontmatter has a `kiro_task_id` line (even an
    empty one); kiro keeps it current. Otherwise kiro writes nothing into the file but box characters."""
    return "kiro_task_id" in task.frontmatter


def _remember_task_id(ws: Workspace, path: Path, task: tasks.TaskFile, tid: str) -> None:
    """The loop's id, recorded in kiro's state, and in the file's frontmatter too when the person asked for it."""
    if _id_in_file(task):
        tasks.set_frontmatter_key(path, "kiro_task_id", tid, expected=task)
    taskmap.remember(ws.state_dir, tid, path)


def _keep_out(ws: Workspace, warnings: list[str]) -> None:
    """kiro's folders stay out of the person's commits (kiro.git.ignore), and the person is told so."""
    from kiro.git import ignore

    said = ignore.keep_out(ws)
    if said:
        warnings.append(said)


def check_new_task_id(store: StateStore, task_id: str) -> str:
    """A new loop's `--task-id`: a plain name (`check_task_id`) that holds no secret kiro knows of. Every file
    of the loop holds its id, cut like any secret: its state would name another id, and be unreadable."""
    tid = check_task_id(task_id)
    if store.redact.text(tid) != tid:
        raise UserError(f"--task-id {store.redact.text(tid)!r} holds a secret kiro knows of (an API key, a "
                        f"token); every file of the loop names its id: choose another")
    return tid


def _git_preflight(cfg: Config, project_dir: Path) -> None:
    """kiro.git.checkpoints.preflight, when the config asks for git: a loop without it imports no kiro.git."""
    if cfg.git_demanded:
        from kiro.git import checkpoints

        checkpoints.preflight(cfg, project_dir)


def _standard_features() -> list[Feature]:
    """The features a prepared loop runs with (kiro.core.features), made where it runs (kiro.core.looprun)."""
    from kiro.core import features

    return features.standard()


def _check_sandbox(cfg: Config) -> None:
    """`sandbox: bwrap` asked for where bwrap cannot box a step: one line and exit 1, before anything is
    made or any step runs (never a silent unboxed run)."""
    from kiro.processes import sandbox

    sandbox.status_line(cfg.sandbox)


def _sandbox_notes(cfg: Config, ws: Workspace, task_path: Path, executor: Executor,
                   warnings: list[str]) -> Callable[[], list[str]]:
    """Where bwrap is missing, a warning saying so, now; else what makes the line that names the box steps run
    in, when it is first shown (`LoopRun.notes`): where the loop runs, not in a `--detach` start's command,
    which shows no note."""
    from kiro.processes import sandbox

    unboxed = sandbox.status_line(cfg.sandbox)
    if unboxed is not None:
        warnings.append(unboxed)
        return list

    def box_line() -> list[str]:
        from kiro.executors.shell import loop_box

        preset = getattr(executor, "preset", None)  # an agent CLI's: its own files and its model endpoint
        box = loop_box(cfg, ws, ws.root / cfg.project_dir, task_path, os.environ,
                       home_paths=preset.home_paths(os.environ) if preset is not None else (),
                       read_paths=preset.read_paths(os.environ) if preset is not None else (),
                       ports=preset.endpoints(os.environ) if preset is not None else ())
        return [] if box is None else [f"sandbox: bwrap ({box.describe()})"]

    return box_line


def prepare_start(ws0: Workspace, task_arg: str, *, task_id: str | None = None, config_file: Path | None = None,
                  overrides: Mapping[str, Any] | None = None, executor: Executor | None = None,
                  index: LoopIndex | None = None, batch: StartBatch | None = None, fresh: bool = False) -> LoopRun:
    """Create a loop for a task file and take its lock. `executor` injects a ready executor
    (embedding kiro, tests); otherwise one is chosen as SPEC §5 says. With `batch` (and an
    `index`), the loop is one of several started together; its files are on disk when the
    batch ends. `fresh`: an unfinished loop of the task file that no process runs is set aside
    (`set_aside`) instead of refusing the start; a loop that did the one step `--step` asked for is
    set aside without it."""
    task_path = ws0.resolve_task(task_arg)
    approval.check_task_file(ws0, task_path)  # SPEC §15: a task file a step wrote waits for a person
    task = tasks.load(task_path)
    _check_kiro_task_id(ws0, task_path, task)
    if batch is not None:
        loc = batch.settings(ws0, config_file=config_file, task=task, overrides=overrides)
        ws, store, cfg = loc.ws, loc.store, loc.config
    else:
        loc = settings_for(ws0, config_file=config_file, task=task, overrides=overrides)
        ws, store, cfg = loc.ws, loc.store, loc.config
        _check_project_dir(ws, cfg)
        _git_preflight(cfg, ws.root / cfg.project_dir)
    rel = ws.relative_name(task_path)  # resolve_task walked it (a real path): the loop's three uses need no walk
    _check_sandbox(cfg)
    _check_schedule(task, rel)
    warnings = _task_warnings(task, ws) + not_built_warnings(cfg, task, ws)
    chosen = choose_executor(cfg, task) if executor is None else executor.name  # refused before anything is made
    first = not _generation_file(store).exists()  # no loop made here yet (a worker or watch may have made .state/)
    with _workspace_guard(store) if batch is None else batch.guard(store):
        hint = task_id_hint(ws, task_path, task)
        existing = find_loop_for_task(store, task_path, hint, index,
                                      refresh=batch is None or batch.first_look(store), rel=rel)
        _refuse_existing(store, existing, rel, fresh=fresh)
        if existing is None and nothing_to_start(task, str(task_path), cfg.include_optional):
            raise AlreadyFinished(f"every step of {rel} is checked already: nothing to start, no loop made "
                                  f"(uncheck a box or add a step to run it again)")
        if task_id:
            tid = _refuse_taken_id(store, task_id)
        else:
            tid = new_task_id(store)
        _check_logs(ws, tid)
        if executor is None:
            warnings += unused_command_warning(cfg, chosen)
            executor = executors.create(chosen, cfg, ws, tid)
        executor_name = executor.name
        if batch is None:
            ws.ensure_folders()  # once nothing refused the start: a refused start creates nothing
            if first:
                _keep_out(ws, warnings)
        elif first:  # once no start of the batch was refused
            batch.write(lambda _staged: _keep_out(ws, warnings))
        room_for_loops(1)
        if existing is not None:  # set aside once nothing else can refuse the start
            warnings += set_aside(store, existing.task_id)
        lock = store.acquire(tid, write_role=batch is None)
        _hold(ws, tid)
        try:
            reserve_bytes = _reserve_bytes(task_path, None)
            if batch is None:
                cleanup.remove_stale_temp_files(ws, task_path)
                diskfull.reserve(ws.state_dir, tid, reserve_bytes)
            else:
                batch.sweep(ws, task_path)
            state = LoopState(
                task_id=tid, task_path=rel, max_iterations=cfg.autonomous_loop.max_iterations,
                failure_threshold=cfg.autonomous_loop.failure_threshold,
                timeout_seconds=cfg.autonomous_loop.timeout_seconds, workspace=str(ws.root),
                executor=executor_name, overrides=kept_overrides(overrides), title=task.title, pid=os.getpid(),
                steps_total=len(task.steps), steps_done=sum(1 for s in task.steps if s.done),
                billing=executor.credential(),
            )

            if batch is None:
                store.save(state)
                _remember_task_id(ws, task_path, task, tid)
                _count_start(store)
            else:  # on disk before the batch lets go of the start guard

                def create(staged: Staged) -> None:
                    diskfull.reserve(ws.state_dir, tid, reserve_bytes)
                    store.set_role(tid, "loop")
                    store.stage_new(state, staged)
                    if _id_in_file(task):
                        tasks.stage_frontmatter_key(task_path, "kiro_task_id", tid, expected=task, staged=staged,
                                                    resolved=True)

                batch.write(create)
                batch.remember(ws.state_dir, tid, task_path)
                batch.count_start(store)
            if index is not None:
                index.note(state, written=batch is None)
        except BaseException:
            _release(store, tid, lock)
            raise
    return LoopRun(ws, store, cfg, state, task_path, executor_name, resumed=False, warnings=warnings,
                   make_notes=_sandbox_notes(cfg, ws, task_path, executor, warnings),
                   release=lambda: _release(store, tid, lock), executor=executor, lock=lock,
                   make_features=_standard_features)


def _refuse_existing(store: StateStore, existing: LoopState | None, rel: str, *, fresh: bool) -> None:
    """A task file has one unfinished loop at a time: a start beside it is refused (a `--fresh` start sets a
    loop no process runs aside; a loop that did the one step `--step` asked for is set aside without it)."""
    if existing is None:
        return
    if store.is_locked(existing.task_id):
        raise LockHeld(existing.task_id, store.holder_pid(existing.task_id))
    eff = effective_status(existing, alive=False)
    if not fresh and existing.stop_reason != StopReason.STEP_DONE:  # `--step` asked for one step, and got it
        raise Conflict(
            f"{rel} already has an unfinished loop {existing.task_id!r} ({eff}); continue it "
            f"with `kiro loop resume --task-id {existing.task_id}`, or start it afresh with "
            f"`kiro loop start --fresh --task {rel}`"
        )


def _refuse_taken_id(store: StateStore, task_id: str) -> str:
    tid = check_new_task_id(store, task_id)
    if store.exists(tid):
        raise Conflict(f"a loop with task id {tid!r} already exists; resume it with "
                       f"`kiro loop resume --task-id {tid}` or choose another --task-id")
    return tid


def set_aside(store: StateStore, task_id: str) -> list[str]:
    """`kiro loop start --fresh`: the task file's unfinished loop, which no process runs, is over: its state
    is recorded `stopped` (`restarted`) and moved to .state/archive/ (every command still finds it there), and
    the requests it left in Needs_Action/ go to Logs/resolved/. The task file is not touched: its checked
    boxes stay checked, and the new loop does what is still open. What happened, as lines for the person."""
    lock = store.acquire(task_id)  # LockHeld when a resume took it meanwhile: nothing is set aside
    try:
        state = store.load(task_id).state
        was = effective_status(state, alive=False)
        state.transition(Status.STOPPED, StopReason.RESTARTED)
        state.stop_reason, state.pid, state.current_step = StopReason.RESTARTED, None, None
        state.finished_at = timeutil.iso()
        archived = store.archive(state)
    finally:
        store.release(task_id, lock)
    ws = store.ws
    return [f"set aside the unfinished loop {task_id!r} ({was}) in {ws.relative(archived)} (`kiro loop status "
            f"--task-id {task_id}` still shows it); the task file's boxes stay as they are: checked steps are "
            f"not done again", *resolved.archive_requests(ws, task_id)]


FILES_PER_LOOP = 8
"""Open files one running loop may hold: its lock, event log, journal and summary, a connection to the
model's server, a step's three pipes (5 measured for an openai loop between steps)."""
FILES_SPARE = 64  # this process's own: the interpreter, the dashboard, a watcher, the server's clients

_held: set[tuple[str, str]] = set()  # (state folder, task id) of the loops this process holds
_held_lock = threading.Lock()


def room_for_loops(more: int) -> None:
    """Make sure this process may open the files of `more` loops beside the ones it holds: the soft
    limit of open files (`ulimit -n`, often 1,024) is raised, up to the hard limit, when they would
    not fit. A limit too low even so is one clear error before anything starts, not "Too many open
    files" from the middle of a run (400 loops under `ulimit -n 1024` ended so)."""
    with _held_lock:
        need = FILES_PER_LOOP * (len(_held) + more) + FILES_SPARE
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < need:
            if hard != resource.RLIM_INFINITY and hard < need:
                raise UserError(
                    f"{len(_held) + more} loops in one process need about {need} open files, and this process may "
                    f"open at most {hard} (its hard limit); raise it (`ulimit -Hn`; LimitNOFILE= for a systemd "
                    f"service) or run fewer loops per process")
            resource.setrlimit(resource.RLIMIT_NOFILE, (need * 2 if hard == resource.RLIM_INFINITY
                                                        else min(hard, need * 2), hard))


def _hold(ws: Workspace, task_id: str) -> None:
    """The loop's lock is this process's until `_release`: its files count in `room_for_loops`."""
    with _held_lock:
        _held.add((str(ws.state_dir), task_id))


def _reserve_bytes(task_path: Path, state_path: Path | None) -> int:
    """Room to check one box, save the state twice and log the stop after the disk filled up."""
    size = 64 * 1024
    for p in (task_path, state_path):
        if p is not None:
            with contextlib.suppress(OSError):
                size += 2 * os.path.getsize(p)
    return size


def _unhold(ws: Workspace, task_id: str) -> None:
    with _held_lock:
        _held.discard((str(ws.state_dir), task_id))


def _release(store: StateStore, task_id: str, lock: Flock) -> None:
    _unhold(store.ws, task_id)
    diskfull.drop(store.ws.state_dir, task_id)
    store.release(task_id, lock)


def _check_project_dir(ws: Workspace, cfg: Config) -> None:
    """Steps run in `project_dir`: a missing one is the person's to fix, not a failed step."""
    path = ws.root / cfg.project_dir
    if not path.is_dir():
        raise UserError(f"project_dir {cfg.project_dir!r} is not a folder ({path}); create it, or correct "
                        f"project_dir in config/autonomous_loop.yaml (or KIRO_PROJECT_DIR)")


def _check_logs(ws: Workspace, task_id: str) -> None:
    """The files a loop appends to are regular files (or absent): found now, not mid-run."""
    for path in (ws.event_log(task_id), ws.transcript_file(task_id)):
        safeio.check_file_or_absent(path, name=ws.relative_name(path), fix="move it away; kiro starts a new one")


def prepare_resume(ws0: Workspace, task_id: str, *, config_file: Path | None = None,
                   overrides: Mapping[str, Any] | None = None, max_iterations: int | None = None,
                   failure_threshold: int | None = None, timeout: float | None = None,
                   reset_failures: bool = False, executor: Executor | None = None,
                   held_lock: Flock | None = None, keep_hooks: bool = False) -> LoopRun:
    """Load a loop's state under its lock and make it ready to continue. `held_lock`: the caller
    (the watch supervisor) already holds the lock and keeps owning it. `keep_hooks`: the temporal
    backend's workspace worker continuing a loop nobody asked to resume (its first run, a retry): stop
    hooks stay, and the engine pauses on them as usual."""
    loc = settings_for(ws0, config_file=config_file, overrides=overrides)
    store = loc.store
    ws = loc.ws
    loaded = store.load(check_task_id(task_id))
    if ws.global_hook_file.exists() and not keep_hooks:
        # It would pause this loop again at once. One command removes it for every loop.
        raise UserError(f"the global stop hook {ws.relative(ws.global_hook_file)} (from `kiro loop stop --all`) "
                        f"pauses every loop; run `kiro loop resume --all` to remove it and continue every paused "
                        f"loop, or delete it and run this command again")
    _check_logs(ws, task_id)
    room_for_loops(1)
    lock = held_lock or store.acquire(task_id)
    _hold(ws, task_id)
    try:
        loaded = store.load(task_id)  # re-read under the lock: the holder may just have finished
        state = loaded.state
        warnings = [loaded.warning] if loaded.warning else []
        if state.status == Status.COMPLETED:
            raise AlreadyFinished(f"loop {task_id!r} is already completed ({state.task_path}); nothing to resume")
        if state.stop_reason == StopReason.RESTARTED:  # its task file has a newer loop: two would work on one file
            raise UserError(f"loop {task_id!r} was set aside by `kiro loop start --fresh` ({state.task_path} has a "
                            f"newer loop); `kiro loop status` lists the loops")
        recorded = ws.absolute(state.task_path)
        where, path = locate_task(ws, recorded, task_id)
        if path is None:
            said = ws.relative_name(store.path(task_id))  # the file that names it: a person may fix it there
            raise TaskNotFound(f"loop {task_id!r}: task file {state.task_path} (as {said} records it) is gone (not in "
                               f"Specs/, Done/ or Needs_Action/); put it back and resume again")
        approval.check_task_file(ws, path, starting=False)
        task = tasks.load(path)
        _check_schedule(task, ws.relative(path))
        state.overrides = {**state.overrides, **kept_overrides(overrides)}  # what resume names wins
        loc = settings_for(ws0, config_file=config_file, task=task, overrides=state.overrides)
        cfg = loc.config
        warnings += not_built_warnings(cfg, task, ws)
        _check_project_dir(ws, cfg)
        _check_sandbox(cfg)
        if executor is None:  # before anything is moved or removed: a bad executor changes nothing
            executor_name = choose_executor(cfg, task, recorded=state.executor)
            warnings += unused_command_warning(cfg, executor_name)
            executor = executors.create(executor_name, cfg, ws, task_id)
        state.billing = _same_billing(state, executor)
        cleanup.remove_stale_temp_files(ws, path)
        diskfull.reserve(ws.state_dir, task_id, _reserve_bytes(path, store.path(task_id)))
        if where == "Needs_Action" or ws.area_of(path) == "Needs_Action":
            back = ws.counterpart(path, "Specs")
            back.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, back)
            warnings.append(f"moved the task back from {ws.relative(path)} to {ws.relative(back)}")
            path = back
        state.task_path = ws.relative(path)
        hook = ws.hook_file(task_id)
        ws.check_hook(hook)
        if os.path.lexists(hook) and not keep_hooks:
            hook.unlink()
            warnings.append(f"removed the stop hook {ws.relative(hook)}")
        answered = resolved.archive_requests(ws, task_id)  # the loop goes on: a note, no warning (a review's end)
        if max_iterations is not None:
            state.max_iterations = max_iterations
        if failure_threshold is not None:
            state.failure_threshold = failure_threshold
        if timeout is not None:
            state.timeout_seconds = timeout
        if reset_failures:
            state.consecutive_failures = 0
            for rec in state.steps.values():
                rec.attempts = 0
                rec.next_retry_at = None
        if state.iteration >= state.max_iterations:
            warnings.append(f"iteration {state.iteration} has reached max_iterations {state.max_iterations}; "
                            f"pass --max-iterations N to raise the cap")
        if state.consecutive_failures >= state.failure_threshold:
            warnings.append(f"{state.consecutive_failures} consecutive failures reach failure_threshold "
                            f"{state.failure_threshold}; pass --reset-failures to try again")
        executor_name = executor.name
        state.pid = os.getpid()
        store.save(state)
        if loaded.archived:
            store.unarchive(task_id)
    except BaseException:
        _unhold(ws, task_id)
        diskfull.drop(ws.state_dir, task_id)
        if held_lock is None:
            store.release(task_id, lock)
        raise
    box_line = _sandbox_notes(cfg, ws, path, executor, warnings)
    return LoopRun(ws, store, cfg, state, path, executor_name, resumed=True, warnings=warnings,
                   make_notes=lambda: [*(f"answered: {a}" for a in answered), *box_line()],
                   release=lambda: _release(store, task_id, lock), executor=executor, lock=lock,
                   make_features=_standard_features)


RESUMED_BY_ALL = (StopReason.STOP_HOOK, StopReason.CHECKPOINT)
"""Why a paused loop is one `kiro loop resume --all` continues: a stop hook (`kiro loop stop`, `--all` or a
hook file), or a review point (`pause_at_checkpoints`, `pause_every`) the person has now seen."""


def paused_by_hooks(store: StateStore) -> list[LoopState]:
    """The loops `kiro loop resume --all` continues: paused by a stop hook or at a review point
    (RESUMED_BY_ALL), not running anywhere. Loops waiting for a person otherwise (task in Needs_Action/,
    a request file), failed or out of iterations are left to `resume --task-id`."""
    out = []
    for _path, st in store.all_states(include_archive=False):
        if st is not None and st.status == Status.PAUSED and st.stop_reason in RESUMED_BY_ALL:
            out.append(st)
    return out


def _same_billing(state: LoopState, executor: Executor) -> str | None:
    """A loop keeps the billing it started with, whoever resumes it (a terminal, `kiro serve` started in
    another shell, `kiro loop watch`): the credential its agent would bill here is the one its state
    records, or the resume is refused, saying why. A resume that names another agent (`--agent`) records
    that agent's credential; a loop from before kiro recorded one gets it now."""
    now = executor.credential()
    was = state.billing
    if was is None or now is None or now == was or was.split(" ", 1)[0] != now.split(" ", 1)[0]:
        return now
    raise Conflict(f"loop {state.task_id!r} started as `{was}`, and resumed here it would run as `{now}`: a loop "
                   f"keeps the billing it started with; resume it where that holds (the same HOME and key "
                   f"variables; agent_env in config/autonomous_loop.yaml), or start it afresh with "
                   f"`kiro loop start --fresh`")


def _task_warnings(task: tasks.TaskFile, ws: Workspace) -> list[str]:
    out = []
    dups = task.duplicates()
    if dups:
        shown = ", ".join(dups[:5]) + (" ..." if len(dups) > 5 else "")
        out.append(f"{ws.relative(task.path) if task.path else 'task'} has duplicate step ids ({shown}): each line "
                   f"is a separate step")
    return out


async def run_loops(runs: list[LoopRun], listeners: list[Listener] | None = None) -> list[Outcome]:
    """Run prepared loops side by side in this process; SIGTERM, SIGINT and SIGHUP stop them all."""
    import asyncio

    from kiro.core.engine import Loop, install_signal_handlers
    from kiro.core.guardrails import SharedLimits
    from kiro.core.listeners import standard as standard_listeners

    loops: list[Loop] = []
    shared = SharedLimits(runs[0].config) if runs else None
    try:
        for r in runs:
            executor = r.executor or executors.create(r.executor_name, r.config, r.ws, r.state.task_id)
            loop = Loop(r, executor, listeners, shared)
            loop.subscribe(*standard_listeners(loop))
            loops.append(loop)
    except BaseException:
        for lp in loops:
            await lp.executor.aclose()
        for r in runs:
            if r.release:
                r.release()
        raise

    async def run_one(lp: Loop) -> Outcome:
        """One loop's run. When it ends, its executor is closed and the loop let go: with a thousand loops in
        one process, the ones that ended (their executors, listeners, queues) are not kept until the last ends."""
        try:
            return await lp.run()
        finally:
            loops.remove(lp)  # a signal then stops the loops still running
            with contained():
                await lp.executor.aclose()

    remove = install_signal_handlers(loops)
    try:
        with heap.long_lived():  # the collector leaves the run's long-lived objects alone (kiro.core.heap)
            heap.settled()  # and what making the loops ready made (kiro.core.api's `heap.preparing`)
            results = await asyncio.gather(*[run_one(lp) for lp in loops], return_exceptions=True)
    finally:
        remove()
        for lp in list(loops):  # a run that did not end (cancelled before it began)
            with contained():
                await lp.executor.aclose()
        from kiro.processes import sandbox

        sandbox.tidy()  # the control folders made for the loops' boxes, kept from step to step
        for r in runs:
            if r.release:
                r.release()
    outcomes: list[Outcome] = []
    for res in results:
        if isinstance(res, BaseException):
            raise res
        outcomes.append(res)
    return outcomes


def combined_exit_code(outcomes: list[Outcome]) -> int:
    """One loop: its code. Several: 0 when all completed, else the first loop's code that is not 0,
    error (1) first."""
    codes = [o.exit_code for o in outcomes]
    if 1 in codes:
        return 1
    return next((c for c in codes if c != 0), 0)
