"""What the read commands show, as plain data (the CLI renders it, `--json` prints it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiro import timeutil
from kiro.errors import KiroError, TaskNotFound, UserError
from kiro.state import LoopState, StateStore, effective_status
from kiro.status import Status
from kiro.workspace import Workspace, check_task_id, frontmatter_task_id, locate_task


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

            hint = frontmatter_task_id(path)
            if hint and store.exists(hint):
                return hint
            raise TaskNotFound(f"no loop has worked on {rel} yet; start one with `kiro loop start --task {rel}`")
        return found[0].task_id  # newest first
    if not required:
        return None
    ids = [_task_id_of(p) for p, _st in store.all_states()]  # unreadable ones too: load() falls back
    if len(ids) == 1:
        return ids[0]
    if not ids:
        raise TaskNotFound(f"no loops in {ws.root}; start one with `kiro loop start --task PATH`")
    raise UserError(f"{len(ids)} loops in this workspace: name one with --task-id "
                    f"(`kiro loop status` lists them)")


def _eta(state: LoopState) -> str | None:
    if state.steps_total is None or state.steps_done is None or not state.metrics.average_step_duration:
        return None
    left = state.steps_total - state.steps_done
    if left <= 0:
        return None
    return timeutil.human_duration(left * state.metrics.average_step_duration)


def hint(state: LoopState, status: Status | str) -> str | None:
    """The command that continues a loop shown with `status`, with the limit to raise if any."""
    status = Status(status)
    command = f"kiro loop resume --task-id {state.task_id}"
    if status.is_resumable:
        return command
    flag = status.resume_flag
    return f"{command} {flag.format(more=state.max_iterations * 2)}" if flag else None


def loop_row(store: StateStore, state: LoopState, *, alive: bool | None = None) -> dict[str, Any]:
    if alive is None:
        alive = store.is_locked(state.task_id) if state.status.may_be_alive else False
    status = effective_status(state, alive)
    duration = state.metrics.total_duration_seconds
    if alive and status.is_active:
        duration += max(0.0, (timeutil.now() - timeutil.parse(state.updated_at)).total_seconds())
    cur = state.current_step
    return {
        "task_id": state.task_id,
        "task_path": state.task_path,
        "title": state.title,
        "status": str(status),
        "recorded_status": str(state.status),
        "stop_reason": state.stop_reason,
        "iteration": state.iteration,
        "max_iterations": state.max_iterations,
        "success_rate": state.metrics.success_rate,
        "current_step": f"{cur.step_id} {cur.description}" if cur else None,
        "current_step_id": cur.step_id if cur else None,
        "steps_done": state.steps_done,
        "steps_total": state.steps_total,
        "consecutive_failures": state.consecutive_failures,
        "failure_threshold": state.failure_threshold,
        "total_failures": state.total_failures,
        "duration_seconds": round(duration, 3),
        "duration": timeutil.human_duration(duration),
        "eta": _eta(state) if status.is_active or status in (Status.PAUSED, Status.INTERRUPTED) else None,
        "executor": state.executor,
        "pid": state.pid if alive else None,
        "alive": alive,
        "updated_at": state.updated_at,
        "usage": state.usage.model_dump(),
        "report_path": state.report_path,
        **schedule_fields(state),
        **sleep_fields(state, status),
        "hint": ("kiro loop resume --all" if status.is_resumable and store.ws.global_hook_file.exists()
                 else hint(state, status)),  # `resume --task-id` refuses while the global hook holds
    }


def sleep_fields(state: LoopState, status: Status) -> dict[str, Any]:
    """Why a sleeping loop sleeps (the guardrail or wait that put it to sleep: a limit such as
    `max_cpu_percent`, `backoff`, `precheck_skipped`, `schedule`) and until when; {} otherwise."""
    if status != Status.SLEEPING:
        return {}
    last = state.history[-1] if state.history else None
    reason = last.reason if last is not None and last.to == Status.SLEEPING else None
    return {"sleeping_because": reason, "sleep_until": state.sleep_until}


def schedule_fields(state: LoopState) -> dict[str, Any]:
    """A recurring task's schedule, runs and next run (SPEC §11); {} for a plain loop."""
    sc = state.schedule
    if sc is None:
        return {}
    next_run = None
    if state.next_run_at and state.status != Status.COMPLETED:
        left = (timeutil.parse(state.next_run_at) - timeutil.now()).total_seconds()
        when = timeutil.parse(state.next_run_at).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
        next_run = f"in {timeutil.human_duration(left)} ({when})" if left > 0 else f"due now ({when})"
    return {"schedule": sc.expression, "stateful": sc.stateful, "runs": state.runs,
            "last_run_at": state.last_run_at, "next_run_at": state.next_run_at, "next_run": next_run}


def _task_id_of(state_file: Path) -> str:
    return state_file.name[len("autonomous_loop_"):-len(".json")]


def all_rows(store: StateStore, warnings: list[str] | None = None) -> list[dict[str, Any]]:
    """A row per loop. An unreadable state file is shown from its newest good backup, as
    `status --task-id` does, and `warnings` gets a line saying so (or that it cannot be read at all),
    so a corrupt loop never silently drops out of the table."""
    rows = []
    for path, st in store.all_states():
        if st is None:
            try:
                loaded = store.load(_task_id_of(path))
            except KiroError as exc:
                if warnings is not None:
                    warnings.append(str(exc))
                continue
            st = loaded.state
            if loaded.warning and warnings is not None:
                warnings.append(loaded.warning)
        rows.append(loop_row(store, st))
    return rows


def progress(ws: Workspace, state: LoopState) -> dict[str, Any]:
    """Every step of the task file with its status, attempts and duration."""
    from kiro import tasks

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
    for c in state.completed_steps:
        durations[c.step_id] = c.duration_seconds
        completed_attempts[c.step_id] = c.attempts
        checkpoints[c.step_id] = c.checkpoint or (f"({c.checkpoint_note})" if c.checkpoint_note else None)
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
            })
    done = sum(1 for r in rows if r["status"] == "done")
    git = state.git
    branch = git.branch if git is not None and git.checkpoints else None
    return {"task_id": state.task_id, "task_path": state.task_path, "title": state.title or state.task_path,
            "steps_done": done, "steps_total": len(rows), "steps": rows, "error": error, "branch": branch,
            **schedule_fields(state)}

