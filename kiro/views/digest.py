"""The digest (SPEC §14): one page a person reads in the morning, `Logs/digest/<date>.md`.

It is built from what kiro already keeps, nothing else: the state files (each completed step and its
receipt), the event logs (failures, usage limits, loops that ended) and the files waiting in
`Needs_Action/` and `Pending_Approval/`. Its figures are `kiro loop stats` over the digest's period
(kiro.views.stats, `since`/`until`), so the two always agree.

A digest's date names its period. Without `digest_at`, the local calendar day. With `digest_at: "07:00"`, the
24 hours that end at 07:00 on that date: the digest dated 2026-11-29 covers 2026-11-28 07:00 to 2026-11-29
07:00, and is the one read that morning (a loop that ends at 14:00 on the 28th updates the 29th's).

- `period`, `day_of`, `next_time`   the clock of the above
- `compute`                         the digest as JSON-like data (`kiro loop digest --json`, `/api/digest`)
- `render`                          the markdown (the file, `kiro loop digest`, the dashboard page)

This module writes nothing: kiro.core.digest writes the file (through the loop's redactor) and sends it.
"""

from __future__ import annotations

import contextlib
from datetime import date, datetime, time, timedelta
from pathlib import Path
from typing import Any

from kiro import timeutil
from kiro.errors import UserError
from kiro.store.approval import PENDING
from kiro.store.state import Context, LoopState
from kiro.store.statestore import StateStore
from kiro.store.workspace import Workspace, markdown_files
from kiro.views import stats

FOLDER = "digest"  # under Logs/
LISTED = 50  # at most this many failures (the latest) and usage limits are listed; the counts are whole


def parse_date(text: str) -> date:
    try:
        return date.fromisoformat(text.strip())
    except ValueError:
        raise UserError(f"--date {text!r}: use a date like 2026-11-28") from None


def _at(digest_at: str | None) -> time | None:
    if digest_at is None:
        return None
    hh, mm = digest_at.split(":")
    return time(int(hh), int(mm))


def period(day: date, digest_at: str | None) -> tuple[datetime, datetime]:
    """[start, end) of the digest dated `day`, aware datetimes in local time."""
    at = _at(digest_at)
    if at is None:
        start = datetime.combine(day, time()).astimezone()
        return start, datetime.combine(day + timedelta(days=1), time()).astimezone()
    end = datetime.combine(day, at).astimezone()
    return datetime.combine(day - timedelta(days=1), at).astimezone(), end


def day_of(moment: datetime, digest_at: str | None) -> date:
    """The date of the digest whose period holds `moment`."""
    local = moment.astimezone()
    at = _at(digest_at)
    if at is None or local.time().replace(tzinfo=None) < at:
        return local.date()
    return local.date() + timedelta(days=1)


def next_time(after: datetime, digest_at: str) -> datetime:
    """The first `digest_at` (local time) later than `after`."""
    local = after.astimezone()
    at = _at(digest_at)
    assert at is not None
    candidate = datetime.combine(local.date(), at).astimezone()
    return candidate if candidate > local else datetime.combine(local.date() + timedelta(days=1), at).astimezone()


def path(ws: Workspace, day: date) -> Path:
    return ws.logs / FOLDER / f"{day.isoformat()}.md"


def _in(when: str | None, start: datetime, end: datetime) -> bool:
    if not when:
        return False
    try:
        moment = timeutil.parse(when)
    except ValueError:
        return False
    return start <= moment < end


