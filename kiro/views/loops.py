"""What the read commands show, as plain data (the CLI renders it, `--json` prints it)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiro import timeutil
from kiro.errors import KiroError, TaskNotFound, UserError
from kiro.executors.kinds import reads_messages
from kiro.status import RECORDED, Status, StopReason, success_rate
from kiro.store import journal, taskmap
from kiro.store.statestore import StateStore
from kiro.store.workspace import Workspace, check_task_id, frontmatter_task_id, locate_task
from kiro.usage import dollars

if TYPE_CHECKING:
    from kiro.store.state import LoopState  # its models are imported where a state is read (kiro.store.statestore)

# summary fields a summary written by an earlier kiro lacks and a row does without (finished loops never
# write theirs again: requiring it would read each of their state files on every `status`)
LATER_FIELDS = frozenset({"stop_message", "timeout_seconds"})


def resolve_task_id(ws: Workspace, store: StateStore, task_id: str | None, task: str | None, *,
                    required: bool = True) -> str | None:
    """`--task-id` and `--task` name a loop interchangeably. With neither, the only loop in the
    workspace, if there is exactly one."""
    if task_id:
        return check_task_id(task_id)
    if task:
        path = ws.resolve_task(task)
        rel = ws.relative(path)
        found = [st for _p, st in store.all_states() if st is not None and st.task_path == rel]
        if not found:

            hint = frontmatter_task_id(path) or taskmap.task_id_for(ws.state_dir, path)  # moved since
            if hint and store.exists(hint):
                return hint
            raise TaskNotFound(f"no loop has worked on {rel} yet; start one with `kiro loop start --task {rel}`")
        return found[0].task_id  # newest first
    if not required:
        return None
    ids = [tid for tid, _path in store.state_files()]  # unreadable ones too: load() falls back
    if len(ids) == 1:
        return ids[0]
    if not ids:
        raise TaskNotFound(f"no loops in {ws.root}; start one with `kiro loop start --task PATH`")
    raise UserError(f"{len(ids)} loops in this workspace: name one with --task-id "
                    f"(`kiro loop status` lists them)")


def hint(state: LoopState, status: Status | str, stop_reason: str | None = None) -> str | None:
    """The command that continues a loop shown with `status`, with the limit to raise if any (the
    one `stop_reason`, by default the state's, names)."""
    return _hint(state.task_id, state.max_iterations, Status(status), global_hook=False,
                 stop_reason=stop_reason or state.stop_reason, timeout=state.timeout_seconds)


def _hint(task_id: str, max_iterations: int, status: Status, *, global_hook: bool,
          stop_reason: str | None = None, timeout: float | None = None) -> str | None:
    command = f"kiro loop resume --task-id {task_id}"
    if status.is_resumable:
        return "kiro loop resume --all" if global_hook else command  # `--task-id` refuses while it holds
    reason = StopReason.of(stop_reason, status)
    if status == Status.COMPLETED or reason is None:
        return None
    if reason.flag is None:
        return command  # the limit is in the config, not a flag of resume (`advice`)
    more, timeout_text = max_iterations * 2, f"{timeout * 2:g}" if timeout else "SECONDS"
    return f"{command} {reason.flag.format(more=more, timeout=timeout_text)}"


def advice(state: LoopState, status: Status | str, stop_reason: str | None = None) -> str | None:
    """For a loop that ended where a plain resume will not do (out of iterations, time or a budget): what to
    raise, and the command that resumes it (the stop reason's advice, kiro.status.StopReason); None otherwise."""
    status = Status(status)
    stop_reason = stop_reason or state.stop_reason
    reason = StopReason.of(stop_reason, status)
    if reason is None or reason.advice is None:
        return None
    return reason.advice.format(command=hint(state, status, stop_reason))


def loop_row(store: StateStore, state: LoopState, *, alive: bool | None = None) -> dict[str, Any]:
    """What `status` shows of one loop."""
    from kiro.store.state import to_jsonable

    shown = journal.summary_of(to_jsonable(state))
    if state.status == Status.SLEEPING:  # why it sleeps: its last transition (not in the summary)
        last = state.history[-1] if state.history else None
        shown["sleeping_because"] = last.reason if last is not None and last.to == Status.SLEEPING else None
    return row(store, shown, alive=alive, global_hook=store.ws.global_hook_file.exists())


def row(store: StateStore, s: dict[str, Any], *, alive: bool | None, global_hook: bool) -> dict[str, Any]:
    """What `status` shows of a loop, from its summary (kiro.store.journal.summary_of: `status` reads the
    summary the loop writes beside its state; `sleeping_because` added for a sleeping loop)."""
    recorded = Status(s["status"])
    if alive is None:
        alive = store.is_locked(s["task_id"]) if recorded.may_be_alive else False
    status = recorded.shown(alive)
    metrics = s["metrics"]
    duration = metrics["total_duration_seconds"]
    if alive and status.is_active:
        duration += max(0.0, (timeutil.now() - timeutil.parse(s["updated_at"])).total_seconds())
    cur = s["current_step"]
    if cur is not None and cur.get("status") == "completed":
        cur = None  # between steps (paused after one, say): no step is current; the next is not known here
    eta = None
    if status.is_active:  # a paused or stopped loop is not getting anywhere: no time to finish
        total, done, avg = s["steps_total"], s["steps_done"], metrics["average_step_duration"]
        if total is not None and done is not None and avg and total - done > 0:
            eta = timeutil.human_duration((total - done) * avg)
    sleep = ({"sleeping_because": s.get("sleeping_because"), "sleep_until": s["sleep_until"],
              "sleep_note": s.get("sleep_note")} if status == Status.SLEEPING else {})
    return {
        "task_id": s["task_id"],
        "task_path": s["task_path"],
        "title": s["title"],
        "status": str(status),
        "recorded_status": str(recorded),
        "stop_reason": s["stop_reason"],
        "iteration": s["iteration"],
        "max_iterations": s["max_iterations"],
        "success_rate": success_rate(s["total_successes"], s["total_failures"]),
        "current_step": f"{cur['step_id']} {cur['description']}" if cur else None,
        "current_step_id": cur["step_id"] if cur else None,
        "steps_done": s["steps_done"],
        "steps_total": s["steps_total"],
        "consecutive_failures": s["consecutive_failures"],
        "failure_threshold": s["failure_threshold"],
        "total_failures": s["total_failures"],
        "duration_seconds": round(duration, 3),
        "duration": timeutil.human_duration(duration),
        "eta": eta,
        "executor": s["executor"],
        "billing": s.get("billing"),  # the credential the loop's agent CLI bills (kept by every resume)
        "pid": s["pid"] if alive else None,
        "alive": alive,
        "updated_at": s["updated_at"],
        "usage": s["usage"],
        "cost": cost(s["usage"]),
        # why the last run ended, one line (the error, with the attempt's log path whole): not while it
        # runs, and not for a completed loop (its steps are done)
        "cause": s.get("stop_message") if not (status.is_active or status == Status.COMPLETED) else None,
        "reads_messages": reads_messages(s["executor"]),
        "report_path": s["report_path"],
        **_schedule_fields(s),
        **sleep,
        "hint": _hint(s["task_id"], s["max_iterations"], status, global_hook=global_hook,
                      stop_reason=s.get("stop_reason"), timeout=s.get("timeout_seconds")),
    }


def cost(usage: dict[str, Any] | None) -> str | None:
    """The cost so far as a person reads it (`$0.0123`), or None when the executor reports no cost."""
    spent = (usage or {}).get("cost_usd") or 0.0
    return dollars(spent) if spent else None


def schedule_fields(state: LoopState) -> dict[str, Any]:
    """A recurring task's schedule, runs and next run (SPEC §11); {} for a plain loop."""
    from kiro.store.state import to_jsonable

    return _schedule_fields(journal.summary_of(to_jsonable(state)))


def _schedule_fields(s: dict[str, Any]) -> dict[str, Any]:
    sc = s["schedule"]
    if sc is None:
        return {}
    next_run = None
    if s["next_run_at"] and s["status"] != Status.COMPLETED:
        at = timeutil.parse(s["next_run_at"])
        left = (at - timeutil.now()).total_seconds()
        when = at.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
        next_run = f"in {timeutil.human_duration(left)} ({when})" if left > 0 else f"due now ({when})"
    return {"schedule": sc["expression"], "stateful": sc["stateful"], "runs": s["runs"],
            "last_run_at": s["last_run_at"], "next_run_at": s["next_run_at"], "next_run": next_run}


def _summary(path: Path, task_id: str) -> dict[str, Any] | None:
    """The summary the loop wrote beside its state file, when it has all a row needs; None: read the
    state (no summary, torn on every try, or a sleeping loop, whose reason is in its history)."""
    s = journal.read_summary(path)
    if s is None or s.get("task_id") != task_id or s.get("status") not in RECORDED or s["status"] == Status.SLEEPING:
        return None
    if not all(k in s for k in (*journal.SUMMARY_FIELDS, "current_step") if k not in LATER_FIELDS):
        return None  # written by another version of kiro
    if not (isinstance(s["metrics"], dict) and isinstance(s["usage"], dict) and isinstance(s["updated_at"], str)
            and (s["current_step"] is None or isinstance(s["current_step"], dict))):
        return None
    return s


def all_rows(store: StateStore, warnings: list[str] | None = None) -> list[dict[str, Any]]:
    """A row per loop, newest first, each from the loop's summary (or its state when the summary will
    not do). An unreadable state file is shown from its newest good backup, as `status --task-id`
    does, and `warnings` gets a line saying so (or that it cannot be read at all), so a corrupt loop
    never silently drops out of the table."""
    global_hook = store.ws.global_hook_file.exists()
    rows = []
    for tid, path in store.state_files():
        summary = _summary(path, tid)
        if summary is not None:
            rows.append(row(store, summary, alive=None, global_hook=global_hook))
            continue
        try:
            loaded = store.load(tid)
        except KiroError as exc:
            if warnings is not None:
                warnings.append(str(exc))
            continue
        if loaded.warning and warnings is not None:
            warnings.append(loaded.warning)
        rows.append(loop_row(store, loaded.state))
    rows.sort(key=lambda r: r["updated_at"], reverse=True)
    return rows


def progress(ws: Workspace, state: LoopState) -> dict[str, Any]:
    """Every step of the task file with its status, attempts and duration."""
    from kiro.store import tasks

    path = ws.absolute(state.task_path)
    where, found = locate_task(ws, path, state.task_id)
    task: tasks.TaskFile | None = None
    error = None
    if found is not None:
        try:
            task = tasks.load(found)
        except KiroError as exc:
            error = str(exc)
    else:
        error = f"task file {state.task_path} not found"
    durations: dict[str, float] = {}
    completed_attempts: dict[str, int] = {}  # the engine zeroes a step's attempt count when it succeeds
    checkpoints: dict[str, str | None] = {}  # SPEC §9: each done step's commit, or why there is none
    agents: dict[str, str | None] = {}  # the agent CLI that did each done step (fallback_agents)
    receipts: dict[str, dict[str, Any]] = {}  # SPEC §14: each done step's receipt
    for c in state.completed_steps:
        if c.receipt is not None:
            receipts[c.step_id] = c.receipt.model_dump(mode="json", exclude_none=True)
        durations[c.step_id] = c.duration_seconds
        completed_attempts[c.step_id] = c.attempts
        checkpoints[c.step_id] = c.checkpoint or (f"({c.checkpoint_note})" if c.checkpoint_note else None)
        agents[c.step_id] = c.agent
    rows: list[dict[str, Any]] = []
    cur = state.current_step
    if task is not None:
        depth: dict[int, int] = {}
        for st in task.steps:
            d = 0 if st.parent is None else depth.get(st.parent, 0) + 1
            depth[st.index] = d
            rec = state.steps.get(st.id)
            if st.done:
                status = "done"
            elif cur is not None and cur.step_id == st.id and cur.status in ("in_progress", "waiting_retry", "failed"):
                status = "in_progress" if cur.status == "in_progress" else "failed"
            elif st.optional:
                status = "optional"
            else:
                status = "todo"
            rows.append({
                "step_id": st.id, "description": st.title or st.text, "status": status, "optional": st.optional,
                "depth": d, "leaf": st.is_leaf,
                "attempts": (rec.attempts if rec and rec.attempts else
                             completed_attempts.get(st.id, 0) if st.done else 0),
                "last_error": rec.last_error if rec else None,
                "duration_seconds": durations.get(st.id),
                "duration": timeutil.human_duration(durations[st.id]) if st.id in durations else None,
                "checkpoint": checkpoints.get(st.id) if st.done else None,
                "agent": agents.get(st.id) if st.done else None,
                "receipt": receipts.get(st.id) if st.done else None,
            })
    done = sum(1 for r in rows if r["status"] == "done")
    git = state.git
    branch = git.branch if git is not None and git.checkpoints else None
    sleeping = state.status == Status.SLEEPING
    last = state.history[-1] if state.history else None
    sleep = {"status": str(state.status),
             "sleeping_because": last.reason if sleeping and last is not None else None,
             "sleep_until": state.sleep_until if sleeping else None,
             "sleep_note": state.sleep_note if sleeping else None}
    return {"task_id": state.task_id, "task_path": state.task_path, "title": state.title or state.task_path,
            "steps_done": done, "steps_total": len(rows), "steps": rows, "error": error, "branch": branch,
            **sleep, **schedule_fields(state)}



def receipts(state: LoopState, step_id: str | None = None) -> list[dict[str, Any]]:
    """The receipts of the loop's completed steps (SPEC §14), oldest first; of one step with `step_id` (its
    latest). A completed step kiro recorded without one (before receipts existed) is listed with `receipt`
    null. A step that is not done raises a UserError naming the steps that have receipts."""
    out: list[dict[str, Any]] = [{"step_id": c.step_id, "description": c.description,
            "receipt": c.receipt.model_dump(mode="json", exclude_none=True) if c.receipt is not None else None}
           for c in state.completed_steps]
    if step_id is None:
        return out
    mine = [r for r in out if r["step_id"] == step_id]
    if not mine:
        done = ", ".join(dict.fromkeys(str(r["step_id"]) for r in out)) or "none yet"
        raise UserError(f"--step {step_id!r}: loop {state.task_id} has no completed step {step_id!r} "
                        f"(completed: {done})")
    return mine[-1:]


def receipt_text(entry: dict[str, Any]) -> str:
    """One receipt as a person reads it in a terminal or a report."""
    r = entry.get("receipt")
    head = f"step {entry['step_id']}: {entry['description']}"
    if r is None:
        return f"{head}\n  no receipt (recorded before kiro kept receipts)"
    lines = [head]
    who = " ".join(x for x in (r.get("agent") or r.get("executor") or "", f"({r['model']})" if r.get("model") else "")
                   if x)
    lines.append(f"  by {who or '-'}, {r.get('attempts', 1)} attempt(s), {r.get('started_at') or '?'} -> "
                 f"{r.get('finished_at')} ({timeutil.human_duration(r.get('duration_seconds') or 0.0)})"
                 + ("; counted after a restart" if r.get("recovered") else ""))
    if r.get("total_tokens") or r.get("cost_usd"):
        lines.append(f"  tokens {r.get('total_tokens', 0)} (prompt {r.get('prompt_tokens', 0)}, completion "
                     f"{r.get('completion_tokens', 0)}), cost {dollars(r.get('cost_usd', 0))}")
    v = r.get("verify")
    if v is None:
        lines.append("  verify: none set")
    else:
        tests = v.get("tests")
        counts = ", ".join(f"{n} {k}" for k, n in tests.items() if n) if tests else None
        lines.append(f"  verify `{v['command']}` exit {v.get('exit_code')}" + (f"; tests: {counts or '0'}" if tests
                                                                               is not None else ""))
        tail_lines = [ln for ln in (v.get("output_tail") or "").splitlines() if ln.strip()][-3:]
        lines += [f"    | {ln}" for ln in tail_lines]
    commit = r.get("checkpoint")
    lines.append(f"  checkpoint {commit[:12]}" if commit else f"  checkpoint: {r.get('checkpoint_note') or 'none'}")
    for ln in (r.get("diff_stat") or "").splitlines()[-6:]:
        lines.append(f"    {ln.strip()}")
    p = r.get("protected")
    if p is not None:
        lines.append(f"  protected paths ({', '.join(p.get('globs', []))}): "
                     + ("untouched" if p.get("ok", True) else "changed: " + "; ".join(p.get("changed", [])))
                     + (f"; approved: {', '.join(p['approved'])}" if p.get("approved") else ""))
    for rv in r.get("reviews") or []:
        used = f", {rv['total_tokens']} tokens" if rv.get("total_tokens") else ""
        lines.append(f"  review round {rv.get('round')} by {rv.get('agent') or '-'}: {rv.get('verdict')}"
                     + (f": {rv['reasons'].strip().splitlines()[0][:300]}" if rv.get("reasons") else "")
                     + f" ({rv.get('seconds', 0):.1f} s{used})")
    return "\n".join(lines)
