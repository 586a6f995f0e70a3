"""`Dashboard.md`, seed 004's "Progress Dashboard" (SPEC §10), regenerated as loops change state: at
most once a second per workspace and process, however many loops run in it, and once more when the
last of them ends.

Sections: Active Loops (status, iteration/max with %, success rate, current step, duration, ETA),
Paused (with the reason; a loop whose process died shows as interrupted), Completed Today, Failed
(reason, action taken). Loops of this process hand over their live state; the states of other
processes' loops are read from disk (running vs interrupted told by their locks).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from kiro import timeutil
from kiro.fs.atomic import atomic_write
from kiro.shared import Registry
from kiro.status import Status, StopReason, percent
from kiro.store import frontmatter
from kiro.store.state import Context, LoopState, effective_status, first_line
from kiro.store.statestore import StateStore
from kiro.store.workspace import Workspace
from kiro.usage import dollars
from kiro.views import loops

MIN_INTERVAL = 1.0
SHARE_LIMIT = 20  # a render taking 60 ms (a thousand loops) spaces renders 1.2 s apart

@dataclass(frozen=True, eq=False)
class Entry:
    state: LoopState
    status: Status  # effective: a running state whose process is gone is "interrupted"
    alive: bool
    kept: bool = False
    """Read from its file and kept, unchanged, between renders (`DiskStates`): its block may be kept too."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Status(self.status))


def _reason(code: str | None) -> str:
    """A stop reason as Dashboard.md names it (kiro.status.StopReason's label)."""
    if not code:
        return ""
    reason = StopReason.of(code)
    return reason.label if reason is not None else code.replace("_", " ").title()


def _duration(e: Entry, now: datetime) -> float:
    d = e.state.metrics.total_duration_seconds
    if e.alive and e.status.is_active:
        d += max(0.0, (now - timeutil.parse(e.state.updated_at)).total_seconds())
    return d


def _eta(st: LoopState) -> str | None:
    if st.steps_total is None or st.steps_done is None or not st.metrics.average_step_duration:
        return None
    left = st.steps_total - st.steps_done
    return timeutil.human_duration(left * st.metrics.average_step_duration) if left > 0 else None


def _step(st: LoopState) -> str:
    c = st.current_step
    return f"{c.step_id} - {c.description}" if c else "-"


def _iteration(st: LoopState, label: str = "Iteration") -> str:
    pct = st.iteration / st.max_iterations if st.max_iterations else 0.0
    return f"**{label}**: {st.iteration}/{st.max_iterations} ({pct:.0%})"


def _block(e: Entry, now: datetime, section: str) -> list[str]:
    st = e.state
    name = st.title or st.task_id
    head = f"### Task: {name}" + (f" (`{st.task_id}`)" if st.title else "")
    badge = e.status.badge
    lines = [head]
    if section == "active":
        extra = f" ({_reason(st.stop_reason)})" if e.status == Status.SLEEPING and st.stop_reason else ""
        if e.status == Status.SLEEPING and st.sleep_note:
            extra = f" ({st.sleep_note})"
        lines += [f"**Status**: {badge}{extra}", _iteration(st),
                  f"**Success Rate**: {percent(st.metrics.success_rate)}"]
        if st.steps_total:
            lines.append(f"**Steps**: {st.steps_done or 0}/{st.steps_total}")
        lines += [f"**Current Step**: {_step(st)}", f"**Duration**: {timeutil.human_duration(_duration(e, now))}",
                  f"**ETA**: {_eta(st) or 'unknown'}"]
        if st.usage.cost_usd:
            lines.append(f"**Cost so far**: {dollars(st.usage.cost_usd)}")
    elif section == "paused":
        if e.status == Status.INTERRUPTED:
            why = f"process {st.pid} died" if st.pid else "its process died"
        else:
            why = _reason(st.stop_reason) or e.status
        lines += [f"**Status**: {badge} ({why})", _iteration(st),
                  f"**Success Rate**: {percent(st.metrics.success_rate)}"]
        if st.stop_message and e.status != Status.INTERRUPTED:
            lines.append(f"**Cause**: {st.stop_message}")
        if st.steps_total:
            lines.append(f"**Steps**: {st.steps_done or 0}/{st.steps_total}")
        lines += [f"**Last Step**: {_step(st)}", f"**Duration**: {timeutil.human_duration(_duration(e, now))}"]
        if e.status in (Status.MAX_ITERATIONS, Status.TIMED_OUT) and st.report_path:
            lines.append(f"**Action**: Intervention requested (`{st.report_path}`)")
        reason = StopReason.of(st.stop_reason, e.status)
        if reason is not None and reason.flag is None and reason.advice:  # a config key to raise, not a flag
            lines.append(f"**Resume**: {loops.advice(st, e.status)}")
        else:
            lines.append(f"**Resume**: `{loops.hint(st, e.status) or f'kiro loop resume --task-id {st.task_id}'}`")
    elif section == "completed":
        lines += [f"**Status**: {badge}", _iteration(st, "Iterations"),
                  f"**Success Rate**: {percent(st.metrics.success_rate)}",
                  f"**Duration**: {timeutil.human_duration(st.metrics.total_duration_seconds)}"]
        if st.usage.cost_usd:
            lines.append(f"**Cost**: {dollars(st.usage.cost_usd)}")
        if st.report_path:
            lines.append(f"**Report**: `{st.report_path}`")
    else:
        # whole: the first line of an agent CLI's error ends with its attempt log's path
        detail = first_line(st.failed_steps[-1].error, 1000) if st.failed_steps else ""
        lines += [f"**Status**: {badge} ({_reason(st.stop_reason) or 'failed'})", _iteration(st, "Iterations"),
                  f"**Consecutive Failures**: {st.consecutive_failures}",
                  f"**Reason**: {detail or _reason(st.stop_reason) or 'unknown'}"]
        if st.failed_steps:
            lines.append(f"**Failed Step**: {st.failed_steps[-1].step_id} - {st.failed_steps[-1].description}")
        action = f"Escalated to human (`{st.report_path}`)" if st.report_path else "Escalated to human"
        lines.append(f"**Action**: {action}")
        lines.append(f"**Resume**: `{loops.hint(st, e.status)}`")
    # two trailing spaces: one line each in every markdown renderer
    return lines[:1] + [ln + "  " for ln in lines[1:]]