def compute(store: StateStore, day: date, digest_at: str | None, *, now: datetime | None = None) -> dict[str, Any]:
    """The digest dated `day`: what was done (each step with its receipt's figures), what waits for a person,
    cost and tokens by agent, time slept on usage limits, failures with their causes, loops that ended."""
    ws = store.ws
    start, end = period(day, digest_at)
    failures: list[dict[str, Any]] = []
    limits: list[dict[str, Any]] = []
    ended: list[dict[str, Any]] = []

    def note(e: dict[str, Any]) -> None:  # an event of the period, as stats counts it (one read of each log)
        kind = e.get("event")
        base = {"ts": e.get("ts"), "task_id": e.get("task_id")}
        if kind == "step_failed":
            failures.append({**base, "what": f"step {e.get('step_id')} attempt {e.get('attempt')}",
                             "cause": str(e.get("error") or ""), "log": e.get("log")})
        elif kind == "notifier_failed":
            failures.append({**base, "what": f"notifier ({e.get('kind')})", "cause": str(e.get("error") or ""),
                             "log": None})
        elif kind == "usage_limit":
            limits.append({**base, "agent": e.get("agent"), "step_id": e.get("step_id"),
                           "resets_at": e.get("resets_at"), "fallback": e.get("fallback")})
        elif kind == "loop_finished":
            ended.append({**base, "status": e.get("status"), "reason": e.get("reason"),
                          "message": str(e.get("message") or ""), "report": e.get("report")})
            if e.get("status") in ("failed", "timed_out", "max_iterations"):
                failures.append({**base, "what": f"loop {e.get('status')} ({e.get('reason')})",
                                 "cause": str(e.get("message") or ""), "log": e.get("report")})

    done: list[dict[str, Any]] = []

    def take(st: LoopState) -> None:  # each state as it is read: its steps of the period, then only what stats reads
        for c in st.completed_steps:
            if not _in(c.completed_at, start, end):
                continue
            r = c.receipt
            done.append({
                "task_id": st.task_id, "task_path": st.task_path, "step_id": c.step_id, "title": c.description,
                "completed_at": c.completed_at, "by": (r.agent or r.executor) if r else c.agent,
                "attempts": r.attempts if r else c.attempts,
                "seconds": round(r.duration_seconds if r else c.duration_seconds, 3),
                "tokens": r.total_tokens if r else 0, "cost_usd": r.cost_usd if r else 0.0,
                "verify_exit_code": r.verify.exit_code if r and r.verify else None,
                "tests": r.verify.tests.describe() if r and r.verify and r.verify.tests else None,
                "checkpoint": (r.checkpoint if r else c.checkpoint),
                "receipt": f"kiro loop receipt --task-id {st.task_id} --step {c.step_id}" if r else None,
            })
        # a thousand loops ending together: their whole states at once were the run's peak (issue #41)
        st.completed_steps, st.steps, st.context, st.parallel, st.failed_steps = [], {}, Context(), [], []

    states = store.all_states(each=take)  # a tie in the sort below is within one state: the order is as before
    figures = stats.compute(store, since=start, until=end, states=states, each_event=note)
    for items in (failures, limits, ended):
        items.sort(key=lambda x: str(x["ts"]))
    done.sort(key=lambda d: (d["completed_at"], d["task_id"]))

    waiting: list[dict[str, Any]] = []
    for folder in (ws.needs_action, ws.root / PENDING):
        for f in markdown_files(folder) if folder.is_dir() else []:
            with contextlib.suppress(OSError):
                waiting.append({"path": ws.relative(f), "since": timeutil.iso(
                    datetime.fromtimestamp(f.stat().st_mtime).astimezone())})
    waiting.sort(key=lambda w: w["since"])

    return {
        "date": day.isoformat(), "digest_at": digest_at, "workspace": str(ws.root),
        "from": start.isoformat(timespec="minutes"), "to": end.isoformat(timespec="minutes"),
        "written_at": timeutil.iso(now),
        "done": done, "waiting": waiting,
        "usage": figures["usage"], "by_agent": figures["by_agent"],
        "slept_on_usage_limits_seconds": figures["waiting_seconds"]["usage_limits"],
        "waiting_seconds": figures["waiting_seconds"],
        "usage_limits": {"count": len(limits), "latest": limits[-LISTED:]},
        "failures": {"count": len(failures), "latest": failures[-LISTED:]},
        "loops_ended": ended,
        "steps": figures["steps"],
    }


def _cell(text: Any) -> str:
    """Text in one table cell or list item: one line, no pipe."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _clip(text: str, width: int = 300) -> str:
    text = _cell(text)
    return text if len(text) <= width else text[: width - 3] + "..."


def _when(ts: Any) -> str:
    """An event's time as a person reads it here: local, to the minute."""
    try:
        return timeutil.parse(str(ts)).astimezone().strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return str(ts)[:16]


def _link(rel: str) -> str:
    """A workspace-relative path as a link from Logs/digest/."""
    return f"[{rel}](../../{rel.replace(' ', '%20')})"


