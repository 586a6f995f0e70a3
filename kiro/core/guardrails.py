"""Guardrails: limits the model cannot talk its way past (seed 000 "Guardrails", seed 004 "Resource
Limits"). Each limit names itself when it triggers: its name, its value, and the figure that hit it.

Three kinds:
- waits: `active_hours`, `token_budget_per_hour`, `max_api_calls_per_minute`, `max_actions_per_minute`,
  `max_cpu_percent`, `max_disk_writes_per_minute` -> the loop sleeps (status `sleeping`) until the limit
  frees; a stop hook still ends the wait at once;
- hard stops: `max_total_tokens`, `max_cost_usd`, `idle_timeout_seconds`, `max_memory_mb` -> exit 4;
- loop detection: the same error on the same step, or the same tool call with the same arguments
  on the same step with no step completed in between, `loop_detection_repeats` times in a row ->
  escalate (exit 5) instead of burning iterations. Steps that complete are progress, however alike.

Budgets live in the state (`LoopState.guardrails`), so a resumed loop does not get a fresh budget.
Rate limiters are shared by every loop of one process (`SharedLimits`).
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from kiro.store.config import Config
from kiro.store.state import LoopState
from kiro.usage import Usage, dollars

SIDE_EFFECT_TOOLS = frozenset({"write_file", "edit_file", "run_command", "add_steps", "memory_save"})
WINDOW_SECONDS = 3600.0


@dataclass(frozen=True, eq=False)
class Trigger:
    limit: str
    value: Any
    figure: Any
    message: str
    action: Literal["wait", "stop", "escalate"]
    seconds: float = 0.0

    def fields(self) -> dict[str, Any]:
        return {"limit": self.limit, "value": self.value, "figure": self.figure, "action": self.action,
                "message": self.message, **({"seconds": round(self.seconds, 3)} if self.action == "wait" else {})}


class RateLimiter:
    """At most `per_minute` events in any 60-second window."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self.clock = clock
        self.events: deque[float] = deque()

    def _trim(self, now: float) -> None:
        while self.events and now - self.events[0] >= 60.0:
            self.events.popleft()

    def delay(self) -> float:
        now = self.clock()
        self._trim(now)
        if len(self.events) < self.per_minute:
            return 0.0
        return max(0.0, 60.0 - (now - self.events[0]))

    def count(self) -> int:
        self._trim(self.clock())
        return len(self.events)

    def record(self) -> None:
        now = self.clock()
        self._trim(now)
        self.events.append(now)


def cpu_seconds() -> float:
    """CPU time (user + system) of this process, all its threads, and its children that have ended
    (step processes, agent CLIs, run_command, and what they waited for): getrusage."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def disk_writes() -> float:
    """Disk writes by this process and its ended children, as the kernel accounts them (getrusage
    `ru_oublock`, in 512-byte blocks), counted in 4 KiB pages: one small file written is about one."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return (me.ru_oublock + kids.ru_oublock) / 8


class UsageMeter:
    """A figure that only grows (CPU seconds, pages written), read at each check; what it grew by
    in the last minute. The first reading is taken when the meter is made (after kiro's start-up)."""

    WINDOW = 60.0

    def __init__(self, read: Callable[[], float], clock: Callable[[], float] = time.monotonic) -> None:
        self.read = read
        self.clock = clock
        self.samples: deque[tuple[float, float]] = deque([(clock(), read())])

    def sample(self) -> tuple[float, float]:
        now, value = self.clock(), self.read()
        if value != self.samples[-1][1] or now - self.samples[-1][0] >= 1.0:
            self.samples.append((now, value))
        while len(self.samples) > 2 and self.samples[1][0] <= now - self.WINDOW:
            self.samples.popleft()  # samples[0] stays the newest one at or before the window's start
        return now, value

    def over_window(self) -> tuple[float, float]:
        """(seconds covered, growth) over the last minute, or since the first reading."""
        now, value = self.sample()
        t0, v0 = self.samples[0]
        return now - t0, value - v0

    def seconds_until_below(self, limit: float) -> float:
        """How long until the growth over the window is below `limit`, if nothing more is used."""
        now, value = self.samples[-1]
        for t, v in self.samples:
            if value - v < limit:
                return max(t + self.WINDOW - now, 0.0)
        return self.WINDOW


class SharedLimits:
    """Rate limits shared by every loop in one process: one model endpoint, one budget of actions,
    one machine's CPU and disk."""

    def __init__(self, config: Config) -> None:
        calls = config.resource_limits.max_api_calls_per_minute
        actions = config.guardrails.max_actions_per_minute
        self.api = RateLimiter(calls) if calls else None
        self.actions = RateLimiter(actions) if actions else None
        limits = config.resource_limits
        self.cpu = UsageMeter(cpu_seconds) if limits.max_cpu_percent is not None else None
        self.disk = UsageMeter(disk_writes) if limits.max_disk_writes_per_minute is not None else None


