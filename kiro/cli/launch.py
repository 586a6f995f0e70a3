"""`kiro loop start` and `kiro loop resume`: what the two Typer commands (kiro.cli.loop) do once their
options are read. Each command returns its exit code; kiro.cli turns an error into one line on stderr
and its exit code.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kiro.views import output

LOOP_OUTCOMES = (0, 3, 4, 5, 6)  # SPEC §6 exit codes of a loop that ran; 1 is kiro failing to run it


# -- what start and resume share -------------------------------------------------------------------


def say_note(note: str) -> None:
    """A loop's note (the box its steps run in): on stderr, beside the warnings (stdout is the loop's
    events), with no `kiro: `: no error."""
    from kiro.views import console

    with contextlib.suppress(OSError):
        sys.stderr.write(console.clean(note) + "\n")
        sys.stderr.flush()


def workspace(path: Path | None) -> Any:
    from kiro.store.workspace import Workspace

    return Workspace.find(path)


def store_of(ws: Any, *, lenient: bool = True) -> Any:
    """The state store, honouring `state_directory` from the config. Read commands still work on a
    broken config (with a warning), so a person can see what their loops are doing."""
    from kiro.errors import ConfigError
    from kiro.store.settings import settings_for
    from kiro.views import console

    try:
        store = settings_for(ws).store
    except ConfigError as exc:
        if not lenient:
            raise
        from kiro.store.state import StateStore

        console.warning(f"{exc} (using defaults to read the state)")
        store = StateStore(ws)
    console.redact_with(store.redact)  # what the store knows (the serve token) is cut from every line too
    return store


def overrides(max_iterations: int | None, failure_threshold: int | None, timeout: float | None,
              executor: str | None, model: str | None, agent: str | None = None,
              sandbox: str | None = None, parallel: int | None = None) -> dict[str, Any]:
    return {
        "sandbox": sandbox,
        "parallel": parallel,
        "autonomous_loop.max_iterations": max_iterations,
        "autonomous_loop.failure_threshold": failure_threshold,
        "autonomous_loop.timeout_seconds": timeout,
        "executor": executor,
        "agent": agent,
        "llm.model": model,
    }


def run_foreground(runs: list[Any], quiet: bool, verbose: bool) -> int:
    import asyncio

    from kiro.core.runner import combined_exit_code, run_loops
    from kiro.store.events import Listener
    from kiro.store.redact import Redactor
    from kiro.views import console

    for r in runs:  # what a loop knows as secret (its llm.base_url's password, its commands' tokens) is cut
        console.redact_with(Redactor.for_run(r.config))  # from every line printed from here on
    listeners: list[Listener] = [] if quiet else [console.EventPrinter(with_task=len(runs) > 1, verbose=verbose)]
    for r in runs:
        for w in r.warnings:
            console.warning(w)
    from kiro.executors.command import CommandExecutor

    for r in runs:  # which credential an agent CLI bills, in plain sight (agent_env)
        said = r.executor.billing_line() if isinstance(r.executor, CommandExecutor) else None
        if said:  # even with --quiet: a billed key is never silent
            console.line(said)
    if not quiet:
        for note in dict.fromkeys(n for r in runs for n in r.notes):
            say_note(note)
    outcomes = asyncio.run(run_loops(runs, listeners))
    for o in outcomes:
        msg = f"{o.task_id}: {o.status} ({o.reason}) - {o.message}"
        if o.report:
            msg += f"; see {o.report}"
        try:
            if o.exit_code == 1:
                console.error(msg)
            else:
                console.line(msg, style="bold")
        except OSError as exc:  # the reader went away, or a full disk: the exit code still says how the loop ended
            output.cannot_write(sys.stderr if o.exit_code == 1 else sys.stdout, exc)
    return combined_exit_code(outcomes)


def detach(argv: list[str], ws: Any, task_id: str) -> None:
    """Run this same command again in the background, in its own session, output to Logs/<id>.out;
    wait until it has taken the loop's lock (or died) so that errors still reach the person."""
    from kiro.errors import RunError
    from kiro.store.state import StateStore
    from kiro.store.workspace import check_task_id, current_folder
    from kiro.views import console

    out_path = ws.detached_output(check_task_id(task_id))  # the id names the file: checked before it is made
    out_path.parent.mkdir(parents=True, exist_ok=True)
    store = StateStore(ws)
    made, existed = not out_path.exists(), store.exists(task_id)
    with open(out_path, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "kiro", *argv], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                cwd=current_folder() or ws.root)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = out_path.read_text(errors="replace").strip().splitlines()[-1:] if out_path.exists() else []
            if proc.returncode in LOOP_OUTCOMES:  # it ran and ended before we saw its lock: a short loop
                console.line(task_id)
                return
            if made and tail and store.exists(task_id) == existed:  # refused: its line is said here, and the
                out_path.unlink(missing_ok=True)  # file made for it goes (kiro.store.workspace.nothing_made_if_refused)
            raise RunError(f"the background loop exited at once (exit {proc.returncode}): "
                           f"{tail[0] if tail else 'see ' + ws.relative(out_path)}")
        if store.is_locked(task_id):
            console.line(task_id)
            return
        time.sleep(0.05)
    raise RunError(f"the background loop did not start within 30 s; see {ws.relative(out_path)}")


