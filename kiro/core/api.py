"""The core API every front end calls: start, resume, resume-all, stop (and --force), detach, status, tell.

`kiro loop ...` (kiro.cli), `kiro serve` (kiro.serve.control) and the temporal commands call these; none of
them runs another as a subprocess. What a command shows as it runs goes through a `Front` (the CLI's
prints, the server's collects nothing); what it refuses is a `KiroError` carrying one line for a person
(a `Conflict` when the loop's state refuses it, `TaskNotFound` when nothing is named by it), which the CLI
turns into its exit code and the server into a 4xx JSON error. Where the loops run is a `Backend`
(kiro.core.backends: local, temporal).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiro.core import heap
from kiro.core.front import Front
from kiro.errors import Conflict, UserError

if TYPE_CHECKING:
    from kiro.core.looprun import LoopRun
    from kiro.store.messages import Message
    from kiro.store.redact import Redactor
    from kiro.store.statestore import StateStore
    from kiro.store.workspace import Workspace

EXECUTORS = ("shell", "command", "openai")
ENDING_WITHIN = 10.0
"""Seconds `resume` waits for the process of a loop whose saved status says its run ended (paused, stopped,
failed...) to let go of the loop's lock, before it says the loop is held."""


@dataclass(frozen=True)
class Options:
    """The settings `start` and `resume` take from their caller (flags, a dashboard's form)."""

    max_iterations: int | None = None
    failure_threshold: int | None = None
    timeout: float | None = None
    executor: str | None = None
    model: str | None = None
    agent: str | None = None
    sandbox: str | None = None
    parallel: int | None = None

    def overrides(self, *, limits: bool = True) -> dict[str, Any]:
        """As dotted config paths (kiro.store.settings); `limits=False`: resume sets the loop's limits
        on its state, not in its config."""
        return {
            "sandbox": self.sandbox,
            "parallel": self.parallel,
            "autonomous_loop.max_iterations": self.max_iterations if limits else None,
            "autonomous_loop.failure_threshold": self.failure_threshold if limits else None,
            "autonomous_loop.timeout_seconds": self.timeout if limits else None,
            "executor": self.executor,
            "agent": self.agent,
            "llm.model": self.model,
        }

    def check(self) -> None:
        if self.executor is not None and self.executor not in EXECUTORS:
            raise UserError(f"--executor {self.executor!r}: choose shell, command or openai")


@dataclass(eq=False)
class Started:
    """What `start` or `resume` did: the loops' exit code (SPEC §6; 0 for loops that continue in the
    background or under `kiro loop watch`), the loops' task ids, and whether they run in the background."""

    exit_code: int
    task_ids: list[str] = field(default_factory=list)
    detached: bool = False


# -- finding the workspace, its state, a loop ---------------------------------------------------


def workspace(path: Path | None) -> Workspace:
    from kiro.store.workspace import Workspace

    return Workspace.find(path)


def store_of(ws: Workspace, front: Front, *, lenient: bool = True) -> StateStore:
    """The state store, honouring `state_directory` from the config. Read commands still work on a
    broken config (with a warning), so a person can see what their loops are doing."""
    from kiro.errors import ConfigError
    from kiro.store.settings import settings_for

    try:
        store = settings_for(ws).store
    except ConfigError as exc:
        if not lenient:
            raise
        from kiro.store.statestore import StateStore

        front.warning(f"{exc} (using defaults to read the state)")
        store = StateStore(ws)
    front.redact_with(store.redact)  # what the store knows (the serve token) is cut from every line too
    return store


def spec_task(ws: Workspace, name: str) -> str:
    """`--spec NAME`: the task file `.kiro/specs/NAME/tasks.md` of the workspace (or of the current
    folder), or one line listing the specs there are."""
    from kiro.store import kirospec

    try:
        projects = list(dict.fromkeys([ws.root, Path.cwd()]))
    except OSError:  # the current folder was deleted
        projects = [ws.root]
    for project in projects:
        found = kirospec.find_spec(project, name)
        if found is not None:
            return str(found)
    names = next((found for found in map(kirospec.spec_names, projects) if found), [])
    there = f"the specs here: {', '.join(names)}" if names else "there is no .kiro/specs/*/tasks.md here"
    raise UserError(f"no Kiro spec {name!r} (no .kiro/specs/{name}/tasks.md); {there}")