def render(d: dict[str, Any]) -> str:
    """The digest as markdown: a summary, then one section each."""
    u, steps = d["usage"], d["steps"]
    slept = d["slept_on_usage_limits_seconds"]
    out = [f"# kiro digest {d['date']}", "",
           f"Workspace `{d['workspace']}`, from {_when(d['from'])} to "
           f"{_when(d['to'])} (local time); written {_when(d['written_at'])}.", "",
           "## In short", "",
           f"- {len(d['done'])} steps done ({steps['attempts']} attempts, {steps['failed']} failed)",
           f"- {len(d['waiting'])} files wait for a person",
           f"- {u['total_tokens']} tokens, ${u['cost_usd']:.4f}",
           f"- {timeutil.human_duration(slept)} slept on usage limits ({d['usage_limits']['count']} limits hit)",
           f"- {d['failures']['count']} failures", "",
           "## Done", ""]
    if d["done"]:
        out += ["| loop | step | title | by | attempts | time | tokens | cost | verify | receipt |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for s in d["done"]:
            verify = "-" if s["verify_exit_code"] is None else f"exit {s['verify_exit_code']}" + (
                f", {s['tests']}" if s["tests"] else "")
            receipt = f"`{s['receipt']}`" if s["receipt"] else "-"
            out.append(f"| {_cell(s['task_id'])} | {_cell(s['step_id'])} | {_clip(s['title'], 80)} | "
                       f"{_cell(s['by'] or '-')} | {s['attempts']} | {timeutil.human_duration(s['seconds'])} | "
                       f"{s['tokens']} | ${s['cost_usd']:.4f} | {verify} | {receipt} |")
    else:
        out.append("No step was done in this period.")
    out += ["", "## Waiting for you", ""]
    out += [f"- {_link(w['path'])} (since {_when(w['since'])})" for w in d["waiting"]] or [
        "Nothing waits in Needs_Action/ or Pending_Approval/."]
    out += ["", "## Cost and tokens by agent", ""]
    if d["by_agent"]:
        out += ["| agent | runs | completed | reviews | at usage limit | prompt tokens | completion tokens | cost |",
                "|---|---|---|---|---|---|---|---|"]
        out += [f"| {_cell(name)} | {a['runs']} | {a['completed']} | {a.get('reviews', 0)} | {a['usage_limits']} | "
                f"{a['prompt_tokens']} | {a['completion_tokens']} | ${a['cost_usd']:.4f} |"
                for name, a in d["by_agent"].items()]
        out.append("")
    else:
        out += ["No agent CLI ran in this period.", ""]
    out.append(f"Loops active in this period, their totals: {u['total_tokens']} tokens ({u['prompt_tokens']} prompt, "
               f"{u['completion_tokens']} completion), {u['api_calls']} API calls, ${u['cost_usd']:.4f}.")
    out += ["", "## Time slept on usage limits", "",
            f"{timeutil.human_duration(slept)} in all."]
    for lim in d["usage_limits"]["latest"]:
        resets = f", resets {lim['resets_at']}" if lim["resets_at"] else ""
        to = f", handed to {lim['fallback']}" if lim["fallback"] else ""
        out.append(f"- {_when(lim['ts'])} {_cell(lim['agent'])} (loop {_cell(lim['task_id'])}, "
                   f"step {_cell(lim['step_id'])}){resets}{to}")
    out += ["", "## Failures", ""]
    if d["failures"]["latest"]:
        more = d["failures"]["count"] - len(d["failures"]["latest"])
        if more:
            out.append(f"The latest {len(d['failures']['latest'])} of {d['failures']['count']}:")
        for f in d["failures"]["latest"]:
            log = f" ({_link(f['log'])})" if f["log"] else ""
            out.append(f"- {_when(f['ts'])} loop {_cell(f['task_id'])}, {_cell(f['what'])}: "
                       f"{_clip(f['cause'])}{log}")
    else:
        out.append("None.")
    out += ["", "## Loops that ended", ""]
    out += [f"- {_when(e['ts'])} loop {_cell(e['task_id'])}: {e['status']} ({e['reason']})"
            + (f", report {_link(e['report'])}" if e["report"] else "") for e in d["loops_ended"]] or ["None."]
    return "\n".join(out) + "\n"
