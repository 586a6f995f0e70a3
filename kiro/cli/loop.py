"""`kiro loop ...`: start, status, state, progress, logs, stop, resume, stats, digest."""

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from kiro.cli import HelpGroup, guarded
from kiro.cli.launch import store_of as _store
from kiro.cli.launch import workspace as _workspace

app = typer.Typer(
    cls=HelpGroup,
    help="Run, watch, stop and resume task loops.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)

WorkspaceOpt = Annotated[
    Path | None,
    typer.Option("--workspace", "-w", show_default=False,
                 help="The workspace folder (default: $KIRO_WORKSPACE, else the nearest folder upwards with "
                      "config/autonomous_loop.yaml or .state/, else the current one)."),
]
TaskIdOpt = Annotated[str | None, typer.Option("--task-id", help="The loop's task id.", show_default=False)]
TaskOpt = Annotated[str | None, typer.Option("--task", help="The loop's task file (instead of --task-id).",
                                             show_default=False)]
SpecOpt = Annotated[str | None, typer.Option("--spec", metavar="NAME", help="The loop of a Kiro spec, by name "
                                             "(`.kiro/specs/NAME/tasks.md`; instead of --task-id).", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="Use this config file instead of "
                                                                  "config/autonomous_loop.yaml.", show_default=False)]


def _named(ws: Any, store: Any, task_id: str | None, task: str | None, spec: str | None, *,
           required: bool = True) -> Any:
    from kiro.core import api

    return api.loop_named(ws, store, task_id, task, spec, required=required)


def _loaded(workspace: Path | None, task_id: str | None, task: str | None, spec: str | None = None) -> Any:
    """The loop a read command names (by --task-id, --task, --spec, or the only one there is), loaded with
    the backup fallback; a fallback's warning goes to stderr."""
    from kiro.views import console

    ws = _workspace(workspace)
    store = _store(ws)
    tid = _named(ws, store, task_id, task, spec)
    assert tid is not None
    loaded = store.load(tid)
    if loaded.warning:
        console.warning(loaded.warning)
    return store, loaded


def _exit(code: int) -> None:
    raise typer.Exit(code)


def _utf8(name: str, value: str) -> None:
    """A text argument kiro writes into a file must be UTF-8: a byte that is not arrives as a lone surrogate
    (Python's surrogateescape), which no UTF-8 file can hold."""
    from kiro.errors import UserError

    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        byte = ord(value[exc.start]) - 0xDC00
        shown = f"byte 0x{byte:02x}" if 0x80 <= byte <= 0xFF else f"character {value[exc.start]!r}"
        raise UserError(f"{name}: not UTF-8 text ({shown} at position {exc.start + 1}); type it again as UTF-8") from None


# The names are not listed here: reading the registry (kiro.plugins.AGENTS) costs every command ~50 ms; a
# wrong name is answered with the list.
AgentOpt = Annotated[str | None, typer.Option("--agent", help="Agent preset for the command executor, or an ACP "
                                              "agent: one `kiro agents` lists (kiro's own and those installed "
                                              "packages add).",
                                              show_default=False)]

ParallelOpt = Annotated[int | None, typer.Option("--parallel", metavar="N", help="Run up to N open steps at once, "
                                                 "each in its own git worktree, merged back in plan order (the "
                                                 "steps marked `(P)`, or with parallel_by: depends those whose "
                                                 "`_Depends:` are done); kept by resume.", show_default=False)]

SandboxOpt = Annotated[str | None, typer.Option("--sandbox", help="bwrap | off: run each step's processes in a "
                                                "bubblewrap box, or not (default: bwrap when installed).",
                                                show_default=False)]

HeldLockOpt = Annotated[int | None, typer.Option("--held-lock", metavar="FD", hidden=True, show_default=False,
                                                 help="kiro's own: the loop a --detach made ready, its lock this "
                                                      "inherited descriptor (kiro.core.api.in_background).")]


@app.command()
@guarded
def start(
    task: Annotated[list[str] | None, typer.Option("--task", "-t", metavar="PATH", help="The task file (repeat to run several loops "
                                                                 "in one process). `/Specs/x.md` is workspace-relative.",
                                                   show_default=False)] = None,
    spec: Annotated[list[str] | None, typer.Option("--spec", metavar="NAME", help="A Kiro spec by name: runs "
                                                   "`.kiro/specs/NAME/tasks.md` in place (repeatable).",
                                                   show_default=False)] = None,
    workspace: WorkspaceOpt = None,
    config: ConfigOpt = None,
    max_iterations: Annotated[int | None, typer.Option("--max-iterations", help="Stop after N iterations (exit 4).",
                                                       show_default=False)] = None,
    failure_threshold: Annotated[int | None, typer.Option("--failure-threshold", help="Consecutive failures that "
                                                          "end the loop (exit 5).", show_default=False)] = None,
    timeout: Annotated[float | None, typer.Option("--timeout", help="Run-time limit in seconds (exit 4).",
                                                  show_default=False)] = None,
    executor: Annotated[str | None, typer.Option("--executor", help="shell | command | openai.",
                                                 show_default=False)] = None,
    model: Annotated[str | None, typer.Option("--model", help="Model name for the openai executor.",
                                              show_default=False)] = None,
    agent: AgentOpt = None,
    sandbox: SandboxOpt = None,
    parallel: ParallelOpt = None,
    task_id: TaskIdOpt = None,
    detach: Annotated[bool, typer.Option("--detach",
                                         help="Run in the background; print the task id and exit 0.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the final line.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also print tool calls and reinjections.")] = False,
    step: Annotated[str | None, typer.Option("--step", metavar="ID", show_default=False,
                                             help="Do only this step (e.g. 2.1; a parent: its sub-steps), whatever is "
                                                  "open before it, then stop: exit 0 once it is done, the loop "
                                                  "`stopped` (step_done) for `kiro loop resume` to do the rest.")] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="Start afresh when the task already has an unfinished loop: "
                                                        "that loop's state goes to .state/archive/ (still shown by "
                                                        "status), its requests to Logs/resolved/; the task file's "
                                                        "checked boxes stay checked.")] = False,
    held_lock: HeldLockOpt = None,
) -> None:
    """Start a loop on a task file, in the foreground. Exits with the loop's exit code: 0 completed (or, with --step, that step done), 3 paused/stopped, 4 max iterations or time limit, 5 failed, 6 waiting for a person, 1 kiro could not go on."""
    from kiro.cli import launch
    from kiro.core import api

    opts = launch.options(max_iterations=max_iterations, failure_threshold=failure_threshold, timeout=timeout,
                          executor=executor, model=model, agent=agent, sandbox=sandbox, parallel=parallel)
    _exit(launch.started(api.start(task or [], specs=spec or [], workspace_path=workspace, config=config,
                                   options=opts, task_id=task_id, step=step, fresh=fresh, detach=detach,
                                   front=launch.ConsoleFront(quiet=quiet, verbose=verbose), held_lock=held_lock)))