def loop_named(ws: Workspace, store: StateStore, task_id: str | None, task: str | None, spec: str | None = None,
               *, required: bool = True) -> str | None:
    """The loop a command names: by --task-id, --task, --spec (a Kiro spec's task file), or the only one."""
    from kiro.views.loops import resolve_task_id

    if spec is not None:
        if task_id or task:
            raise UserError("--spec names the loop by its Kiro spec; leave out --task-id/--task (or drop --spec)")
        task = spec_task(ws, spec)
    return resolve_task_id(ws, store, task_id, task, required=required)


def status(ws: Workspace, store: StateStore, task_id: str | None, warnings: list[str]) -> Any:
    """One loop's row (`task_id`), or every loop's: what `kiro loop status` and the dashboard show."""
    from kiro.views import loops

    if task_id is None:
        return loops.all_rows(store, warnings)
    loaded = store.load(task_id)
    if loaded.warning:
        warnings.append(loaded.warning)
    return loops.loop_row(store, loaded.state)


# -- start ---------------------------------------------------------------------------------------


@heap.preparing
def start(tasks: Sequence[str], *, specs: Sequence[str] = (), workspace_path: Path | None = None,
          config: Path | None = None, options: Options | None = None, task_id: str | None = None,
          step: str | None = None, fresh: bool = False, detach: bool = False, front: Front | None = None,
          held_lock: int | None = None) -> Started:
    """`kiro loop start`: new loops on task files, run in the foreground to their outcome, or one in the
    background (`detach`). `step`: only that step (kiro.core.features.OneStep). `fresh`: set the task's
    unfinished loop aside first (kiro.core.runner.set_aside). A start that is refused leaves the workspace
    as it found it: what it made of kiro's folders is taken away again
    (kiro.store.workspace.nothing_made_if_refused). `held_lock`: this is the process a `--detach` start
    started (`in_background`); loop `task_id` was made by it, whose lock is this descriptor."""
    from kiro.store.settings import settings_for
    from kiro.store.workspace import nothing_made_if_refused

    front = front or Front()
    ws = workspace(workspace_path)
    if held_lock is not None:
        if tasks or specs or fresh or detach or options not in (None, Options()) or task_id is None:
            raise UserError("--held-lock goes with --task-id and --step only: the loop is made already")
        return _take_over(ws, task_id, held_lock, config=config, resumed=False, step=step, front=front)
    with nothing_made_if_refused(ws.root, lambda: settings_for(ws, config_file=config).ws.state_dir):
        return _start(ws, list(tasks), specs=specs, config=config, options=options or Options(), task_id=task_id,
                      step=step, fresh=fresh, detach=detach, front=front)