Blocks = dict[int, tuple[LoopState, Status, str]]
"""The text of the blocks of kept entries (`Entry.kept`) outside Active Loops, by their state's id: (the state,
its status as shown, the text). Those are the same from one render to the next while the state and its status
are: only an active loop's block says something of the time (its duration, from its last update)."""


def _text(e: Entry, now: datetime, section: str, blocks: Blocks | None, kept: Blocks) -> str:
    """The block of `e` in `section`, from `blocks` when it was made there already (a kept state's, not active)."""
    if blocks is None or not e.kept or section == "active":
        return "\n".join(_block(e, now, section))
    found = blocks.get(id(e.state))
    if found is None or found[0] is not e.state or found[1] != e.status:
        found = (e.state, e.status, "\n".join(_block(e, now, section)))
    kept[id(e.state)] = found
    return found[2]


def markdown(entries: list[Entry], now: datetime | None = None, blocks: Blocks | None = None) -> str:
    """The dashboard's text for these loops at time `now` (a pure function, for tests). `blocks`: the blocks of
    kept entries made by the render before (`Blocks`), replaced by those of this one."""
    now = now or timeutil.now()
    today = now.astimezone().date()
    active: list[Entry] = []
    paused: list[Entry] = []
    done_today: list[Entry] = []
    failed: list[Entry] = []
    earlier = 0
    for e in entries:
        group = e.status.group
        if group == "Active":
            active.append(e)
        elif group == "Completed":
            when = e.state.finished_at or e.state.updated_at
            if timeutil.parse(when).astimezone().date() == today:
                done_today.append(e)
            else:
                earlier += 1
        elif group == "Failed":
            failed.append(e)
        else:
            paused.append(e)
    out = [frontmatter.write({"type": "dashboard", "created": timeutil.iso(now)}), "# Autonomous Loop Progress\n"]
    kept: Blocks = {}
    for title, items, key in (("Active Loops", active, "active"), ("Paused", paused, "paused"),
                              ("Completed Today", done_today, "completed"), ("Failed", failed, "failed")):
        out.append(f"\n## {title} ({len(items)})\n")
        if not items:
            out.append("\n_None._\n")
        for e in items:
            out.append("\n" + _text(e, now, key, blocks, kept) + "\n")
    if blocks is not None:
        blocks.clear()
        blocks.update(kept)
    if earlier:
        out.append(f"\n_{earlier} loop(s) completed before today; `kiro loop status` lists them._\n")
    return "".join(out)


def _shown(state: LoopState | None) -> LoopState | None:
    """What `DiskStates` keeps of a state between renders: all the dashboard shows, without the per-step
    records it never reads (the completed steps, `steps{}`, the last prompt and reply, the failed attempts
    but the newest, the parallel attempts). With a thousand loops of one process ended, the cache held a
    second whole copy of each one's state (docs/guides/many-loops.md, session 30)."""
    if state is not None:  # just read from its file: nobody else holds it
        state.completed_steps, state.steps, state.context, state.parallel = [], {}, Context(), []
        del state.failed_steps[:-1]
    return state