@app.command()
@guarded
def resume(
    task_id: TaskIdOpt = None,
    task: TaskOpt = None,
    spec: SpecOpt = None,
    workspace: WorkspaceOpt = None,
    config: ConfigOpt = None,
    max_iterations: Annotated[int | None, typer.Option("--max-iterations", help="Raise (or set) the iteration cap.",
                                                       show_default=False)] = None,
    reset_failures: Annotated[bool, typer.Option("--reset-failures", help="Zero the failure counters and "
                                                                          "per-step attempts.")] = False,
    failure_threshold: Annotated[int | None, typer.Option("--failure-threshold", show_default=False,
                                                          help="A new failure threshold.")] = None,
    timeout: Annotated[float | None, typer.Option("--timeout", help="A new run-time limit in seconds.",
                                                  show_default=False)] = None,
    executor: Annotated[str | None, typer.Option("--executor", help="shell | command | openai.",
                                                 show_default=False)] = None,
    model: Annotated[str | None, typer.Option("--model", show_default=False, help="Model for openai.")] = None,
    agent: AgentOpt = None,
    sandbox: SandboxOpt = None,
    parallel: ParallelOpt = None,
    detach: Annotated[bool, typer.Option("--detach", help="Continue in the background; print the task id.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the final line.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also print tool calls and reinjections.")] = False,
    all_loops: Annotated[bool, typer.Option("--all", help="Remove the global hook of `kiro loop stop --all` and "
                                                          "continue every loop a stop hook paused.")] = False,
    held_lock: HeldLockOpt = None,
) -> None:
    """Remove the stop hook and continue a loop from its saved state, whatever its status (paused, stopped, interrupted by a crash, failed, out of iterations). Completed steps never run again."""
    from kiro.cli import launch
    from kiro.core import api
    from kiro.errors import UserError

    opts = launch.options(max_iterations=max_iterations, failure_threshold=failure_threshold, timeout=timeout,
                          executor=executor, model=model, agent=agent, sandbox=sandbox, parallel=parallel)
    front = launch.ConsoleFront(quiet=quiet, verbose=verbose)
    if all_loops:
        if task_id or task or spec:
            raise UserError("--all continues every paused loop; leave out --task-id/--task (or drop --all)")
        result = api.resume_all(workspace_path=workspace, config=config, options=opts, reset_failures=reset_failures,
                                detach=detach, front=front)
    else:
        result = api.resume(task_id, task, spec=spec, workspace_path=workspace, config=config, options=opts,
                            reset_failures=reset_failures, detach=detach, front=front, held_lock=held_lock)
    _exit(launch.started(result))