def _start(ws: Workspace, task: list[str], *, specs: Sequence[str], config: Path | None, options: Options,
           task_id: str | None, step: str | None, fresh: bool, detach: bool, front: Front) -> Started:
    from kiro.core.backends import backend_for
    from kiro.core.runner import prepare_start
    from kiro.store.workspace import check_task_id

    options.check()
    if task_id:
        check_task_id(task_id)  # before anything is made: with --detach the id names Logs/<id>.out
    task = [*task, *(spec_task(ws, name) for name in specs)]
    if not task:
        raise UserError("name what to run: --task PATH (a task file) or --spec NAME (a Kiro spec in .kiro/specs/)")
    changes = options.overrides()
    if len(task) > 1 and task_id:
        raise UserError("--task-id names one loop; with several --task, each gets its own id")
    one_step = None
    if step is not None:
        if len(task) > 1:
            raise UserError("--step names a step of one task file; give one --task")
        from kiro.core.features import OneStep
        from kiro.store import tasks

        path = ws.resolve_task(task[0])
        one_step = OneStep.for_task(tasks.load(path), step, ws.relative(path))  # before anything is made
    backend = backend_for(ws, config)
    for flag, given in (("--step", step is not None), ("--fresh", fresh)):
        if given and flag in backend.unbuilt:
            raise UserError(f"{flag} is not built for backend: {backend.name} yet")
    local_detach = detach and not backend.detaches_itself  # the loop goes on in a process of its own, from here
    if local_detach and len(task) > 1:
        raise UserError("--detach starts one loop; run it once per task")
    backend.preflight(ws, config)  # the server is reachable, the project is in git: before any state is written
    runs: list[LoopRun] = []
    index = batch = None
    if len(task) > 1:
        from kiro.core.runner import LoopIndex, StartBatch, room_for_loops

        room_for_loops(len(task))  # a limit of open files too low for them all: said before any state is written
        index = LoopIndex(store_of(ws, front, lenient=False))
        batch = StartBatch()  # one start guard, the new loops' files written side by side
    try:
        with batch if batch is not None else nullcontext():
            for t in task:
                runs.append(prepare_start(ws, t, task_id=task_id, config_file=config, overrides=changes,
                                          index=index, batch=batch, fresh=fresh))
    except BaseException:
        _release(runs)
        raise
    if local_detach:
        in_background(runs[0], ["loop", "start", "--task-id", runs[0].state.task_id,
                                *(["--step", step] if step is not None else [])], config=config, front=front)
        return Started(0, [runs[0].state.task_id], detached=True)
    if one_step is not None:
        runs[0].features.append(one_step)
    return _run(backend, runs, detach=detach, front=front)


def _release(runs: list[LoopRun]) -> None:
    for r in runs:
        if r.release:
            r.release()


def _run(backend: Any, runs: list[LoopRun], *, detach: bool, front: Front) -> Started:
    """Prepared loops (lock held): say what the person should know, hand them to the backend, report how
    each ended."""
    from kiro.core.runner import combined_exit_code
    from kiro.store.redact import Redactor

    try:
        for r in runs:  # what a loop knows as secret (its llm.base_url's password, its commands' tokens) is cut
            front.redact_with(Redactor.for_run(r.config))  # from every line shown from here on
        for r in runs:
            for w in r.warnings:
                front.warning(w)
        if backend.name == "local":
            for r in runs:  # which credential an agent CLI bills, in plain sight (agent_env); even with --quiet
                said = r.executor.billing_line() if r.executor is not None else None
                if said:
                    front.line(said)
            for note in dict.fromkeys(n for r in runs for n in r.notes):
                front.note(note)
    except BaseException:
        _release(runs)
        raise
    tids = [r.state.task_id for r in runs]
    outcomes = backend.run(runs, detach=detach, front=front)
    if detach:
        return Started(0, tids, detached=True)
    for o in outcomes:
        front.outcome(o)
    return Started(combined_exit_code(outcomes), tids)


def in_background(run: LoopRun, argv: list[str], *, config: Path | None, front: Front) -> None:
    """`--detach`: the loop `run`, prepared here as in the foreground (its lock held, its state on disk, what
    would refuse it said as this command's error), goes on in a process of its own: `kiro ARGV --held-lock FD`
    in its own session, output to Logs/<id>.out, handed the loop's lock as the descriptor FD it inherits. The
    lock stays held across the hand-over (no second start or resume can take the loop meanwhile), and this
    process does not wait for the other's start. A process that dies before it takes over lets the lock go
    with it: the loop stays `pending` (kiro.core.runner's first save), for `kiro loop resume`."""
    import asyncio

    from kiro.core.backends import start_in_background
    from kiro.store.redact import Redactor
    from kiro.store.workspace import current_folder

    ws, tid, lock = run.ws, run.state.task_id, run.lock
    try:
        front.redact_with(Redactor.for_run(run.config))
        for w in run.warnings:
            front.warning(w)  # said here: the loop's own output goes to Logs/<id>.out
        argv = [*argv, "--held-lock", str(lock.fd), *front.child_flags, "-w", str(ws.root)]
        if config is not None:
            argv += ["--config", str(config.absolute())]
        start_in_background(argv, out=ws.detached_output(tid), cwd=current_folder() or ws.root, keep_fd=lock.fd)
        lock.hand_over()
    finally:
        try:
            if run.executor is not None:
                asyncio.run(run.executor.aclose())
        finally:
            if run.release:
                run.release()  # this process's share of the loop (its disk reserve); the lock, unless handed over


