"""`kiro loop stats`: analytics across every loop of the workspace (SPEC §10, seed 004's "loop
analytics"), computed from the state files and the event logs, nothing else.

- loops and runs (a run is one process working on a loop: `loop_started` or `loop_resumed`), loops by status;
- steps: attempts, completed, failed, retries (attempts after a step's first), verify failures, success rate
  (kiro.status.success_rate: completed over completed or failed, as `status` shows it);
- step durations (`step_completed.duration_seconds`): p50, p95, mean, max;
- usage: tokens, API calls and cost from the states, per completed step; and the spread of tokens per
  completed step (p50/p95) from the model calls logged while it ran (every attempt counts);
- time spent waiting (`wait_ended`: what was slept, not what was planned): backoff, budgets (token/cost budgets),
  active hours, rate limits, usage limits, other guardrail waits;
- stop reasons (`loop_finished`: status and reason).

`since` keeps events at or after that time, and the states of loops updated since then (usage is a
loop's running total: a loop active in the window counts whole); `until` (the digest's day,
kiro.views.digest) keeps events before that time, and the states of loops that began before it. The digest
reads the states and the logs once, through `compute`: it passes the states it read and is handed every event
of the window (`each_event`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from kiro import timeutil
from kiro.errors import UserError
from kiro.status import StopReason, percent, success_rate
from kiro.store.logread import read_events, read_since
from kiro.store.state import LoopState, effective_status
from kiro.store.statestore import StateStore
from kiro.usage import Usage, dollars


def parse_since(text: str) -> datetime:
    """`2026-11-22` (midnight, local time) or an ISO 8601 time; a bad one is the person's mistake."""
    try:
        dt = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UserError(f"--since {text!r}: use a date (2026-11-22) or an ISO 8601 time (2026-11-22T09:00)") from None
    return dt if dt.tzinfo else dt.astimezone()


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return round(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo), 3)


def _ts(record: dict[str, Any]) -> datetime | None:
    raw = record.get("ts")
    if not isinstance(raw, str):
        return None
    try:
        return timeutil.parse(raw)
    except ValueError:
        return None