@app.command()
@guarded
def status(
    task_id: TaskIdOpt = None,
    task: TaskOpt = None,
    spec: SpecOpt = None,
    workspace: WorkspaceOpt = None,
    json_out: JsonOpt = False,
    watch: Annotated[bool, typer.Option("--watch", help="Keep the view live, refreshed every --interval "
                                                        "seconds, until Ctrl-C (with --json: one JSON line per "
                                                        "refresh).")] = False,
    interval: Annotated[float, typer.Option("--interval", min=0.1, help="Seconds between --watch refreshes.")] = 1.0,
) -> None:
    """One loop in detail, or a table of every loop in the workspace: status, iteration/max, success rate, current step, duration, ETA. A loop whose state says running but whose process is gone shows as `interrupted`."""
    from kiro.core import api
    from kiro.views import console

    ws = _workspace(workspace)
    store = _store(ws)
    tid = _named(ws, store, task_id, task, spec, required=False)
    warned: set[str] = set()

    def data() -> Any:
        warnings: list[str] = []
        result = api.status(ws, store, tid, warnings)
        for w in warnings:
            if w not in warned:  # once, also under --watch
                warned.add(w)
                console.warning(w)
        return result

    def render(result: Any) -> Any:
        result = console.printable_data(result)  # a terminal shows rich's text as it is
        if tid is not None:
            return console.detail_table(result)
        if not result:
            return console.text(f"no loops in {ws.root}; start one with `kiro loop start --task "
                                f"Specs/<name>/tasks.md`")
        return console.status_table(result)

    if watch:
        if json_out:
            console.watch_json(data, interval)
        else:
            from kiro.core.watch import ticks

            def plain() -> str | None:  # not on a terminal: the same plain table `status` prints
                result = data()
                return console.plain_table(result) if tid is None and result else None

            console.watch(lambda: render(data()), ticks([store.ws.state_dir], interval), plain)
        return
    result = data()
    if json_out:
        console.print_json(result)
    elif tid is None and result:
        console.write(console.plain_table(result) + "\n")
    else:
        console.print_table(render(result))