def uses_temporal(ws: Any, config: Path | None) -> bool:
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
        from kiro.errors import UserError
        from kiro.temporal import MISSING

        raise UserError(MISSING) from None
    return True


# -- the commands ----------------------------------------------------------------------------------


def spec_task(ws: Any, name: str) -> str:
    """`--spec NAME`: the task file `.kiro/specs/NAME/tasks.md` of the workspace (or of the current
    folder), or one line listing the specs there are."""
    from kiro.errors import UserError
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


def start(task: list[str], workspace_path: Path | None = None, config: Path | None = None, **options: Any) -> int:
    """`kiro loop start` (`_start`). A start that is refused leaves the workspace as it found it: what it made
    of kiro's folders is taken away again (kiro.store.workspace.nothing_made_if_refused)."""
    from kiro.store.settings import settings_for
    from kiro.store.workspace import nothing_made_if_refused

    ws = workspace(workspace_path)
    with nothing_made_if_refused(ws.root, lambda: settings_for(ws, config_file=config).ws.state_dir):
        return _start(task, workspace_path=workspace_path, config=config, **options)


def _start(task: list[str], workspace_path: Path | None = None, config: Path | None = None,
           max_iterations: int | None = None, failure_threshold: int | None = None, timeout: float | None = None,
           executor: str | None = None, model: str | None = None, agent: str | None = None,
           task_id: str | None = None, detached: bool = False, quiet: bool = False, verbose: bool = False,
           step: str | None = None, fresh: bool = False, spec: list[str] | None = None,
           sandbox: str | None = None, parallel: int | None = None) -> int:
    """`kiro loop start`: the loop's exit code (SPEC §6), or 0 for a loop started in the background. `step`:
    only that step (kiro.core.features.OneStep). `fresh`: set the task's unfinished loop aside first
    (kiro.core.runner.set_aside)."""
    from kiro.core.runner import check_new_task_id, new_task_id, prepare_start
    from kiro.errors import UserError
    from kiro.store.workspace import check_task_id

    if executor is not None and executor not in ("shell", "command", "openai"):
        raise UserError(f"--executor {executor!r}: choose shell, command or openai")
    if task_id:
        check_task_id(task_id)  # before anything is made: with --detach the id names Logs/<id>.out
    ws = workspace(workspace_path)
    task = [*task, *(spec_task(ws, name) for name in spec or ())]
    if not task:
        raise UserError("name what to run: --task PATH (a task file) or --spec NAME (a Kiro spec in .kiro/specs/)")
    changes = overrides(max_iterations, failure_threshold, timeout, executor, model, agent, sandbox, parallel)
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
    if (step is not None or fresh) and uses_temporal(ws, config):
        raise UserError(f"{'--step' if step is not None else '--fresh'} is not built for backend: temporal yet")
    if detached and uses_temporal(ws, config):
        detached, temporal_detach = False, True  # a workflow needs no process of ours in the background
    else:
        temporal_detach = False
    if detached:
        if len(task) > 1:
            raise UserError("--detach starts one loop; run it once per task")
        store = store_of(ws, lenient=False)
        tid = check_new_task_id(store, task_id) if task_id else new_task_id(store)
        argv = [a for a in sys.argv[1:] if a != "--detach"]
        if not task_id:
            argv += ["--task-id", tid]
        detach(argv, ws, tid)
        return 0
    if temporal_detach or uses_temporal(ws, config):
        from kiro.temporal.commands import preflight

        preflight(ws, config)  # the server is reachable, the project is in git: before any state is written
    runs = []
    index = None
    batch = None
    if len(task) > 1:
        from kiro.core.runner import LoopIndex, StartBatch, room_for_loops

        room_for_loops(len(task))  # a limit of open files too low for them all: said before any state is written

        index = LoopIndex(store_of(ws, lenient=False))
        batch = StartBatch()  # one start guard, the new loops' files written side by side
    from contextlib import nullcontext

    try:
        with batch if batch is not None else nullcontext():
            for t in task:
                runs.append(prepare_start(ws, t, task_id=task_id, config_file=config, overrides=changes,
                                          index=index, batch=batch, fresh=fresh))
    except BaseException:
        for r in runs:
            if r.release:
                r.release()
        raise
    if one_step is not None:
        runs[0].features.append(one_step)
    if runs and runs[0].config.backend.kind == "temporal":
        from kiro.temporal.commands import start_runs

        return start_runs(runs, detach=temporal_detach, quiet=quiet, verbose=verbose)
    return run_foreground(runs, quiet, verbose)