def _take_over(ws0: Workspace, task_id: str, fd: int, *, config: Path | None, resumed: bool, step: str | None,
               front: Front) -> Started:
    """The process `in_background` started: the loop its parent made ready (state on disk, lock handed over
    as the descriptor `fd`) runs here to its outcome, as it would have there. Stop hooks written since are
    kept (a `kiro loop stop` right after the detach pauses it)."""
    from kiro.core.backends import backend_for
    from kiro.core.runner import prepare_resume
    from kiro.fs.locks import Flock, Timeout
    from kiro.store.settings import settings_for
    from kiro.store.workspace import check_task_id

    store = settings_for(ws0, config_file=config).store
    try:
        lock = Flock.handed(store.ws.lock_file(check_task_id(task_id)), fd)
    except (OSError, Timeout):
        raise UserError(f"--held-lock {fd}: no descriptor of loop {task_id!r}'s lock file that holds its lock "
                        f"(`kiro loop start|resume --detach` hands it to the loop it starts)") from None
    store.set_role(task_id, "loop")
    run = prepare_resume(ws0, task_id, config_file=config, held_lock=lock, keep_hooks=True)
    run.resumed = resumed
    if step is not None:
        from kiro.core.features import OneStep

        run.features.append(OneStep(step))
    return _run(backend_for(ws0, config), [run], detach=False, front=front)


# -- resume ---------------------------------------------------------------------------------------


@heap.preparing
def resume(task_id: str | None = None, task: str | None = None, *, spec: str | None = None,
           workspace_path: Path | None = None, config: Path | None = None, options: Options | None = None,
           reset_failures: bool = False, detach: bool = False, front: Front | None = None,
           held_lock: int | None = None) -> Started:
    """`kiro loop resume`: continue one loop from its saved state, in the foreground (its exit code) or in
    the background; a loop `kiro loop watch` keeps continues there (exit 0). `held_lock`: this is the process
    a `--detach` resume started (`in_background`), handed the loop's lock as this descriptor."""
    from kiro.core.backends import backend_for, wait_unlocked
    from kiro.core.runner import prepare_resume
    from kiro.errors import LockHeld

    front = front or Front()
    options = options or Options()
    options.check()
    ws = workspace(workspace_path)
    if held_lock is not None:
        if task or spec or detach or reset_failures or options != Options() or task_id is None:
            raise UserError("--held-lock goes with --task-id only: the loop is made ready already")
        return _take_over(ws, task_id, held_lock, config=config, resumed=True, step=None, front=front)
    store = store_of(ws, front, lenient=False)
    tid = loop_named(ws, store, task_id, task, spec)
    assert tid is not None
    backend = backend_for(ws, config)
    if store.is_locked(tid) and store.holder_role(tid) != "watch" and not store.load(tid).state.status.may_be_alive:
        # its run ended (the status it saved says how) and its process is letting go of the lock: a resume
        # right after the pause is shown (the dashboard's button) waits for that instead of refusing (a loop
        # still `pending` is one a --detach start made, whose process is beginning it: refused at once)
        wait_unlocked(store, tid, ENDING_WITHIN)
    try:
        run = prepare_resume(ws, tid, config_file=config, overrides=options.overrides(limits=False),
                             max_iterations=options.max_iterations, failure_threshold=options.failure_threshold,
                             timeout=options.timeout, reset_failures=reset_failures)
    except LockHeld:
        if store.holder_role(tid) != "watch":
            raise
        return _kept_by_watch(store, tid, front)
    if detach and not backend.detaches_itself:
        in_background(run, ["loop", "resume", "--task-id", tid], config=config, front=front)
        return Started(0, [tid], detached=True)
    return _run(backend, [run], detach=detach, front=front)