@app.command("state")
@guarded
def state_cmd(
    task_id: TaskIdOpt = None,
    task: TaskOpt = None,
    spec: SpecOpt = None,
    workspace: WorkspaceOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Accepted like on the other read commands: the state "
                                                          "is always printed as JSON.")] = True,
) -> None:
    """Print the loop's state file as JSON (falling back to the newest good backup if it is corrupt)."""
    from kiro.store.state import to_jsonable
    from kiro.views import console

    _, loaded = _loaded(workspace, task_id, task, spec)
    console.print_json(to_jsonable(loaded.state))


@app.command()
@guarded
def progress(
    task_id: TaskIdOpt = None,
    task: TaskOpt = None,
    spec: SpecOpt = None,
    workspace: WorkspaceOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Every step with its status, attempts and duration, and a progress bar."""
    from kiro.views import console, loops

    store, loaded = _loaded(workspace, task_id, task, spec)
    data = loops.progress(store.ws, loaded.state)
    if json_out:
        console.print_json(data)
        return
    if data["error"]:
        console.warning(data["error"])
    console.progress_view(f"{data['title']} ({data['task_path']})", data["steps"], data["steps_done"],
                          data["steps_total"])
    if data.get("sleep_note") or data.get("sleep_until"):
        console.line(f"sleeping: {data.get('sleep_note') or data.get('sleeping_because')} "
                     f"(until {data.get('sleep_until')})")
    if data.get("schedule"):
        console.line(f"schedule {data['schedule']}: {data.get('runs', 0)} run(s); next run {data.get('next_run') or '-'}")


@app.command()
@guarded
def receipt(
    task_id: TaskIdOpt = None,
    task: TaskOpt = None,
    step: Annotated[str | None, typer.Option("--step", help="Only this step's receipt.", show_default=False)] = None,
    workspace: WorkspaceOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """The receipts of the loop's completed steps: who did each, attempts, times, tokens and cost, verify's exit code, output and test counts, the checkpoint commit and its diff stat, the protected-path check."""
    from kiro.views import console, loops

    _, loaded = _loaded(workspace, task_id, task)
    found = loops.receipts(loaded.state, step)
    if json_out:
        console.print_json(found[0] if step is not None else found)
        return
    console.line("\n\n".join(loops.receipt_text(r) for r in found) or "no completed steps yet")


@app.command()
@guarded
def rollback(
    to_step: Annotated[str, typer.Option("--to-step", help="The completed step whose checkpoint to go back to; "
                                                           "it stays done, the steps after it are undone.")],
    task_id: TaskIdOpt = None,
    task: TaskOpt = None,
    spec: SpecOpt = None,
    workspace: WorkspaceOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Put the project's files back to a step's git checkpoint (as a new commit) and uncheck the
    boxes of the steps completed after it; then `kiro loop resume` does them again."""
    from kiro.core.backends import backend_for
    from kiro.errors import UserError
    from kiro.git import checkpoints
    from kiro.views import console

    ws = _workspace(workspace)
    backend = backend_for(ws, None)
    if "rollback" in backend.unbuilt:
        raise UserError(f"kiro loop rollback is not built for backend: {backend.name} yet (the loop's work is on "
                        f"branch kiro/<task_id> of the remote; docs/scale-out.md §12)")
    store = _store(ws, lenient=False)
    tid = _named(ws, store, task_id, task, spec)
    assert tid is not None
    done = checkpoints.rollback(ws, store, tid, to_step)
    if json_out:
        console.print_json({"task_id": done.task_id, "to_step": done.to_step, "checkpoint": done.checkpoint,
                            "commit": done.commit, "undone": done.undone, "unchecked": done.unchecked,
                            "method": done.method})
        return
    where = f"commit {done.commit[:12]}" if done.commit else "no commit needed: the files already matched"
    console.line(f"{tid}: rolled back to step {done.to_step} (checkpoint {(done.checkpoint or '')[:12]}; {where}); "
                 f"undone: {', '.join(done.undone)}; continue with `kiro loop resume --task-id {tid}`")


@app.command()
@guarded
def logs(
    task_id: TaskIdOpt = None,
    task: TaskOpt = None,
    spec: SpecOpt = None,
    workspace: WorkspaceOpt = None,
    follow: Annotated[bool, typer.Option("--follow", "-f",
                                         help="Keep printing new events until the loop ends.")] = False,
    tail: Annotated[int | None, typer.Option("--tail", "-n", help="Only the last N events.",
                                             show_default=False)] = None,
    json_out: JsonOpt = False,
) -> None:
    """The loop's event log (Logs/<task_id>.jsonl), human-readable or as JSON lines."""
    import collections
    import json

    from kiro.store.logread import read_events, read_last, read_new
    from kiro.views import console

    if tail is not None and tail < 0:
        from kiro.errors import UserError

        raise UserError(f"--tail must be 0 or more (the number of last events to show), not {tail}")
    ws = _workspace(workspace)
    store = _store(ws)
    tid = _named(ws, store, task_id, task, spec)
    assert tid is not None
    path = store.ws.event_log(tid)
    if not path.exists() and not store.exists(tid):
        from kiro.errors import TaskNotFound

        raise TaskNotFound(f"no loop with task id {tid!r} (no {store.ws.relative(path)})")

    printer = console.EventPrinter(verbose=True)

    def show(e: dict[str, Any]) -> None:
        if json_out:
            console.write(json.dumps(e, ensure_ascii=False) + "\n", flush=False)
        else:
            printer.show(e)

    if not follow:
        for e in read_events(path) if tail is None else read_last(path, tail):
            show(e)
        return
    # Follow from the end of the last complete line read, not from the file's size taken afterwards:
    # an event appended in between, or the rest of a line half-written when it was read, is shown.
    kept: collections.deque[dict[str, Any]] = collections.deque(maxlen=tail)
    offset, last = 0, None
    while True:
        new, after = read_new(path, offset)
        if after == offset:
            break
        kept.extend(new)
        offset, last = after, (new[-1] if new else last)
    for e in kept:
        show(e)
    sys.stdout.flush()
    # the last run's end, unless a process holds the loop for its next run (a `--detach` resume that has not
    # begun it yet: kiro.core.api.in_background); a `kiro loop watch` that keeps it paused is no such run
    finished = last is not None and last.get("event") == "loop_finished" and (
        not store.is_locked(tid) or store.holder_role(tid) == "watch")
    from kiro.core.watch import ticks

    for _ in ticks([path.parent], 1.0):  # wakes on each append to the log, and every second
        if finished:
            break
        new, offset = read_new(path, offset)
        for e in new:
            show(e)
            if e.get("event") == "loop_finished":
                finished = True
        sys.stdout.flush()
        if finished:
            break
        if not new and not store.is_locked(tid):
            new, offset = read_new(path, offset)  # the last lines written before the process went away
            for e in new:
                show(e)
            break


@app.command()
@guarded
def stop(
    task_id: TaskIdOpt = None,
    task: TaskOpt = None,
    spec: SpecOpt = None,
    workspace: WorkspaceOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Stop the process now (SIGTERM; state saved; SIGKILL after "
                                                        "10 s if it will not).")] = False,
    save_state: Annotated[bool, typer.Option("--save-state", help="Accepted for compatibility: the state is always "
                                                                  "saved.")] = False,
    reason: Annotated[str, typer.Option("--reason", help="Why; written into the hook file.")] = "manual",
    all_loops: Annotated[bool, typer.Option("--all", help="Every loop: writes the global hook "
                                                          ".hooks/stop_autonomous_loop.md.")] = False,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the loop has stopped.")] = False,
) -> None:
    """Create the stop hook: the loop stops at its next safe point (paused, exit 3) and stays paused until the hook is deleted or `kiro loop resume` runs."""
    from kiro.cli import launch
    from kiro.core import api

    _utf8("--reason", reason)  # it is written into the hook file
    api.stop(task_id, task, spec=spec, workspace_path=workspace, all_loops=all_loops, reason=reason, force=force,
             wait=wait, front=launch.ConsoleFront())


