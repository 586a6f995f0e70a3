"""`kiro loop watch`: one process that runs a loop for every task file in `Specs/`.

- A task file that appears in `Specs/` gets a loop (never two at once: a task whose loop runs in
  this or another process is left alone).
- At most `max_parallel_loops` loops run at once; the others wait as `pending`.
- A loop that pauses (stop hook, task moved to `Needs_Action/`, the agent asked a person) stays
  alive at no CPU cost: the supervisor keeps its lock and continues it when its hook file is
  deleted, when the task is moved back to `Specs/`, or when the request file is deleted (the
  seed's "Resume Instructions"). `kiro loop resume` on such a loop removes the hook and lets the
  supervisor continue it.
- All loops share one rate limiter and budget (`SharedLimits`) and one file watcher.
- SIGTERM/SIGINT/SIGHUP stop every running loop (state saved) and ends the supervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiro import executors
from kiro.core import heap, resolved
from kiro.core.engine import Loop, Outcome, on_signals
from kiro.core.guardrails import SharedLimits
from kiro.core.listeners import standard as standard_listeners
from kiro.core.looprun import LoopRun
from kiro.core.runner import (
    LoopIndex,
    find_loop_for_task,
    nothing_to_start,
    prepare_resume,
    prepare_start,
    settings_for,
    task_id_hint,
)
from kiro.core.watch import acquire_hub, release_hub, wait_until
from kiro.errors import KiroError, LockHeld, UserError, contained
from kiro.fs import locks
from kiro.status import Status, StopReason
from kiro.store import approval, kirospec, tasks
from kiro.store.config import Config
from kiro.store.events import Event, Listener, LoopFinished, LoopWarning, StepStarted
from kiro.store.state import effective_status
from kiro.store.statestore import StateStore
from kiro.store.workspace import Workspace, locate_task, task_files

RESCAN_SECONDS = 30.0  # a safety net; changes normally wake the supervisor at once
SETTLE_SECONDS = 2.0
"""A task file that does not read (no steps yet, half a frontmatter) and was written this recently may still
be being copied or saved: nothing is said of it until it has been still this long (then it is looked at again)."""
STARTING_AT_ONCE = 4
"""Loops between the start of their run and their first step's start (the run's first save, the task
file's parse, the first prompt, the step's process): the rest wait their turn, so that 200 task files
taken on at once under a high `max_parallel_loops` do not run all their starts in one turn of the event
loop, while the loops already running wait (bench/watch_scan_stall.py --parallel)."""
STARTING_AT_MOST = 0.1  # seconds a loop holds its turn at most (one that waits before its first step)


@dataclass
class Managed:
    task_id: str
    lock: locks.Flock
    task: asyncio.Task[None] | None = None
    status: Status = Status.PENDING
    outcome: Outcome | None = None
    loop: Loop | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class Supervisor:
    def __init__(self, ws: Workspace, *, config_file: Path | None = None, overrides: dict[str, Any] | None = None,
                 listeners: list[Listener] | None = None, max_parallel: int | None = None,
                 on_note: Callable[[str], None] | None = None) -> None:
        """`on_note`: told each loop's notes (the box its steps run in, as `start` prints it), each
        distinct one once in the supervisor's life."""
        loc = settings_for(ws, config_file=config_file, overrides=overrides)
        self.ws: Workspace = loc.ws
        self.store: StateStore = loc.store
        self.config: Config = loc.config
        self.config_file = config_file
        self.overrides = overrides or {}
        self.listeners = list(listeners or [])
        self.limit = max_parallel or self.config.max_parallel_loops
        self.shared = SharedLimits(self.config)
        self.managed: dict[str, Managed] = {}
        self._settling = False  # the last scan left a task file to look at again once it is still (SETTLE_SECONDS)
        self.skipped: dict[Path, float] = {}  # unusable task files, by mtime, so each is reported once
        self.held: dict[Path, str] = {}  # task files waiting for a person's approval, and what was said of each
        self.stopping = False
        self._wake = asyncio.Event()
        self._sem: asyncio.Semaphore | None = None
        self._lock: locks.Flock | None = None
        self._poll: float | None = None
        self.index = LoopIndex(self.store)
        self._preparing = asyncio.Lock()  # one scan or resume prepared at a time, on a worker thread
        self._starting = asyncio.Semaphore(STARTING_AT_ONCE)
        self.on_note = on_note
        self._noted: set[str] = set()

    # -- events ----------------------------------------------------------------------------

    def _say(self, task_id: str, event: Event) -> None:
        event.task_id = task_id
        for listener in self.listeners:
            listener(event)

    # -- lifecycle -------------------------------------------------------------------------

    def stop(self) -> None:
        self.stopping = True
        for m in self.managed.values():
            if m.loop is not None:
                m.loop.request_stop("signal", "the supervisor is stopping")
            m.wake.set()
        self._wake.set()

    async def run(self, *, until: Callable[[], bool] | None = None) -> int:
        """Supervise until stopped (SIGTERM/SIGINT, `stop()`, or `until()` turning true)."""
        self.ws.ensure_folders()
        path = self.ws.state_dir / "watch.lock"
        self._lock = locks.Flock(path)
        try:
            self._lock.acquire()
        except locks.Timeout:
            pid = _read_pid(self.ws.state_dir / "watch.pid")
            raise LockHeld("watch", pid) from None
        except OSError as exc:  # not a file in its place (a symlink: never followed)
            raise UserError(f"cannot take the lock {self.ws.relative_name(path)} ({exc.strerror}); "
                            f"remove what is in its place") from None
        (self.ws.state_dir / "watch.pid").write_text(f"{os.getpid()}\n")
        self._sem = asyncio.Semaphore(self.limit)
        hub = acquire_hub(self.ws.root)
        await hub.subscribe(self._wake)
        self._poll = hub.poll_interval
        remove = on_signals(lambda _name: self.stop())
        with heap.long_lived():  # loops for hours: kiro.core.heap
            try:
                while not self.stopping:
                    # A file event (a task file dropped into Specs/, a hook deleted, a task moved back)
                    # sets _wake: rescan at once and let every paused loop look again. The rescan timer
                    # is only a safety net (or the polling interval when the OS watcher could not start).
                    self._wake.clear()
                    self._settling = False
                    await self._scan()
                    self._wake_paused()
                    if until is not None and until():
                        break
                    rescan = hub.poll_interval if hub.failed is not None else RESCAN_SECONDS
                    if self._settling:  # a file that did not read yet is looked at again once it is still
                        rescan = min(rescan, SETTLE_SECONDS)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), rescan)
            finally:
                remove()
                self.stop()
                running = [m.task for m in self.managed.values() if m.task is not None]
                if running:
                    await asyncio.gather(*running, return_exceptions=True)
                hub.unsubscribe(self._wake)
                await release_hub(hub)
                with contextlib.suppress(OSError):
                    (self.ws.state_dir / "watch.pid").unlink()
                self._lock.release()
        return 0

    # -- discovery -------------------------------------------------------------------------

    async def _scan(self) -> None:
        """Start a loop for each task file in Specs/ that has none running, and look after each
        unfinished loop nobody runs. The look at the files and the new loops' first writes (state
        file, lock, the map of task files: fsyncs) are made on a worker thread, one scan or
        resume at a time, so that the loops running here go on meanwhile (issue #12 item 5: task
        files dropped in by the hundred held every running loop for the length of the scan)."""
        async with self._preparing:
            found = await asyncio.to_thread(self._look, frozenset(self.managed))
        for action in found:
            if isinstance(action, LoopWarning):
                self._say("watch", action)
            elif self.stopping:  # stopped meanwhile: let go of what the look took
                with contained():
                    if isinstance(action, LoopRun):
                        if action.release:
                            action.release()
                    else:
                        self.store.release(action[0], action[1])
            elif isinstance(action, LoopRun):
                self._look_after(Managed(action.state.task_id, action.lock), action)
            else:  # an unfinished loop nobody ran: kept paused until it may continue
                self._look_after(Managed(*action, status=Status.PAUSED), None)

    def _look_after(self, m: Managed, first: LoopRun | None) -> None:
        self.managed[m.task_id] = m
        m.task = asyncio.create_task(self._manage(m, first))

    def _look(self, managed: frozenset[str]) -> list[LoopWarning | LoopRun | tuple[str, locks.Flock]]:
        """On a worker thread (`_scan`): what to start, adopt or say. `managed`: the loops this
        supervisor looks after as the scan begins (only a scan adds to them)."""
        found: list[LoopWarning | LoopRun | tuple[str, locks.Flock]] = []
        if self.ws.global_hook_file.exists():
            return found  # every loop is to pause: start nothing new
        self.index.refresh()  # once per scan, not once per task file (a start refreshes it again, guarded)
        if self._folder_changed_lately():
            self._settling = True
        for path, real in task_files(self.ws):
            if self.stopping:
                break
            try:
                mtime = path.stat().st_mtime
            except OSError:
                continue
            if self.skipped.get(path) == mtime:
                continue
            try:
                task = tasks.load(path)
            except KiroError as exc:
                if not path.exists():
                    continue  # moved away meanwhile (its loop moved it to Done/): nothing to say
                if time.time() - mtime < SETTLE_SECONDS:  # still being written, maybe: judge it once it settles
                    self._settling = True
                    continue
                self.skipped[path] = mtime
                found.append(LoopWarning(message=f"skipped {self.ws.relative(path)}: {exc}"))
                continue
            existing = find_loop_for_task(self.store, path, task_id_hint(self.ws, Path(real), task), self.index,
                                          refresh=False)
            if existing is not None:
                if existing.task_id in managed or self.store.is_locked(existing.task_id):
                    continue  # runs (or waits) here or in another process
                if existing.status.is_terminal:
                    continue  # a person decides: `kiro loop resume` with a raised cap or reset failures
                with contextlib.suppress(LockHeld):  # an unfinished loop nobody runs: look after it
                    found.append((existing.task_id, self.store.acquire(existing.task_id, role="watch")))
                continue
            if nothing_to_start(task, real, self.config.include_optional):
                continue
            try:  # SPEC §15: a task file a step wrote waits for a person; said once, looked at again each scan
                approval.check_task_file(self.ws, path)
            except UserError as exc:
                if self.held.get(path) != str(exc):
                    self.held[path] = str(exc)
                    found.append(LoopWarning(message=f"not starting {self.ws.relative(path)}: {exc}"))
                continue
            self.held.pop(path, None)
            try:
                found.append(prepare_start(self.ws, str(path), config_file=self.config_file,
                                           overrides=self.overrides, index=self.index))
            except LockHeld:
                continue
            except KiroError as exc:
                if not path.exists():
                    continue  # moved away meanwhile
                with contextlib.suppress(OSError):
                    self.skipped[path] = path.stat().st_mtime
                found.append(LoopWarning(message=f"could not start {self.ws.relative(path)}: {exc}"))
        return found

    def _folder_changed_lately(self) -> bool:
        """A task folder (`Specs/<name>/`, `.kiro/specs/<name>/`, or either parent) changed less than SETTLE_SECONDS
        ago: a person's `mkdir Specs/feature && cp tasks.md Specs/feature/` may make the file before the watcher
        watches the new folder (inotify adds a new folder's watch after it is made), so no change of the file
        comes; the scan is made again once the folder is still, not only at RESCAN_SECONDS."""
        now = time.time()
        for parent in (self.ws.specs, kirospec.specs_folder(self.ws.root)):
            try:
                if now - parent.stat().st_ctime < SETTLE_SECONDS:
                    return True
                with os.scandir(parent) as entries:
                    for entry in entries:
                        if entry.is_dir(follow_symlinks=False) and \
                                now - entry.stat(follow_symlinks=False).st_ctime < SETTLE_SECONDS:
                            return True
            except OSError:
                continue
        return False

    # -- one loop --------------------------------------------------------------------------

    async def _manage(self, m: Managed, first: LoopRun | None) -> None:
        run = first
        try:
            while not self.stopping:
                if run is None:
                    if not await self._wait_to_continue(m):
                        return
                    try:
                        async with self._preparing:  # off the event loop, as a scan's starts
                            run = await asyncio.to_thread(prepare_resume, self.ws, m.task_id,
                                                          config_file=self.config_file, overrides=self.overrides,
                                                          held_lock=m.lock)
                    except KiroError as exc:
                        self._say(m.task_id, LoopWarning(message=f"could not continue: {exc}"))
                        return
                try:
                    await asyncio.to_thread(getattr, run, "notes")  # the box's line: worked out off the event loop
                except KiroError as exc:
                    self._say(m.task_id, LoopWarning(message=f"could not continue: {exc}"))
                    return
                self._note(run)
                assert self._sem is not None
                slot = Slot(self._sem)  # a scheduled loop gives it back while it waits between runs
                await slot.acquire()
                try:
                    await self._starting.acquire()  # a few loops in their start at once: STARTING_AT_ONCE
                    turn = _Turn(self._starting)
                    try:
                        await asyncio.to_thread(self.store.set_role, m.task_id, "loop")  # a file write
                        if self.stopping:  # after the last wait: a stop meanwhile starts nothing
                            return
                        outcome = await self._run_once(m, run, slot, turn)
                    finally:
                        turn.give_back()
                finally:
                    slot.release()
                run = None
                m.outcome = outcome
                m.status = outcome.status
                if not _resumable(outcome):
                    return
                await asyncio.to_thread(self.store.set_role, m.task_id, "watch")
        finally:
            self.managed.pop(m.task_id, None)
            with contained():
                self.store.release(m.task_id, m.lock)
            self._wake.set()  # the task file may be startable again, or a slot is free

    def _note(self, run: LoopRun) -> None:
        for note in run.notes:
            if self.on_note is not None and note not in self._noted:
                self._noted.add(note)
                self.on_note(note)

    async def _run_once(self, m: Managed, run: LoopRun, slot: Slot | None, turn: _Turn) -> Outcome:
        def begun(event: Event) -> None:
            if isinstance(event, StepStarted):
                turn.give_back()
            elif isinstance(event, LoopFinished):  # the pause is made: a change from now on is one it waits for
                m.wake.clear()  # (`_wait_to_continue`), also one made while the run still closes its executor

        # a loop that waits before its first step (a schedule) gives its turn back soon all the same
        timer = asyncio.get_running_loop().call_later(STARTING_AT_MOST, turn.give_back)
        try:
            executor = run.executor or executors.create(run.executor_name, run.config, run.ws, run.state.task_id)
            loop = Loop(run, executor, self.listeners, self.shared)
            loop.slot = slot
            loop.subscribe(*standard_listeners(loop), begun)
            m.loop = loop
            m.status = Status.RUNNING
            try:
                return await loop.run()
            finally:
                m.loop = None
                with contained():
                    await executor.aclose()
        finally:
            timer.cancel()

    def _resume_ready(self, m: Managed) -> bool:
        """The seed's "Resume Instructions": the hook deleted, or the task moved back to Specs/ (a Kiro
        spec's tasks.md stays where it is); a request or review note in Needs_Action/ deleted."""
        try:
            state = self.store.load(m.task_id).state
        except KiroError:
            return False
        if state.status == Status.COMPLETED:
            return False
        if self.ws.hook_file(m.task_id).exists() or self.ws.global_hook_file.exists():
            return False
        where, path = locate_task(self.ws, self.ws.absolute(state.task_path), m.task_id)
        if path is None or (self.ws.area_of(path) != "Specs" and not kirospec.in_spec_folder(path)):
            return False  # a Kiro spec's tasks.md runs where it is
        if state.stop_reason == StopReason.REQUEST_HUMAN:
            return not self.ws.human_request(m.task_id).exists()
        if state.stop_reason == StopReason.CHECKPOINT:  # a review point: the person deletes the note when done
            return not self.ws.review_note(m.task_id).exists()
        return effective_status(state, alive=False).is_resumable  # we hold its lock: nobody runs it

    async def _wait_to_continue(self, m: Managed) -> bool:
        """Until the paused loop may continue. A loop this supervisor ran waits for a change first (a file
        event, a scan): a pause whose cause is still there the moment it is made (proposals waiting, a
        planted task that cannot run) would otherwise be resumed and paused again as fast as the loop
        starts (issue #39: ~100 times a second until max_iterations): when that cause is there at once, it waits for
        a change (or RESCAN_SECONDS) before it looks. A change counts from the moment the pause is made (the
        run's LoopFinished), not from here: a note deleted while the run closed its executor is not missed."""
        m.status = Status.PAUSED
        if m.outcome is not None and not m.wake.is_set() and self._resume_ready(m):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(m.wake.wait(), RESCAN_SECONDS)
        found = await wait_until(lambda: self.stopping or self._resume_ready(m), m.wake, None, self._poll)
        return bool(found) and not self.stopping

    def _wake_paused(self) -> None:
        for m in self.managed.values():
            m.wake.set()