def _kept_by_watch(store: StateStore, tid: str, front: Front) -> Started:
    """A loop `kiro loop watch` keeps (paused, at no cost): its hook goes, and it continues there."""
    from kiro.core.supervisor import hand_back_to_watch

    for note in hand_back_to_watch(store, tid):
        front.line(note)
    front.line(f"loop {tid} is kept by `kiro loop watch` (process {store.holder_pid(tid)}); it continues there")
    return Started(0, [tid])


def resumable(store: StateStore) -> Iterator[str]:
    """The loops `resume --all` continues (kiro.core.runner.paused_by_hooks) that no process runs."""
    from kiro.core.runner import paused_by_hooks

    for st in paused_by_hooks(store):
        yield st.task_id


@heap.preparing
def resume_all(*, workspace_path: Path | None = None, config: Path | None = None, options: Options | None = None,
               reset_failures: bool = False, detach: bool = False, front: Front | None = None) -> Started:
    """`kiro loop resume --all`: remove the global hook, then continue every loop a stop hook (or a review
    point) paused, in this process (or each in the background). Loops a `kiro loop watch` keeps continue there."""
    from kiro.core.backends import backend_for
    from kiro.core.runner import prepare_resume, room_for_loops
    from kiro.core.supervisor import hand_back_to_watch

    front = front or Front()
    options = options or Options()
    options.check()
    ws0 = workspace(workspace_path)
    store = store_of(ws0, front, lenient=False)
    ws = store.ws
    if ws.global_hook_file.exists():
        ws.global_hook_file.unlink()
        front.line(f"removed the global stop hook {ws.relative(ws.global_hook_file)}")
    targets: list[str] = []
    for tid in resumable(store):
        if store.is_locked(tid):
            if store.holder_role(tid) == "watch":
                for note in hand_back_to_watch(store, tid):
                    front.line(note)
                front.line(f"loop {tid} is kept by `kiro loop watch`; it continues there")
            continue
        targets.append(tid)
    if not targets:
        front.line("no paused loop to continue")
        return Started(0)
    backend = backend_for(ws0, config)
    local_detach = detach and not backend.detaches_itself  # each goes on in a process of its own
    room_for_loops(1 if local_detach else len(targets))  # too few open files for them all: said before any moves
    runs: list[LoopRun] = []
    try:
        for tid in targets:
            runs.append(prepare_resume(ws0, tid, config_file=config, overrides=options.overrides(limits=False),
                                       max_iterations=options.max_iterations,
                                       failure_threshold=options.failure_threshold, timeout=options.timeout,
                                       reset_failures=reset_failures))
            if local_detach:  # handed over before the next is made ready
                in_background(runs.pop(), ["loop", "resume", "--task-id", tid], config=config, front=front)
    except BaseException:
        _release(runs)
        raise
    if local_detach:
        return Started(0, targets, detached=True)
    return _run(backend, runs, detach=detach, front=front)


# -- stop, tell -----------------------------------------------------------------------------------