@app.command()
@guarded
def stats(
    workspace: WorkspaceOpt = None,
    since: Annotated[str | None, typer.Option("--since", help="Only what happened since this date (2026-11-22, local midnight) or time (ISO 8601).", show_default=False)] = None,
    json_out: JsonOpt = False,
) -> None:
    """Analytics across every loop in the workspace, from the state files and event logs: loops and runs, steps (attempts, retries, success rate), step durations p50/p95, tokens and cost per step, time spent waiting (backoff, budgets, active hours, rate limits), stop reasons."""
    from kiro.views import console
    from kiro.views import stats as loop_stats

    ws = _workspace(workspace)
    store = _store(ws)
    result = loop_stats.compute(store, loop_stats.parse_since(since) if since else None)
    if json_out:
        console.print_json(result)
    else:
        console.write(loop_stats.render(result))


@app.command()
@guarded
def digest(
    date: Annotated[str | None, typer.Option("--date", metavar="YYYY-MM-DD", help="The digest of this date (default: today's; with digest_at, the one whose 24 hours hold now).", show_default=False)] = None,
    workspace: WorkspaceOpt = None,
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """The digest (Logs/digest/<date>.md, as it stands now): steps done with their receipts, what waits for a person, cost and tokens by agent, time slept on usage limits, failures and their causes."""
    from kiro.core import api
    from kiro.views import console
    from kiro.views import digest as view

    result = api.digest(_workspace(workspace), date, config=config)
    if json_out:
        console.print_json(result)
    else:
        console.write(view.render(result))


@app.command()
@guarded
def tell(
    text: Annotated[str, typer.Argument(help="The message: what the agent should know or do.", show_default=False)],
    task_id: TaskIdOpt = None,
    task: TaskOpt = None,
    spec: SpecOpt = None,
    workspace: WorkspaceOpt = None,
) -> None:
    """Queue a message for a loop: its agent reads it in its next prompt, under "## Message from a person", once. Durable: a loop that is not running (or is killed) gets it when it runs again; a waiting loop wakes for it."""
    from kiro.cli import launch
    from kiro.core import api
    from kiro.views import console

    _utf8("TEXT", text)
    told = api.tell(task_id, text, task=task, spec=spec, workspace_path=workspace, front=launch.ConsoleFront())
    when = "in its next prompt" if told.running else "when it runs again (`kiro loop resume`)"
    console.line(f"queued message {told.message.id[:8]} for loop {told.task_id} ({told.inbox}); "
                 f"the agent reads it {when}")


@app.command()
@guarded
def history(
    task_id: TaskIdOpt = None,
    workspace: WorkspaceOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """What every loop did, in order: state transitions, runs, step attempts, messages. From the index .state/kiro.db (SQLite), brought up to date from the event logs first, and rebuilt from them when missing or broken."""
    from kiro.errors import UserError
    from kiro.store import history as hist
    from kiro.store.workspace import check_task_id
    from kiro.views import console

    ws = _workspace(workspace)
    store = _store(ws)
    if task_id is not None:
        check_task_id(task_id)
        if not store.exists(task_id) and not ws.event_log(task_id).exists():
            raise UserError(f"--task-id: no loop {task_id!r} in {ws.root}; `kiro loop status` lists the loops")
    records, note = hist.History(store.ws).query(task_id)
    if note:
        console.warning(note)
    if json_out:
        console.print_json(records)
    else:
        console.write(hist.render(records))
