"""Recurring tasks (SPEC §11 "Schedules", seed 001's stateful cron).

A task file whose frontmatter has `schedule:` runs again and again in one loop:

    schedule: "0 9 * * *"          # 5-field cron (local time), or @hourly @daily @weekly @monthly @yearly
    schedule: {cron: "0 9 * * *"}
    schedule: {every: 30m}         # s, m, h or d
    schedule: {every: 1h, active_hours: {start: "09:00", end: "18:00"}}   # runs start only in the window
    stateful: false                # optional; true (the default) carries run summaries forward

This module parses the value (one clear error naming the file and the fix), computes fires, and
holds `ScheduleRunner`, which the engine calls at its narrow hooks: before the first run, at the
end of every run (report, forced summary, wait for the next fire, reset the boxes) and when it
builds the first prompt of a run (earlier runs' memories).

Policy:
- `every`: the first run starts at once, the next one `every` after the previous run started.
  `cron`: the first run waits for the first fire after the loop starts.
- Fires missed while nothing ran (kiro was down, a run took longer than the interval) make one
  catch-up run as soon as kiro can run it, never one per missed fire; the event says how many fires
  it stands for.
- `guardrails.active_hours`: a fire outside the window waits for the window to open (and fires
  meanwhile fold into that one run).
- Per run: `max_iterations` and `timeout_seconds` count from the run's start, the failure counters
  and per-step attempts start at zero. A run that fails ends the loop like any failing loop
  (escalation, exit 5); `kiro loop resume` continues that run.
- Moving the task file to `Done/` ends the schedule (the loop completes); removing the `schedule:`
  key ends it after the current run (the task then completes like any other and moves to Done/).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from kiro import timeutil
from kiro.errors import UserError

if TYPE_CHECKING:
    from kiro.store.tasks import TaskFile

_HH_MM_RE = r"([01][0-9]|2[0-3]):[0-5][0-9]"  # both compiled when a schedule is first read (re's cache)
_EVERY_RE = r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd])\s*"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
ALIASES = ("@hourly", "@daily", "@midnight", "@weekly", "@monthly", "@yearly", "@annually")
MIN_EVERY_SECONDS = 1.0
MAX_EVERY_DAYS = 36500  # 100 years: a next fire is then always a date Python can hold
RECALL_LIMIT = 15  # memories of earlier runs carried into a run's first prompt (seed 001: "10-15")
MISSED_COUNT_CAP = 10_000  # fires counted for the catch-up event; beyond that "10000+"

FIX = ('write a 5-field cron string in quotes (schedule: "0 9 * * *"), or a mapping '
       "(schedule: {every: 30m} or {cron: \"0 9 * * *\"}; units s, m, h, d)")


@dataclass(frozen=True)
class Window:
    """Local times between which a run may start (a window may cross midnight)."""

    start: str
    end: str


@dataclass(frozen=True)
class Schedule:
    kind: Literal["cron", "every"]
    expression: str  # the cron string, or the interval as written ("2s")
    seconds: float | None = None  # for `every`
    stateful: bool = True
    active_hours: Window | None = None  # this task's window for starting runs (else guardrails.active_hours)

    def describe(self) -> str:
        return f"every {self.expression}" if self.kind == "every" else f"cron {self.expression}"

    def next_after(self, t: datetime) -> datetime:
        """The first fire strictly after `t` (an aware datetime; cron in the local time zone)."""
        if self.kind == "every":
            assert self.seconds is not None
            return t + timedelta(seconds=self.seconds)
        local = t.astimezone()
        from croniter import croniter  # only a cron schedule needs it (kiro loop start: ~10 ms less)

        nxt: datetime = croniter(self.expression, local).get_next(datetime)
        return nxt

    def fires_between(self, start: datetime, end: datetime) -> int:
        """How many fires fall in (start, end], capped at MISSED_COUNT_CAP."""
        if self.kind == "every":
            assert self.seconds is not None
            n = int((end - start).total_seconds() // self.seconds)
            return max(0, min(n, MISSED_COUNT_CAP))
        n, t = 0, start
        while n < MISSED_COUNT_CAP:
            t = self.next_after(t)
            if t > end:
                break
            n += 1
        return n


def _where(path: Path | None, label: str | None) -> str:
    return label or (str(path) if path is not None else "the task file")


def parse(value: Any, *, stateful: Any = None, where: str = "the task file") -> Schedule:
    """The `schedule:` (and `stateful:`) frontmatter values as a Schedule, or UserError with one
    line naming the file, the key and the fix."""
    if stateful is None:
        stateful = True
    elif not isinstance(stateful, bool):
        raise UserError(f"{where}: frontmatter key 'stateful' must be true or false, not {stateful!r}")
    if isinstance(value, str):
        return Schedule("cron", _cron(value, where), stateful=stateful)
    if isinstance(value, dict):
        keys = set(value)
        unknown = keys - {"every", "cron", "active_hours"}
        if unknown:
            raise UserError(f"{where}: schedule has unknown key(s) {', '.join(sorted(map(str, unknown)))}; {FIX}")
        if len(keys & {"every", "cron"}) != 1:
            raise UserError(f"{where}: schedule needs exactly one of 'every' or 'cron'; {FIX}")
        window = _window(value["active_hours"], where) if value.get("active_hours") is not None else None
        if "cron" in value:
            if not isinstance(value["cron"], str):
                raise UserError(f"{where}: schedule.cron must be a quoted cron string, not {value['cron']!r}; {FIX}")
            return Schedule("cron", _cron(value["cron"], where), stateful=stateful, active_hours=window)
        every = _every(value["every"], where, stateful)
        return Schedule("every", every.expression, every.seconds, stateful, window)
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise UserError(f"{where}: schedule {value!r} is a number (YAML reads 12:30 as one); {FIX}")
    raise UserError(f"{where}: schedule {value!r} is neither a cron string nor a mapping; {FIX}")


def _window(raw: Any, where: str) -> Window:
    fix = 'write it as {start: "09:00", end: "18:00"} (24-hour local times, in quotes)'
    if not isinstance(raw, dict) or set(raw) != {"start", "end"}:
        raise UserError(f"{where}: schedule.active_hours {raw!r} is not a window; {fix}")
    for key in ("start", "end"):
        if not isinstance(raw[key], str) or not re.fullmatch(_HH_MM_RE, raw[key]):
            raise UserError(f"{where}: schedule.active_hours.{key} {raw[key]!r} is not a time like 09:00; {fix}")
    return Window(raw["start"], raw["end"])


def _cron(text: str, where: str) -> str:
    expr = " ".join(text.split())
    if expr.lower() in ALIASES:
        return expr.lower()
    if len(expr.split()) != 5:
        raise UserError(f"{where}: schedule {text!r} is not a 5-field cron expression (minute hour day month "
                        f"weekday); {FIX}")
    from croniter import croniter

    if not croniter.is_valid(expr):
        raise UserError(f"{where}: schedule {text!r} is not a valid cron expression (a field is out of range or "
                        f"misspelt); {FIX}")
    from croniter import CroniterBadDateError

    try:  # "0 0 31 2 *" is valid field by field, yet no date has it
        croniter(expr, timeutil.now().astimezone()).get_next(datetime)
    except CroniterBadDateError:
        raise UserError(f"{where}: schedule {text!r} never fires (no date has that day in those months); "
                        f"{FIX}") from None
    return expr


def _every(raw: Any, where: str, stateful: bool) -> Schedule:
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise UserError(f"{where}: schedule.every {raw!r} is not an interval; {FIX}")
    if isinstance(raw, int | float):
        raise UserError(f"{where}: schedule.every {raw!r} needs a unit: {raw}s, {raw}m, {raw}h or {raw}d")
    m = re.fullmatch(_EVERY_RE, raw)
    if m is None:
        raise UserError(f"{where}: schedule.every {raw!r} is not an interval like 30s, 15m, 2h or 1d; {FIX}")
    seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if seconds < MIN_EVERY_SECONDS:
        raise UserError(f"{where}: schedule.every {raw!r} is shorter than {MIN_EVERY_SECONDS:g} s; use 1s or more")
    if seconds > MAX_EVERY_DAYS * _UNITS["d"]:
        raise UserError(f"{where}: schedule.every {raw!r} is longer than {MAX_EVERY_DAYS}d (100 years); use a "
                        f"shorter interval")
    return Schedule("every", f"{m.group(1)}{m.group(2)}", seconds=seconds, stateful=stateful)


def of_task(task: TaskFile, label: str | None = None) -> Schedule | None:
    """The task's schedule, None when it has none; UserError (naming the file and the line) when
    the value is bad."""
    fm = task.frontmatter
    value = fm.get("schedule")
    where = _where(task.path, label)
    lines = getattr(task, "frontmatter_lines", {}) or {}
    if value is None:
        if fm.get("stateful") is not None and not isinstance(fm.get("stateful"), bool):
            at = f"{where}:{lines['stateful']}" if "stateful" in lines else where
            raise UserError(f"{at}: frontmatter key 'stateful' must be true or false, not {fm.get('stateful')!r}")
        return None
    if not isinstance(fm.get("stateful"), bool | None):
        at = f"{where}:{lines['stateful']}" if "stateful" in lines else where
        raise UserError(f"{at}: frontmatter key 'stateful' must be true or false, not {fm.get('stateful')!r}")
    at = f"{where}:{lines['schedule']}" if "schedule" in lines else where
    return parse(value, stateful=fm.get("stateful"), where=at)


def memory_source(task_id: str) -> str:
    """The tag of a scheduled task's memories (SPEC §11)."""
    return f"schedule:{task_id}"


def first_fire(sched: Schedule, now: datetime) -> datetime:
    """When a new scheduled loop runs first: `every` at once, cron at its next fire."""
    return now if sched.kind == "every" else sched.next_after(now)


def next_fire(sched: Schedule, run_started: datetime, now: datetime) -> tuple[datetime, int]:
    """After a run that started at `run_started`: when the next run starts, and how many fires it
    stands for (more than 1: fires were missed, and this is the one catch-up run)."""
    due = sched.next_after(run_started)
    if due > now:
        return due, 1
    return now, sched.fires_between(run_started, now)


def hold_for_active_hours(due: datetime, active: Any) -> datetime:
    """`due`, moved to the opening of the active-hours window when it falls outside it."""
    if active is None:
        return due
    from kiro.core.guardrails import seconds_until_active

    local = due.astimezone()
    wait = seconds_until_active(active, local.replace(tzinfo=None))
    return due + timedelta(seconds=wait) if wait > 0 else due


def iso(t: datetime) -> str:
    return timeutil.iso(t)