def resume(task_id: str | None = None, task: str | None = None, workspace_path: Path | None = None,
           config: Path | None = None, max_iterations: int | None = None, reset_failures: bool = False,
           failure_threshold: int | None = None, timeout: float | None = None, executor: str | None = None,
           model: str | None = None, agent: str | None = None, detached: bool = False, quiet: bool = False,
           verbose: bool = False, all_loops: bool = False, sandbox: str | None = None,
           parallel: int | None = None) -> int:
    """`kiro loop resume`: the loop's exit code (SPEC §6); 0 when it continues elsewhere (in the background,
    or under the `kiro loop watch` that keeps it)."""
    from kiro.core.runner import prepare_resume
    from kiro.views.loops import resolve_task_id

    ws = workspace(workspace_path)
    store = store_of(ws, lenient=False)
    if all_loops:
        return resume_all(ws, store, config=config, max_iterations=max_iterations, reset_failures=reset_failures,
                          failure_threshold=failure_threshold, timeout=timeout,
                          changes=overrides(None, None, None, executor, model, agent, sandbox, parallel),
                          detached=detached, quiet=quiet,
                          verbose=verbose, named=bool(task_id or task))
    tid = resolve_task_id(ws, store, task_id, task)
    assert tid is not None
    temporal = uses_temporal(ws, config)
    if detached and not temporal:
        from kiro.core.runner import AlreadyFinished
        from kiro.status import Status

        if store.load(tid).state.status == Status.COMPLETED:  # as in the foreground, before a process is spent
            raise AlreadyFinished(f"loop {tid!r} is already completed; nothing to resume")
        argv = [a for a in sys.argv[1:] if a != "--detach"]
        if not task_id:
            argv += ["--task-id", tid]
        detach(argv, store.ws, tid)
        return 0
    changes = overrides(None, None, None, executor, model, agent, sandbox, parallel)
    from kiro.errors import LockHeld

    try:
        run = prepare_resume(ws, tid, config_file=config, overrides=changes, max_iterations=max_iterations,
                             failure_threshold=failure_threshold, timeout=timeout, reset_failures=reset_failures)
    except LockHeld:
        if store.holder_role(tid) != "watch":
            raise
        from kiro.core.supervisor import hand_back_to_watch
        from kiro.views import console

        for note in hand_back_to_watch(store, tid):
            console.line(note)
        console.line(f"loop {tid} is kept by `kiro loop watch` (process {store.holder_pid(tid)}); it continues there")
        return 0
    if temporal:
        from kiro.temporal.commands import resume_run

        return resume_run(run, detach=detached, quiet=quiet, verbose=verbose)
    return run_foreground([run], quiet, verbose)


def resume_all(ws0: Any, store: Any, *, config: Path | None, max_iterations: int | None, reset_failures: bool,
               failure_threshold: int | None, timeout: float | None, changes: dict[str, Any], detached: bool,
               quiet: bool, verbose: bool, named: bool) -> int:
    """`kiro loop resume --all`: remove the global hook, then continue every loop a stop hook paused, in
    this process (or each in the background with --detach). Loops a `kiro loop watch` keeps continue there."""
    from kiro.core.runner import paused_by_hooks, prepare_resume
    from kiro.core.supervisor import hand_back_to_watch
    from kiro.errors import UserError
    from kiro.views import console

    if named:
        raise UserError("--all continues every paused loop; leave out --task-id/--task (or drop --all)")
    ws = store.ws
    if ws.global_hook_file.exists():
        ws.global_hook_file.unlink()
        console.line(f"removed the global stop hook {ws.relative(ws.global_hook_file)}")
    targets: list[str] = []
    for st in paused_by_hooks(store):
        if store.is_locked(st.task_id):
            if store.holder_role(st.task_id) == "watch":
                for note in hand_back_to_watch(store, st.task_id):
                    console.line(note)
                console.line(f"loop {st.task_id} is kept by `kiro loop watch`; it continues there")
            continue
        targets.append(st.task_id)
    if not targets:
        console.line("no paused loop to continue")
        return 0
    if detached:
        base = [a for a in sys.argv[1:] if a not in ("--detach", "--all")]
        for tid in targets:
            detach([*base, "--task-id", tid], ws, tid)
        return 0
    runs: list[Any] = []
    from kiro.core.runner import room_for_loops

    room_for_loops(len(targets))  # a limit of open files too low for them all: said before any loop moves
    try:
        for tid in targets:
            runs.append(prepare_resume(ws0, tid, config_file=config, overrides=changes, max_iterations=max_iterations,
                                       failure_threshold=failure_threshold, timeout=timeout,
                                       reset_failures=reset_failures))
    except BaseException:
        for r in runs:
            if r.release:
                r.release()
        raise
    return run_foreground(runs, quiet, verbose)