def _fingerprint(*parts: Any) -> str:
    raw = json.dumps(parts, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def _normalise_error(error: str) -> str:
    """The part of an error that says what went wrong: digits and long hex ids vary run to run."""
    import re

    first = "\n".join(error.strip().splitlines()[:3])
    return re.sub(r"0x[0-9a-f]+|\d+(\.\d+)?", "#", first.lower())


_statm: list[int] = []  # [pid, fd of /proc/self/statm], opened once per process (asked every iteration)


def rss_mb() -> float | None:
    """This process's resident memory, from /proc (Linux); None elsewhere."""
    try:
        if not _statm or _statm[0] != os.getpid():  # a forked child has its own /proc/self
            _statm[:] = [os.getpid(), os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)]
        pages = int(os.pread(_statm[1], 128, 0).split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / (1024 * 1024)
    except (OSError, ValueError, IndexError):
        return None


def seconds_until_active(active: Any, now: datetime) -> float:
    """0 inside the `active_hours` window (local time; a window may cross midnight), else the
    seconds until it next opens."""
    sh, sm = (int(x) for x in active.start.split(":"))
    eh, em = (int(x) for x in active.end.split(":"))
    start, end = sh * 60 + sm, eh * 60 + em
    minute = now.hour * 60 + now.minute + now.second / 60
    inside = start <= minute < end if start <= end else (minute >= start or minute < end)
    if inside or start == end:
        return 0.0
    opening = now.replace(hour=sh, minute=sm, second=0, microsecond=0)
    if opening <= now:
        opening += timedelta(days=1)
    return (opening - now).total_seconds()


class LoopGuardrails:
    def __init__(self, config: Config, state: LoopState, shared: SharedLimits,
                 clock: Callable[[], float] = time.time, local_now: Callable[[], datetime] = datetime.now) -> None:
        self.g = config.guardrails
        self.limits = config.resource_limits
        self.state = state
        self.shared = shared
        self.clock = clock
        self.local_now = local_now
        self.last_activity = time.monotonic()
        self.pending = Usage()  # usage of the attempt under way, not yet in the state
        self._call_fp: str | None = None
        self._call_streak = 0
        self._rested_while_stopped()

    # -- guardrails.max_consecutive_turns (SPEC §11): the count lives in the state ---------------

    def _rested_while_stopped(self) -> None:
        """A loop that was stopped for at least `forced_sleep_seconds` since its last model turn has
        had its rest: the count starts again. A quick restart keeps it (also one that cut a forced
        rest short: the rest is taken again before the next model call)."""
        book = self.state.guardrails.get("consecutive_turns")
        if isinstance(book, dict) and isinstance(book.get("last_turn_at"), (int, float)) and \
                self.clock() - float(book["last_turn_at"]) >= self.g.forced_sleep_seconds:
            book["count"] = 0

    def waited(self, trigger: Trigger) -> None:
        """The loop slept through `trigger`'s wait to its end (or a message ended it)."""
        if trigger.limit == "max_consecutive_turns":
            self.turns_without_sleep = 0  # the forced rest counts as a sleep

    @property
    def turns_without_sleep(self) -> int:
        book = self.state.guardrails.get("consecutive_turns")
        return int(book.get("count", 0)) if isinstance(book, dict) else 0

    @turns_without_sleep.setter
    def turns_without_sleep(self, value: int) -> None:
        book = self.state.guardrails.setdefault("consecutive_turns", {})
        if not isinstance(book, dict):
            book = self.state.guardrails["consecutive_turns"] = {}
        book["count"] = value
        book["last_turn_at"] = round(self.clock(), 3)

    # -- bookkeeping -----------------------------------------------------------------------

    @property
    def _book(self) -> dict[str, Any]:
        book = self.state.guardrails
        book.setdefault("token_window", [])
        book.setdefault("error_streak", {"fingerprint": None, "count": 0})
        return book

    def tokens_last_hour(self) -> int:
        now = self.clock()
        window = [pair for pair in self._book["token_window"] if now - pair[0] < WINDOW_SECONDS]
        self._book["token_window"] = window
        return sum(int(n) for _, n in window)

    def activity(self) -> None:
        self.last_activity = time.monotonic()

    def record_model_call(self, usage: Usage) -> None:
        if self.shared.api is not None:
            self.shared.api.record()
        self.pending.add(usage)
        self.turns_without_sleep += 1
        self._count_tokens(usage)

    def record_side_call(self, usage: Usage) -> None:
        """A model call that is not an agent turn (the pre-check gate): it counts against the rate
        limit and the token budget, not against max_consecutive_turns."""
        if self.shared.api is not None:
            self.shared.api.record()
        self._count_tokens(usage)

    def _count_tokens(self, usage: Usage) -> None:
        """The call's tokens into the last hour's window (`token_budget_per_hour`, kept also without a
        budget: one set later counts the hour before). What left the hour is dropped here, not only when a
        budget looks: unbounded, the window grew by a pair a model call for a loop's whole run, and the
        state's guardrails (the whole window) is dumped and compared at every save (issue #41)."""
        if usage.total_tokens:
            now = self.clock()
            window = self._book["token_window"]
            window.append([round(now, 3), int(usage.total_tokens)])
            old = next((i for i, pair in enumerate(window) if now - pair[0] < WINDOW_SECONDS), len(window))
            if old:
                del window[:old]

    def attempt_done(self) -> None:
        """The attempt's usage has been added to the state."""
        self.pending = Usage()

    def record_tool_call(self, name: str, arguments: Mapping[str, Any]) -> None:
        if name == "sleep":
            self.turns_without_sleep = 0
        if name in SIDE_EFFECT_TOOLS:
            self.activity()
            if self.shared.actions is not None:
                self.shared.actions.record()

    # -- checks ----------------------------------------------------------------------------

    def hard_stop(self) -> Trigger | None:
        g, s = self.g, self.state
        tokens = s.usage.total_tokens + self.pending.total_tokens
        cost = s.usage.cost_usd + self.pending.cost_usd
        if g.max_total_tokens is not None and tokens >= g.max_total_tokens:
            return Trigger("max_total_tokens", g.max_total_tokens, tokens,
                           f"max_total_tokens {g.max_total_tokens} reached ({tokens} tokens used)", "stop")
        if g.max_cost_usd is not None and cost >= g.max_cost_usd:
            return Trigger("max_cost_usd", g.max_cost_usd, round(cost, 6),
                           f"max_cost_usd {g.max_cost_usd} reached ({dollars(cost)} spent)", "stop")
        if g.idle_timeout_seconds is not None:
            idle = time.monotonic() - self.last_activity
            if idle >= g.idle_timeout_seconds:
                return Trigger("idle_timeout_seconds", g.idle_timeout_seconds, round(idle, 3),
                               f"idle_timeout_seconds {g.idle_timeout_seconds:g} reached: no meaningful action for "
                               f"{idle:.0f} s", "stop")
        if self.limits.max_memory_mb is not None:
            rss = rss_mb()
            if rss is not None and rss >= self.limits.max_memory_mb:
                return Trigger("max_memory_mb", self.limits.max_memory_mb, round(rss, 1),
                               f"max_memory_mb {self.limits.max_memory_mb} reached ({rss:.0f} MB resident)", "stop")
        return None

    def wait_needed(self) -> Trigger | None:
        """A limit that asks the loop to sleep before going on, and for how long."""
        g = self.g
        if g.active_hours is not None:
            secs = seconds_until_active(g.active_hours, self.local_now())
            if secs > 0:
                return Trigger("active_hours", f"{g.active_hours.start}-{g.active_hours.end}",
                               self.local_now().strftime("%H:%M"),
                               f"outside active hours {g.active_hours.start}-{g.active_hours.end}; sleeping "
                               f"{secs:.0f} s", "wait", secs)
        resources = self.resource_wait()
        if resources is not None:
            return resources
        if g.token_budget_per_hour is not None:
            used = self.tokens_last_hour()
            if used >= g.token_budget_per_hour:
                window = self._book["token_window"]
                # wait until enough of the oldest usage leaves the one-hour window
                excess = used - g.token_budget_per_hour
                now = self.clock()
                freed, secs = 0, 0.0
                for ts, n in window:
                    freed += int(n)
                    secs = ts + WINDOW_SECONDS - now
                    if freed > excess:
                        break
                return Trigger("token_budget_per_hour", g.token_budget_per_hour, used,
                               f"token_budget_per_hour {g.token_budget_per_hour} used up ({used} tokens in the last "
                               f"hour); sleeping {max(secs, 0):.0f} s", "wait", max(secs, 0.05))
        return None

    def resource_wait(self) -> Trigger | None:
        """`resource_limits.max_cpu_percent` and `max_disk_writes_per_minute`, as waits: the process
        (every loop in it) and its ended step processes, over the last minute."""
        limits, shared = self.limits, self.shared
        if shared.cpu is not None and limits.max_cpu_percent is not None:
            # max_cpu_percent of one CPU over any minute: a budget of CPU seconds per rolling minute
            budget = limits.max_cpu_percent / 100 * UsageMeter.WINDOW
            span, used = shared.cpu.over_window()
            if used > budget:
                secs = max(shared.cpu.seconds_until_below(budget), 0.05)
                percent = used / UsageMeter.WINDOW * 100
                return Trigger("max_cpu_percent", limits.max_cpu_percent, round(percent, 1),
                               f"max_cpu_percent {limits.max_cpu_percent:g} reached: kiro and its steps used "
                               f"{used:.1f} CPU seconds in the last {span:.0f} s ({percent:.0f}% of a CPU over a "
                               f"minute); waiting {secs:.0f} s", "wait", secs)
        if shared.disk is not None and limits.max_disk_writes_per_minute is not None:
            span, written = shared.disk.over_window()
            if written >= limits.max_disk_writes_per_minute:
                secs = max(shared.disk.seconds_until_below(limits.max_disk_writes_per_minute), 0.05)
                return Trigger("max_disk_writes_per_minute", limits.max_disk_writes_per_minute, int(written),
                               f"max_disk_writes_per_minute {limits.max_disk_writes_per_minute} reached: "
                               f"{written:.0f} writes (4 KiB each) in the last {span:.0f} s; waiting {secs:.0f} s",
                               "wait", secs)
        return None

    def before_model_call(self) -> Trigger | None:
        t = self.hard_stop() or self.wait_needed()
        if t is not None:
            return t
        most = self.g.max_consecutive_turns
        if most is not None and self.turns_without_sleep >= most:
            # the count starts again when the forced sleep is over (`waited`), not when it is asked for:
            # a stop during the rest keeps it owed, and a caller that only looks takes nothing away
            turns, secs = self.turns_without_sleep, self.g.forced_sleep_seconds
            return Trigger("max_consecutive_turns", most, turns,
                           f"max_consecutive_turns {most} reached ({turns} model turns without a sleep); "
                           f"sleeping {secs:g} s", "wait", secs)
        if self.shared.api is not None:
            delay = self.shared.api.delay()
            if delay > 0:
                return Trigger("max_api_calls_per_minute", self.shared.api.per_minute, self.shared.api.count(),
                               f"max_api_calls_per_minute {self.shared.api.per_minute} reached; waiting {delay:.1f} s",
                               "wait", delay)
        return None

    def before_tool_call(self, name: str, arguments: Mapping[str, Any]) -> Trigger | None:
        # The same call on the same step: a step that changed (the last one completed, or a person
        # checked it) is progress, and so is any other call in between.
        step = self.state.current_step.step_id if self.state.current_step is not None else None
        fp = _fingerprint(step, name, dict(arguments))
        self._call_streak = self._call_streak + 1 if fp == self._call_fp else 1
        self._call_fp = fp
        if self._call_streak >= self.g.loop_detection_repeats:
            return Trigger("loop_detection_repeats", self.g.loop_detection_repeats, self._call_streak,
                           f"the agent called {name} with the same arguments {self._call_streak} times in a row",
                           "escalate")
        t = self.hard_stop()
        if t is not None:
            return t
        if name in SIDE_EFFECT_TOOLS:
            resources = self.resource_wait()
            if resources is not None:
                return resources
        if name in SIDE_EFFECT_TOOLS and self.shared.actions is not None:
            delay = self.shared.actions.delay()
            if delay > 0:
                return Trigger("max_actions_per_minute", self.shared.actions.per_minute, self.shared.actions.count(),
                               f"max_actions_per_minute {self.shared.actions.per_minute} reached; waiting "
                               f"{delay:.1f} s", "wait", delay)
        return None

    def after_attempt(self, step_id: str, error: str | None) -> Trigger | None:
        """Loop detection across attempts: the same error on the same step N times in a row."""
        streak = self._book["error_streak"]
        if error is None:  # a step completed: progress, whatever the calls that did it looked like
            streak.update(fingerprint=None, count=0)
            self._call_fp, self._call_streak = None, 0
            return None
        fp = _fingerprint(step_id, _normalise_error(error))
        streak["count"] = streak["count"] + 1 if streak.get("fingerprint") == fp else 1
        streak["fingerprint"] = fp
        if streak["count"] >= self.g.loop_detection_repeats:
            return Trigger("loop_detection_repeats", self.g.loop_detection_repeats, streak["count"],
                           f"step {step_id} failed with the same error {streak['count']} times in a row", "escalate")
        return None