def compute(store: StateStore, since: datetime | None = None, until: datetime | None = None, *,
            states: list[tuple[Path, LoopState | None]] | None = None,
            each_event: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The figures; `states`: `store.all_states()` when the caller has read them already; `each_event` is
    handed every event of the window, in each log's order, as it is counted."""
    ws = store.ws
    by_status: Counter[str] = Counter()
    total = Usage()
    loops = 0
    iterations = 0
    counted: list[LoopState] = []
    for _path, st in store.all_states() if states is None else states:
        if st is None:
            continue
        if since is not None and timeutil.parse(st.updated_at) < since:
            continue
        if until is not None and st.started_at and timeutil.parse(st.started_at) >= until:
            continue
        counted.append(st)
    alive = store.locked(st.task_id for st in counted if st.status.may_be_alive)  # one reading of the lock table
    for st in counted:
        loops += 1
        iterations += st.iteration
        by_status[str(effective_status(st, st.task_id in alive))] += 1
        total.add(st.usage)

    runs = attempts = completed = failed = retries = verify_failed = 0
    durations: list[float] = []
    waits: dict[str, float] = {}
    stops: Counter[str] = Counter()
    logs = sorted(ws.logs.glob("*.jsonl")) if ws.logs.is_dir() else []
    step_tokens: list[int] = []  # per completed step, from model_called events since its first attempt
    # agent CLI -> step runs, completed, reviews, usage limits, tokens, cost (agent_ran)
    by_agent: dict[str, dict[str, Any]] = {}
    for log in logs:
        current: dict[str, int] = {}  # step id -> tokens spent on it so far (all attempts)
        step_of: str | None = None
        for e in read_events(Path(log)) if since is None else read_since(Path(log), since):
            if since is not None or until is not None:
                when = _ts(e)
                if when is None or (since is not None and when < since) or (until is not None and when >= until):
                    continue
            if each_event is not None:
                each_event(e)
            kind = e.get("event")
            if kind in ("loop_started", "loop_resumed"):
                runs += 1
            elif kind == "model_called":
                if step_of is not None:
                    used = sum(int(e.get(k) or 0) for k in ("prompt_tokens", "completion_tokens")
                               if isinstance(e.get(k), int))
                    current[step_of] = current.get(step_of, 0) + used
            elif kind == "step_started":
                step_of = str(e.get("step_id"))
                attempts += 1
                if isinstance(e.get("attempt"), int) and e["attempt"] > 1:
                    retries += 1
            elif kind == "step_completed":
                completed += 1
                if str(e.get("step_id")) in current:
                    step_tokens.append(current.pop(str(e.get("step_id"))))
                if isinstance(e.get("duration_seconds"), int | float):
                    durations.append(float(e["duration_seconds"]))
            elif kind == "step_failed":
                failed += 1
            elif kind == "agent_ran" and isinstance(e.get("agent"), str):
                row = by_agent.setdefault(e["agent"], {"runs": 0, "completed": 0, "reviews": 0, "usage_limits": 0,
                                                       "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0})
                if e.get("review") is True:  # a reviewer's run (kiro.core.review), not a step's
                    row["reviews"] += 1
                else:
                    row["runs"] += 1
                    row["completed"] += e.get("outcome") == "completed"
                row["usage_limits"] += e.get("outcome") == "usage_limit"
                for key in ("prompt_tokens", "completion_tokens"):
                    row[key] += int(e.get(key) or 0) if isinstance(e.get(key), int) else 0
                row["cost_usd"] = round(row["cost_usd"] + (float(e.get("cost_usd") or 0.0)
                                                           if isinstance(e.get("cost_usd"), int | float) else 0.0), 6)
            elif kind == "verify_failed":
                verify_failed += 1
            elif kind == "wait_ended" and isinstance(e.get("seconds"), int | float):  # the time really slept
                reason = StopReason.of(str(e.get("limit")))  # its stats bucket: the line of "Time spent waiting"
                key = reason.bucket if reason is not None else "other"
                waits[key] = waits.get(key, 0.0) + float(e["seconds"])
            elif kind == "loop_finished":
                stops[f"{e.get('status')}: {e.get('reason')}"] += 1
    per_step = completed or None
    usage = total.model_dump()
    waiting = {k: round(waits.get(k, 0.0), 3)
               for k in ("backoff", "budgets", "hours", "rate_limits", "usage_limits", "other")}
    waiting["total"] = round(sum(waits.values()), 3)
    return {
        "since": since.isoformat() if since else None,
        "workspace": str(ws.root),
        "loops": loops,
        "runs": runs,
        "iterations": iterations,
        "by_status": dict(sorted(by_status.items())),
        "steps": {
            "attempts": attempts, "completed": completed, "failed": failed, "retries": retries,
            "verify_failed": verify_failed,
            "success_rate": success_rate(completed, failed),
        },
        "step_seconds": {
            "count": len(durations), "p50": percentile(durations, 0.5), "p95": percentile(durations, 0.95),
            "mean": round(sum(durations) / len(durations), 3) if durations else None,
            "max": round(max(durations), 3) if durations else None,
        },
        "usage": {
            **usage,
            "tokens_per_step": round(total.total_tokens / per_step, 1) if per_step else None,
            "tokens_per_step_p50": percentile([float(t) for t in step_tokens], 0.5),
            "tokens_per_step_p95": percentile([float(t) for t in step_tokens], 0.95),
            "cost_per_step_usd": round(total.cost_usd / per_step, 6) if per_step else None,
        },
        "by_agent": dict(sorted(by_agent.items())),
        "waiting_seconds": waiting,
        "stop_reasons": dict(stops.most_common()),
    }


def _num(x: Any, unit: str = "") -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.2f}{unit}" if x < 100 else f"{x:.0f}{unit}"
    return f"{x}{unit}"


def render(s: dict[str, Any]) -> str:
    """The human-readable view: aligned `label  value` lines in sections."""
    steps, secs, u, w = s["steps"], s["step_seconds"], s["usage"], s["waiting_seconds"]
    rate = percent(steps["success_rate"])
    status = ", ".join(f"{k} {v}" for k, v in s["by_status"].items()) or "-"
    sections: list[tuple[str, list[tuple[str, str]]]] = [
        ("Loops" + (f" since {s['since']}" if s["since"] else ""), [
            ("loops", str(s["loops"])), ("runs", str(s["runs"])), ("iterations", str(s["iterations"])),
            ("by status", status)]),
        ("Steps", [
            ("attempts", str(steps["attempts"])), ("completed", str(steps["completed"])),
            ("failed", str(steps["failed"])), ("retries", str(steps["retries"])),
            ("verify failed", str(steps["verify_failed"])), ("success rate", rate)]),
        ("Step duration", [
            ("p50", timeutil.human_duration(secs["p50"])), ("p95", timeutil.human_duration(secs["p95"])),
            ("mean", timeutil.human_duration(secs["mean"])), ("max", timeutil.human_duration(secs["max"]))]),
        ("Usage", [
            ("tokens", f"{u['total_tokens']} ({u['prompt_tokens']} prompt, {u['completion_tokens']} completion)"),
            ("API calls", str(u["api_calls"])), ("cost", dollars(u['cost_usd'])),
            ("tokens per step", ("-" if u["tokens_per_step"] is None else f"{u['tokens_per_step']:.0f}") + (
                "" if u["tokens_per_step_p50"] is None else
                f" (p50 {u['tokens_per_step_p50']:.0f}, p95 {u['tokens_per_step_p95']:.0f})")),
            ("cost per step", dollars(u["cost_per_step_usd"]))]),
        ("Time spent waiting", [(k.replace("_", " "), timeutil.human_duration(v)) for k, v in w.items()]),
        ("By agent", [(name, f"{a['runs']} runs ({a['completed']} completed, {a['usage_limits']} at the usage limit), "
                             + (f"{a['reviews']} reviews, " if a.get("reviews") else "")
                             + f"{a['prompt_tokens'] + a['completion_tokens']} tokens, {dollars(a['cost_usd'])}")
                      for name, a in s.get("by_agent", {}).items()] or [("-", "")]),
        ("Stop reasons", [(k, str(v)) for k, v in s["stop_reasons"].items()] or [("-", "")]),
    ]
    out: list[str] = []
    for title, rows in sections:
        out.append(title)
        width = max(len(k) for k, _ in rows)
        out += [f"  {k.ljust(width)}  {v}".rstrip() for k, v in rows]
        out.append("")
    return "\n".join(out).rstrip() + "\n"