def stop(task_id: str | None = None, task: str | None = None, *, spec: str | None = None,
         workspace_path: Path | None = None, all_loops: bool = False, reason: str = "manual", force: bool = False,
         wait: bool = False, front: Front | None = None, redact: Redactor | None = None) -> list[str]:
    """`kiro loop stop`: write the stop hook (the loop pauses at its next safe point); `force`: stop the
    running step now (the backend's way), `wait`: until the loop has stopped. `all_loops`: the global hook.
    The task ids of the running loops it reached."""
    from kiro.core.backends import backend_for, wait_unlocked
    from kiro.fs.atomic import atomic_write
    from kiro.store.redact import Redactor
    from kiro.views import loops, reports

    front = front or Front()
    ws = workspace(workspace_path)
    if all_loops:
        ws.check_is_workspace()
    store = store_of(ws, front)
    cut = store.redact | Redactor.from_environment(None)
    reason = (cut | redact if redact is not None else cut).text(reason)  # as `tell`'s text: it is written
    if all_loops:
        ws.check_hook(ws.global_hook_file)
        atomic_write(ws.global_hook_file, reports.stop_hook(None, task_id="*", reason=reason), fsync=False)
        front.line(f"wrote {ws.relative(ws.global_hook_file)}: every loop pauses at its next safe point; "
                   f"`kiro loop resume --all` continues them")
        targets = [st.task_id for _p, st in store.all_states(include_archive=False)
                   if st is not None and store.is_locked(st.task_id)]
    else:
        tid = loop_named(ws, store, task_id, task, spec)
        assert tid is not None
        loaded = store.load(tid)
        hook = ws.hook_file(tid)
        ws.check_hook(hook)
        atomic_write(hook, reports.stop_hook(loaded.state, task_id=tid, reason=reason), fsync=False)
        alive = store.is_locked(tid)
        if alive:
            front.line(f"wrote {ws.relative(hook)}: loop {tid} pauses at its next safe point")
        else:
            front.line(f"wrote {ws.relative(hook)}; loop {tid} is not running (status "
                       f"{loops.loop_row(store, loaded.state, alive=False)['status']}); the hook keeps it paused "
                       f"until it is deleted or the loop is resumed")
        targets = [tid] if alive else []
    if force and targets:
        backend = backend_for(ws, None)
        for tid in targets:
            backend.force_stop(store, tid, front)
    elif wait:
        for tid in targets:
            wait_unlocked(store, tid, 3600)
    return targets


@dataclass(eq=False)
class Told:
    """A message queued for a loop's agent (`tell`)."""

    task_id: str
    message: Message
    inbox: str  # workspace-relative
    running: bool


def tell(task_id: str | None, text: str, *, task: str | None = None, spec: str | None = None,
         workspace_path: Path | None = None, via: str = "kiro loop tell", redact: Redactor | None = None,
         front: Front | None = None) -> Told:
    """Queue a message in the loop's inbox (kiro.store.messages): its agent reads it in its next prompt, once.
    What kiro knows as secret is cut from it first (and what `redact` names, e.g. the server's token)."""
    from kiro.errors import TaskNotFound
    from kiro.store.messages import Inbox
    from kiro.store.redact import Redactor

    ws = workspace(workspace_path)
    store = store_of(ws, front or Front())
    tid = loop_named(ws, store, task_id, task, spec)
    assert tid is not None
    if not store.exists(tid):
        raise TaskNotFound(f"--task-id: no loop {tid!r} in {ws.root}; `kiro loop status` lists the loops")
    if not text.strip():
        raise UserError("TEXT: the message is empty; give the text to tell the agent")
    inbox = Inbox(store.ws, tid)
    cut = store.redact | Redactor.from_environment(None)  # the config's secrets too, as every write of the loop's
    try:
        msg = inbox.queue((cut | redact if redact is not None else cut).text(text), via=via)
    except ValueError as exc:
        raise UserError(f"TEXT: {exc}") from None
    return Told(tid, msg, store.ws.relative(inbox.path), store.is_locked(tid))


__all__ = ["Conflict", "Front", "Options", "Started", "Told", "resume", "resume_all", "start", "status", "stop",
           "tell"]


def digest(ws: Workspace, day: str | None = None, *, config: Path | None = None) -> dict[str, Any]:
    """The digest dated `day` (`2026-11-28`; default: the one whose period holds now), computed from the
    workspace's states, events and waiting files (kiro.views.digest); `kiro loop digest` and `kiro serve`."""
    from datetime import datetime

    from kiro.store.settings import settings_for
    from kiro.views import digest as view

    located = settings_for(ws, config_file=config)
    digest_at = located.config.digest_at
    date = view.parse_date(day) if day is not None else view.day_of(datetime.now().astimezone(), digest_at)
    return view.compute(located.store, date, digest_at)