class DiskStates:
    """The state files on disk (the live folder, then the archive), each parsed again only when it
    changed (inode, mtime, size): the dashboard of a process with a thousand loops looks at every
    file each second, and reads only the few that moved. Of each it keeps what the dashboard shows
    (`_shown`)."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self._cache: dict[str, tuple[tuple[int, int, int], Path, LoopState | None]] = {}
        self.blocks: Blocks = {}
        """The blocks the last render made of these states (`markdown`)."""

    def read(self, skip: set[str]) -> list[tuple[Path, LoopState | None]]:
        seen: dict[str, tuple[Path, LoopState | None]] = {}
        keep: dict[str, tuple[tuple[int, int, int], Path, LoopState | None]] = {}
        for folder in (self.store.ws.state_dir, self.store.ws.state_dir / "archive"):
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for entry in entries:
                name = entry.name
                if not (name.startswith("autonomous_loop_") and name.endswith(".json")):
                    continue
                tid = name[len("autonomous_loop_"):-len(".json")]
                if tid in seen or tid in skip:
                    continue
                try:
                    st = entry.stat()
                except OSError:
                    continue
                sig = (st.st_ino, st.st_mtime_ns, st.st_size)
                cached = self._cache.get(entry.path)
                if cached is not None and cached[0] == sig:
                    _sig, path, state = cached
                else:
                    path = Path(entry.path)
                    state = _shown(self.store.try_read(path))
                keep[entry.path] = (sig, path, state)
                seen[tid] = (path, state)
        self._cache = keep
        return list(seen.values())


def render(ws: Workspace, store: StateStore, live: dict[str, LoopState], now: datetime | None = None,
           disk: DiskStates | None = None) -> str:
    entries: list[Entry] = []
    for st in live.values():
        entries.append(Entry(st, st.status, True))
    found_on_disk = disk.read(set(live)) if disk is not None else store.all_states(skip=set(live))
    alive = store.locked(found.task_id for _path, found in found_on_disk  # one reading of the lock table
                         if found is not None and found.status.may_be_alive)
    for _path, found in found_on_disk:
        if found is not None:
            held = found.task_id in alive
            entries.append(Entry(found, effective_status(found, held), held, kept=disk is not None))
    entries.sort(key=lambda e: e.state.updated_at, reverse=True)
    return markdown(entries, now, disk.blocks if disk is not None else None)


def write_now(ws: Workspace, store: StateStore, live: dict[str, LoopState] | None = None) -> None:
    if not ws.laid_out:  # a Kiro repository: no Dashboard.md at the project's root (Workspace.laid_out)
        return
    atomic_write(ws.dashboard, render(ws, store, live or {}), fsync=False)


class DashboardService:
    def __init__(self, ws: Workspace, store: StateStore) -> None:
        self.ws = ws
        self.store = store
        self.live: dict[str, LoopState] = {}
        self.users = 0
        self._dirty = False
        self._last = 0.0
        self._task: asyncio.Task[None] | None = None
        self.error: str | None = None
        self.disk = DiskStates(store)
        self._interval = MIN_INTERVAL

    def update(self, state: LoopState) -> None:
        self.live[state.task_id] = state
        self._dirty = True
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._writer())

    def forget(self, state: LoopState) -> None:
        """A loop of this process ended: from now on its state is read from disk."""
        self.live.pop(state.task_id, None)
        self._dirty = True

    async def _writer(self) -> None:
        while self._dirty:
            wait = self._last + self._interval - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            text = self._render()
            if text is not None:  # the rename (about a millisecond) off the event loop
                await asyncio.to_thread(self._write, text)

    def _render(self) -> str | None:
        if not self._dirty:
            return None
        self._dirty = False
        self._last = time.monotonic()
        try:
            return render(self.ws, self.store, self.live, disk=self.disk)
        except OSError as exc:
            self.error = str(exc)
            return None
        finally:  # many loops: the dashboard takes at most 1/SHARE_LIMIT of the event loop
            self._interval = max(MIN_INTERVAL, (time.monotonic() - self._last) * SHARE_LIMIT)

    def _write(self, text: str) -> None:
        if not self.ws.laid_out:  # a Kiro repository: no Dashboard.md at the project's root (Workspace.laid_out)
            return
        try:
            atomic_write(self.ws.dashboard, text, fsync=False)
        except OSError as exc:
            self.error = str(exc)

    def flush(self) -> None:
        text = self._render()
        if text is not None:
            self._write(text)

    async def aclose(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._dirty = True
        self.flush()


_services: Registry[DashboardService] = Registry()


def acquire(ws: Workspace, store: StateStore) -> DashboardService:
    return _services.acquire(ws.root, lambda: DashboardService(ws, store))


async def release(svc: DashboardService) -> None:
    await _services.release(svc)