class _Turn:
    """A loop's turn among the loops starting (STARTING_AT_ONCE), given back once."""

    def __init__(self, sem: asyncio.Semaphore) -> None:
        self.sem: asyncio.Semaphore | None = sem

    def give_back(self) -> None:
        sem, self.sem = self.sem, None
        if sem is not None:
            sem.release()


class Slot:
    """One of `max_parallel_loops` places, held by a running loop. A scheduled task's loop gives its
    place back while it waits for its next run (kiro.core.scheduled) and takes one again to run."""

    def __init__(self, sem: asyncio.Semaphore) -> None:
        self.sem = sem
        self.held = False

    async def acquire(self) -> None:
        await self.sem.acquire()
        self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.sem.release()


def _resumable(outcome: Outcome) -> bool:
    """Paused and stopped loops wait for a person; completed, failed and exhausted ones are done."""
    return outcome.status == Status.PAUSED or (outcome.status == Status.STOPPED
                                               and outcome.reason == StopReason.TASK_MISSING)


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def check_watch_free(ws: Workspace) -> None:
    """Raise when a supervisor already watches this workspace."""
    if locks.is_held(ws.state_dir / "watch.lock"):  # a probe: never takes the lock
        raise UserError(f"`kiro loop watch` already runs for {ws.root} (process "
                        f"{_read_pid(ws.state_dir / 'watch.pid')})")


def hand_back_to_watch(store: StateStore, task_id: str) -> list[str]:
    """`kiro loop resume` on a loop a supervisor keeps: do what the seed's "Resume Instructions"
    say (delete the hook, move the task back to Specs/, clear the agent's request); the supervisor
    sees the change and continues the loop. Returns what was done, for the person."""
    ws = store.ws
    done: list[str] = []
    for hook in (ws.hook_file(task_id),):
        if hook.exists():
            hook.unlink()
            done.append(f"removed {ws.relative(hook)}")
    done += resolved.archive_requests(ws, task_id)  # the request file among them: watch continues the loop
    state = store.load(task_id).state
    where, path = locate_task(ws, ws.absolute(state.task_path), task_id)
    if path is not None and ws.area_of(path) == "Needs_Action":
        back = ws.counterpart(path, "Specs")
        back.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, back)
        done.append(f"moved {ws.relative(path)} back to {ws.relative(back)}")
    return done
