"""The loop: observe -> pick the step -> execute -> verify -> record -> decide, until a stop
condition holds (SPEC §6, seed 004). No rich, no typer: the engine emits events; the CLI renders
them, the event log appends them, the dashboard recomputes from the state.

Ordering that makes a crash at any instant safe (P-1):
  1. the state is saved with the step "in_progress" before the step runs;
  2. the step's box is checked in the task file (atomically) before the state records it completed;
so a state that records a step completed implies its box is checked, and a resumed loop never runs
a completed step again. A crash between 2 and the state save is reconciled on resume (the box is
checked, so the step is recorded as completed, `step_recovered`).
  3. the step's completion is in the event log (`step_completed`, written as it is emitted) before
     the state records it (the save after it, one fdatasync a step); a crash between the two leaves
     the log ahead of the state, and the resume records the step from the log's line, adding no
     second completion line (`_completion_logged`). A step is in its log completed exactly once.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import socket
import stat
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from kiro import timeutil
from kiro.core import conditions, resolved
from kiro.core.conditions import Stop
from kiro.core.guardrails import LoopGuardrails, SharedLimits, Trigger
from kiro.core.hooks import Checkpoint, Feature, LoopListener, Reopen
from kiro.core.looprun import LoopRun
from kiro.core.watch import POLL_FALLBACK, ChangeHub, acquire_hub, release_hub, wait_until
from kiro.errors import ExecutorError, KiroError, TaskFileError, TaskNotFound, raise_errors
from kiro.executors import prompts
from kiro.executors.base import Executor, Guard, StepContext, StepResult
from kiro.executors.verify import run_verify, verify_error, verify_failed
from kiro.fs import diskfull, statcache, writer
from kiro.fs.atomic import atomic_write
from kiro.fs.writer import WriteQueue
from kiro.processes import groups, sandbox
from kiro.processes.spawn import tail
from kiro.status import Status, StopReason
from kiro.store import events as ev
from kiro.store import tasks
from kiro.store.events import Event, EventLog, Listener
from kiro.store.logread import read_since
from kiro.store.messages import Inbox, render
from kiro.store.receipts import VerifyRun
from kiro.store.redact import Redactor
from kiro.store.state import CompletedStep, CurrentStep, FailedStep, clip, first_line
from kiro.store.workspace import locate_task
from kiro.usage import Usage

if TYPE_CHECKING:
    import random

T = TypeVar("T")
CAUSE_CHARS = 1000  # of each line of a loop's `stop_message`: a path in it (an attempt's log) stays whole


@dataclass(eq=False)
class Outcome:
    task_id: str
    status: Status
    reason: str
    message: str
    exit_code: int
    report: str | None = None


def backoff_delay(attempts: int, base: float, cap: float, exponential: bool, rng: random.Random) -> float:
    """Exponential backoff with jitter: base * 2^(attempts-1), capped, then a random factor in
    [0.5, 1.0] so that many loops failing together do not retry in lockstep."""
    if base <= 0:
        return 0.0
    raw = base * (2 ** max(attempts - 1, 0)) if exponential else base
    return min(raw, cap) * (0.5 + rng.random() / 2)


class _LoopGuard(Guard):
    """Mid-step checks the executor makes before each model call and tool call."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop

    async def _gate(self, check: Callable[[], Trigger | None]) -> str | None:
        """Stop conditions first, then guardrails: sleep through waits (a hook still ends them at
        once), turn hard limits into the loop's stop."""
        loop = self.loop
        while True:
            stop = loop.interrupt_check()
            if stop is not None:
                loop._pending_stop = stop
                return stop.reason
            trigger = check()
            if trigger is None:
                return None
            if trigger.action == "wait":
                stop = await loop.guardrail_wait(trigger)
                if stop is not None:
                    loop._pending_stop = stop
                    return stop.reason
                continue
            loop._pending_stop = loop.guardrail_stop(trigger)
            return trigger.limit

    async def before_model_call(self) -> str | None:
        return await self._gate(self.loop.guardrails.before_model_call)

    async def interruption(self) -> str:
        """Woken by the change hub (a hook dropped, the task file moved), as the loop's own waits are."""
        loop = self.loop
        changed = asyncio.Event()
        async with loop.watching(changed) as poll:
            stop = await wait_until(loop.interrupt_check, changed, None, poll)
        assert isinstance(stop, Stop)
        loop._pending_stop = stop
        return stop.reason

    async def before_tool_call(self, name: str, arguments: Mapping[str, Any]) -> str | None:
        return await self._gate(lambda: self.loop.guardrails.before_tool_call(name, arguments))

    async def wait(self, limit: str, seconds: float, message: str, *, figure: Any = None,
                   note: str | None = None) -> str | None:
        loop = self.loop
        stop = await loop.guardrail_wait(Trigger(limit, round(seconds, 3), figure, message, "wait", seconds), note)
        if stop is not None:
            loop._pending_stop = stop
            return stop.reason
        return None

    def stop(self, limit: str, value: Any, figure: Any, message: str) -> str:
        self.loop._pending_stop = self.loop.guardrail_stop(Trigger(limit, value, figure, message, "stop"))
        return limit

    def after_model_call(self, usage: Usage) -> None:
        self.loop.guardrails.record_model_call(usage)

    def after_tool_call(self, name: str, arguments: Mapping[str, Any], error: str | None) -> None:
        self.loop.guardrails.record_tool_call(name, arguments)


# The hooks the engine calls at every step: a feature whose hook is the base's (which does nothing) is not called
# for it (nine features, most of them quiet at a step: ~70 calls and coroutines a step fewer, issue #41)
_STEP_HOOKS = ("each_round", "choose_step", "before_step", "prompt_addition", "after_step", "check_step",
               "step_done", "run_base")


def _by_hook(features: list[Feature]) -> dict[str, list[Feature]]:
    """For each of the step's hooks, the features that override it, in their order."""
    return {hook: [f for f in features if getattr(type(f), hook, None) is not getattr(Feature, hook)]
            for hook in _STEP_HOOKS}


class Loop:
    def __init__(self, run: LoopRun, executor: Executor, listeners: list[Listener] | None = None,
                 shared: SharedLimits | None = None) -> None:
        self.run_spec = run
        self.ws = run.ws
        self.store = run.store
        self.cfg = run.config
        self.settings = run.config.autonomous_loop
        self.state = run.state
        self.task_path = run.task_path
        if not callable(getattr(executor, "build_prompts", None)) or not hasattr(executor, "checks_boxes"):
            raise TypeError(f"executor {getattr(executor, 'name', executor)!r} does not say what it sends and when a "
                            f"step is done: subclass kiro.executors.base.ExecutorBase")
        self.executor = executor
        # The one redactor of this run: every event, state, report and prompt passes through it.
        self.redact = Redactor.for_run(self.cfg) | self.store.redact  # the store's: the serve token
        self.store.use(self.redact)
        self.log = EventLog(self.ws.event_log(self.state.task_id), self.redact)
        self.listeners: list[Listener] = [self.log, *(listeners or [])]
        self.cancel = asyncio.Event()
        self._wake = asyncio.Event()
        self._hub: ChangeHub | None = None
        self._unwatched_said = False  # the warning that the file watcher could not start
        self._ledger: groups.Ledger | None = None  # this run's process groups (kiro.processes.groups)
        self._signal_stop: Stop | None = None
        self._pending_stop: Stop | None = None
        self._rng: random.Random | None = None  # made at the first backoff (random is not imported by every run)
        self._base_elapsed = self.state.metrics.total_duration_seconds
        self._run_started = time.monotonic()
        self.slept = 0.0  # seconds this run spent in backoff and guardrail waits (timed_wait)
        self._first_iteration_of_run = True
        self._stale_since = self.state.updated_at
        self.project_dir = (self.ws.root / self.cfg.project_dir).resolve()
        self.guardrails = LoopGuardrails(self.cfg, self.state, shared or SharedLimits(self.cfg))
        self.features = run.features  # what plugs in beside the engine (kiro.core.hooks.Feature)
        self._hooked = _by_hook(self.features)  # and again as the run begins (`run`), for a feature added since
        self._in_progress: str | None = None  # the step whose box kiro marked `[-]`
        self.inbox = Inbox(self.ws, self.state.task_id)  # SPEC §11, kiro.store.messages
        # The shell executor reads no prompt: its messages stay queued and neither wake nor hurry it.
        self.reads_messages = executor.reads_prompt
        self.loop_listeners: list[LoopListener] = []
        self._finishing = False
        self._finish_report: str | None = None
        self.slot: Any = None  # the watch supervisor's place for this loop (supervisor.Slot), if any
        self.writes = WriteQueue()  # the loop's durable writes, in order, off the event loop (kiro.fs.writer)
        self._area_key: tuple[Path, int, int] | None = None
        self._area: str | None = None
        self._write_problems: list[str] = []
        self._hooks: tuple[str, str, tuple[str, str]] | None = None  # (task id, .hooks/, its stop hooks' names)
        self._save_owed = False  # `save_soon()` was called and no save has been made since
        self._save_held = 0  # inside `aside()`: a yield there does not make the owed save

    @property
    def resumed(self) -> bool:
        return self.run_spec.resumed

    def subscribe(self, *listeners: Listener) -> None:
        """Add listeners (after the event log and the caller's). A `LoopListener` is also told of
        every state save and awaited when the run ends."""
        for listener in listeners:
            self.listeners.append(listener)
            if isinstance(listener, LoopListener):
                self.loop_listeners.append(listener)

    def relocate(self, path: Path, *, area: str | None = None) -> None:
        """The task file is now at `path` (moved by a person, or by a listener): follow it."""
        old = self.ws.relative(self.task_path)
        self.task_path = path
        self.state.task_path = self.ws.relative(path)
        self.emit(ev.TaskMoved(from_=old, to=self.state.task_path, area=area))

    # -- events ----------------------------------------------------------------------------

    def emit(self, event: Event, /) -> None:
        """Stamp a typed event with the loop's task id and iteration and hand it to every listener."""
        if not self.settings.log_every_iteration and event.event in ("iteration_started", "step_started"):
            return
        record = event.stamped(self.state.task_id, self.state.iteration)
        clean, line = self.redact.record(record)
        if clean is not record and clean != record:  # what every listener sees (log, terminal, server) is clean
            event = type(event).model_validate(clean)
            record = event.stamped(self.state.task_id, self.state.iteration)
        if self._finishing and isinstance(event, ev.ReportWritten):
            self._finish_report = event.path
        log = self.log
        for listener in self.listeners:
            if listener is log:  # the record just made (and its JSON, when the redactor made it): not dumped again
                log.append_record(record, clean_json=line if log.redact is self.redact else None)
            else:
                listener(event)

    def _saved(self) -> None:
        for listener in self.loop_listeners:
            listener.saved(self.state)

    def save(self) -> None:
        """Record the state: encoded now, written (fsync, rename) by `self.writes` on a worker
        thread, in order with the loop's other writes. The next observable step awaits `flush()`."""
        self._save_owed = False
        self.state.metrics.total_duration_seconds = round(self.elapsed(), 3)
        self.state.refresh_metrics()
        self.writes.submit(self.store.save_job(self.state), key="state")
        self._saved()

    def save_soon(self) -> None:
        """`save()` when the loop's task next yields to the event loop, or at its next `save()`,
        whichever comes first: an iteration's closing save and the next iteration's opening one
        (with no wait between them) become one record, one append and one fdatasync (issue #12).
        Nothing can observe the difference: no other code runs on the event loop before the task
        yields, and the next observable step (`flush()`, a wait) comes after a yield or a save."""
        if not self._save_owed:
            self._save_owed = True
            asyncio.get_running_loop().call_soon(self._owed_save)

    def _owed_save(self) -> None:
        if self._save_owed and not self._save_held:
            self.save()

    async def aside(self, waiting: Awaitable[T]) -> T:
        """Await `waiting`, a wait in which this loop does nothing anyone can see (the look at the task
        files that the loops of the process share, kiro.executors.control.shared_look): a save `save_soon()`
        owes is not made at that yield but at the loop's next one, or its next `save()`, as when it runs
        alone. So with many loops, too, an iteration's closing save and the next one's opening save are one
        journal record, one append and one fdatasync (issue #41: the look's yield had split them)."""
        self._save_held += 1
        try:
            return await waiting
        finally:
            self._save_held -= 1
            if self._save_owed and not self._save_held:
                asyncio.get_running_loop().call_soon(self._owed_save)

    async def asave(self) -> None:
        """`save()`, then wait until it is on disk (without holding up the other loops)."""
        self.save()
        await self.flush()

    async def flush(self) -> None:
        """Wait until every write queued so far is done; raise the first that failed."""
        if self._save_owed:
            self.save()
        await self.writes.flush()
        self._report_problems()

    def write_report(self, path: Path, text: str, *, fsync: bool = True) -> None:
        """The one way the loop writes a report (completion, progress, escalation, intervention,
        request): atomically, through the redactor, queued behind the loop's earlier writes. A
        report that cannot be written is a warning, not the loop's end."""
        data = self.redact.text(text)

        def write() -> None:
            try:
                atomic_write(path, data, fsync=fsync)
            except OSError as exc:
                if diskfull.is_disk_full(exc):
                    raise
                self._write_problems.append(f"could not write the report {self.ws.relative(path)}: {exc}")

        self.writes.submit(write)

    def _report_problems(self) -> None:
        while self._write_problems:
            self.emit(ev.LoopWarning(message=self._write_problems.pop(0)))

    def transition(self, to: Status, reason: str | None = None) -> None:
        before = self.state.status
        if self.state.transition(to, reason):
            self.emit(ev.StateChanged(from_=before, to=self.state.status, reason=reason))

    def elapsed(self) -> float:
        return self._base_elapsed + (time.monotonic() - self._run_started)

    def run_elapsed(self) -> float:
        """The run time `timeout_seconds` limits: a scheduled task's counts from its run's start."""
        return self.elapsed() - sum(f.run_base()[0] for f in self._hooked["run_base"])

    # -- control from outside --------------------------------------------------------------

    def request_stop(self, reason: str = "signal", message: str = "stopped by a signal") -> None:
        """SIGTERM/SIGINT or `stop --force`: end the current step now, save, exit 3."""
        self._signal_stop = conditions.stopped(reason, message)
        self.cancel.set()
        self._wake.set()

    # -- stop conditions -------------------------------------------------------------------

    def interrupt_check(self) -> Stop | None:
        """Conditions that may end the loop at any safe point, also mid-step: a signal, the task
        moved or gone, a stop hook, the wall-time limit. Cheap: a few stat calls."""
        if self._signal_stop is not None:
            return self._signal_stop
        moved = self._check_task_location()
        if moved is not None:
            return moved
        if self.settings.check_stop_hook:
            hooks = self._hooks
            if hooks is None or hooks[0] != self.state.task_id:
                hooks = self._hooks = (self.state.task_id, os.fspath(self.ws.hooks),
                                       (self.ws.hook_file(self.state.task_id).name, self.ws.global_hook_file.name))
            hook = statcache.first_present(hooks[1], hooks[2])  # a stat of .hooks/ while nothing in it changed
            if hook is not None:
                return conditions.stop_hook(Path(hook), self.ws)
        limit = self.state.timeout_seconds or self.settings.timeout_seconds
        if self.run_elapsed() >= limit:
            return conditions.timed_out(limit, self.run_elapsed())
        return None

    def _task_area(self) -> str | None | bool:
        """The area the task file is in; False when it is not a file at `task_path`. Asked before
        every model and tool call: the area (a realpath) is worked out again only when the file
        there is another one (a move, a rewrite)."""
        try:
            st = os.stat(self.task_path)
        except (OSError, ValueError):
            return False
        if not stat.S_ISREG(st.st_mode):
            return False
        key = (self.task_path, st.st_dev, st.st_ino)
        if self._area_key != key:
            self._area_key, self._area = key, self.ws.area_of(self.task_path)
        return self._area

    def _check_task_location(self) -> Stop | None:
        area = self._task_area()
        if area is not False:
            if area == "Done" and self.settings.check_done_folder:
                return conditions.completed(f"task is in {self.ws.relative(self.task_path)}", "task_in_done")
            if area == "Needs_Action" and self.settings.check_needs_action_folder:
                return conditions.needs_action(f"task is in {self.ws.relative(self.task_path)}; waiting for a person")
            return None
        where, path = locate_task(self.ws, self.task_path, self.state.task_id)
        if path is not None and where in ("Done", "Needs_Action", "Specs"):
            self.relocate(path, area=where)
            return self._check_task_location()
        return conditions.stopped(
            "task_missing",
            f"task file {self.state.task_path} is gone and is in neither Done/ nor Needs_Action/; put it back "
            f"and run `kiro loop resume --task-id {self.state.task_id}`",
        )

    def limit_check(self) -> Stop | None:
        s = self.state
        full = diskfull.hit()
        if full is not None:  # a write found the disk full; the reserve made room to record it
            return conditions.because(StopReason.DISK_FULL, f"disk full (writing {full}); free some space, then run "
                                                            f"`kiro loop resume --task-id {s.task_id}`")
        if s.consecutive_failures >= s.failure_threshold:
            return conditions.failure_threshold(s)
        if s.iteration - sum(f.run_base()[1] for f in self._hooked["run_base"]) >= s.max_iterations:
            return conditions.max_iterations(s)
        return None

    # -- waiting ---------------------------------------------------------------------------

    async def wait(self, seconds: float, *, messages: bool = False) -> Stop | None:
        """Wait, but come back as soon as a stop condition holds (a hook dropped, the task moved,
        a signal): the change hub wakes us on every file change in the folders that steer loops.
        Returns that condition, or None when the time is up. With `messages`, a message queued
        for this loop (SPEC §11) also ends the wait (returning None)."""
        limit = self.state.timeout_seconds or self.settings.timeout_seconds
        seconds = min(seconds, max(limit - self.run_elapsed(), 0.0) + 0.001)
        messages = messages and self.reads_messages

        def check() -> object:
            return self.interrupt_check() or (messages and self.inbox.has_pending())

        async with self.watching(self._wake) as poll:
            found = await wait_until(check, self._wake, seconds, poll)
        return found if isinstance(found, Stop) else None

    @contextlib.asynccontextmanager
    async def watching(self, wake: asyncio.Event) -> AsyncIterator[float]:
        """While the loop waits, the change hub sets `wake` on every change in the folders that steer loops
        (it watches only while someone waits: a loop running its steps looks for itself before each model
        call, tool call and iteration). Gives how often to look anyway: rarely while the watcher runs,
        every POLL_FALLBACK seconds when it could not start (said once, as a warning)."""
        hub = self._hub
        if hub is None:
            yield POLL_FALLBACK
            return
        async with hub.subscribed(wake):
            if hub.failed and not self._unwatched_said:
                self._unwatched_said = True
                self.emit(ev.LoopWarning(message=f"file watcher unavailable ({hub.failed}); checking every "
                                                 f"{hub.poll_interval}s instead"))
            yield hub.poll_interval

    async def timed_wait(self, limit: str, seconds: float, *, messages: bool = False) -> Stop | None:
        """`wait` for a backoff or a guardrail (`limit`), saying how long it really slept (`wait_ended`):
        what `stats` counts, and what a step's duration leaves out (`slept`)."""
        began = time.monotonic()
        stop = None
        try:
            stop = await self.wait(seconds, messages=messages)
        finally:
            slept = max(time.monotonic() - began, 0.0)
            self.slept += slept
            self.emit(ev.WaitEnded(limit=limit, seconds=round(slept, 3), planned=round(seconds, 3),
                                   **({"stopped_by": stop.reason} if stop is not None else {})))
        return stop

    def take_messages(self, where: str) -> str | None:
        """The messages queued for this loop and not yet handed to the agent, as prompt text under
        their headings; recorded as delivered (fsync'd) before the caller sends them, so none is
        ever given twice."""
        pending = self.inbox.pending()
        if not pending:
            return None
        self.inbox.mark_delivered(pending)
        for m in pending:
            self.emit(ev.MessageReceived.model_validate(m.fields()))
            self.emit(ev.MessageDelivered(message_id=m.id, from_=m.sender, where=where))
        return self.redact.text(render(pending))

    def step_guard(self) -> Guard:
        return _LoopGuard(self)

    async def guardrail_wait(self, trigger: Trigger, note: str | None = None) -> Stop | None:
        """Sleep because a guardrail asks for it (status `sleeping`, `sleep_note` what status shows of
        it); a stop condition ends it."""
        self.emit(ev.GuardrailTriggered(**trigger.fields()))
        previous = self.state.status
        self.transition(Status.SLEEPING, trigger.limit)
        self.state.sleep_until = timeutil.iso(timeutil.now() + timedelta(seconds=trigger.seconds))
        self.state.sleep_note = note
        self.save()
        try:  # a forced rest (max_consecutive_turns) also ends for a message (SPEC §11)
            stop = await self.timed_wait(trigger.limit, trigger.seconds,
                                         messages=trigger.limit == "max_consecutive_turns")
        finally:
            self.state.sleep_until = None
            self.state.sleep_note = None
        if stop is None:
            self.guardrails.waited(trigger)
            self.transition(Status.RUNNING if previous == Status.SLEEPING else previous, f"{trigger.limit}_over")
        return stop

    def guardrail_stop(self, trigger: Trigger) -> Stop:
        self.emit(ev.GuardrailTriggered(**trigger.fields()))
        return conditions.guardrail(trigger.limit, trigger.value, trigger.figure, trigger.message)

    async def _sleep_for_executor(self, seconds: float) -> str | None:
        stop = await self.wait(seconds, messages=True)
        if stop is not None:
            self._pending_stop = stop
            return stop.reason
        return None

    # -- the loop --------------------------------------------------------------------------

    async def run(self) -> Outcome:
        s = self.state
        self._hooked = _by_hook(self.features)
        s.pid = os.getpid()
        s.host = socket.gethostname()
        if s.schedule is None:  # a scheduled task counts its scheduled runs (kiro.core.scheduled)
            s.runs += 1
        s.finished_at = None
        s.stop_conditions = type(s.stop_conditions)()
        s.executor = self.executor.name
        begun = ev.LoopResumed if self.run_spec.resumed else ev.LoopStarted
        self.emit(begun(task_path=s.task_path, executor=self.executor.name, max_iterations=s.max_iterations,
                        pid=s.pid, workspace=str(self.ws.root)))
        for warning in self.run_spec.warnings:
            self.emit(ev.LoopWarning(message=warning))
        self._take_over_processes()
        self.transition(Status.RUNNING, "resumed" if self.run_spec.resumed else "started")
        s.stop_reason = s.stop_message = None
        self.store.open_journal(s)  # saves append to the loop's journal from here on (kiro.store.journal)
        with writer.loop_running():  # the only loop in the process writes at once (kiro.fs.writer)
            return await self._run_opened()

    async def _run_opened(self) -> Outcome:
        s = self.state
        self.save()
        stop: Stop | None = None
        try:
            self._hub = acquire_hub(self.ws.root)
            stop = await self._loop()
            # the last step's record (and its box's sync) on disk before the stop is acted on: a completed
            # task moves to Done/ on it, and a crash between the two would leave it there, its step unrecorded
            await self.flush()
        except ExecutorError as exc:
            stop = conditions.because(StopReason.EXECUTOR_ERROR, str(exc))
        except KiroError as exc:
            stop = Stop(Status.STOPPED, StopReason.ERROR, str(exc), exc.exit_code)
        except BaseException as exc:  # an unexpected bug: save what we have, then let it surface
            stop = conditions.because(StopReason.CRASH, f"kiro crashed: {type(exc).__name__}: {exc}")
            self._finish(stop)
            with contextlib.suppress(Exception):
                await self.flush()
            self.store.close_journal(s.task_id)
            await self._close_listeners()
            self.log.close()
            raise
        finally:
            if self._hub is not None:
                await release_hub(self._hub)
                self._hub = None
            if self._ledger is not None:
                sandbox.close_networks(self._ledger.token)  # the network namespace its boxes joined
                self._ledger.close()  # its file goes when no step's group is left
        outcome = self._finish(stop)
        await self.flush()  # the end is observable (exit code, outcome, the dashboard): on disk first
        self.store.close_journal(s.task_id)  # a last snapshot if one is owed; the journal goes
        await self._close_listeners()
        self.log.close()
        return outcome

    async def _close_listeners(self) -> None:
        for listener in self.loop_listeners:
            await listener.aclose()

    def _take_over_processes(self) -> None:
        """Before any step runs: kill what a killed kiro's steps left running (a background child
        would otherwise do the step's work beside the step run again), then record this run's
        groups in the same ledger. Also make kiro unreadable to its children (/proc/<pid>/environ)."""
        groups.make_undumpable()
        ledger = groups.Ledger(self.ws.state_dir / "processes" / f"{self.state.task_id}.json")
        killed = ledger.reap()
        if killed:
            self.emit(ev.LoopWarning(message=f"killed {len(killed)} process(es) a previous run's steps left "
                                             f"behind (pids {', '.join(map(str, killed))})"))
        groups.current_ledger.set(ledger)
        self._ledger = ledger

    async def _loop(self) -> Stop:
        stop = self._check_task_location()
        if stop is not None:
            return stop
        task = self._read_task()
        if isinstance(task, Stop):
            return task
        for feature in self.features:
            await feature.open(self)
        await self._reconcile(task)
        for feature in self.features:
            stop = await feature.begin(self, task)
            if stop is not None:
                return stop
        while True:
            stop = self.interrupt_check()
            if stop is not None and not self._hook_after_the_last_step(stop):
                return stop
            for feature in self._hooked["each_round"]:
                feature.each_round(self)
            task = self._read_task()
            if isinstance(task, Stop):
                return task
            step = task.current_step(self.cfg.include_optional)
            for feature in self._hooked["choose_step"]:
                chosen = feature.choose_step(self, task, step)
                if isinstance(chosen, Stop):
                    return chosen
                step = chosen
            if step is None:
                said = await self._all_done(task)
                if isinstance(said, Stop):
                    return said
                if said:
                    continue  # a recurring task's next run
                stop = self._complete(task)
                for feature in self.features:
                    stop = await feature.completing(self, stop)
                return stop
            stop = self.limit_check()
            if stop is not None:
                return stop
            trigger = self.guardrails.hard_stop() or self.guardrails.wait_needed()
            if trigger is not None:
                if trigger.action != "wait":
                    return self.guardrail_stop(trigger)
                stop = await self.guardrail_wait(trigger)
                if stop is not None:
                    return stop
                continue
            record = self.state.steps.get(step.id)
            if record is not None and record.next_retry_at:
                delay = (timeutil.parse(record.next_retry_at) - timeutil.now()).total_seconds()
                # a message is answered without the backoff (by an executor that reads prompts)
                if delay > 0 and not (self.reads_messages and self.inbox.has_pending()):
                    self.transition(Status.SLEEPING, "backoff")
                    self.state.sleep_until = record.next_retry_at
                    self.save()
                    self.emit(ev.Backoff(step_id=step.id, seconds=round(delay, 3), attempts=record.attempts))
                    try:
                        stop = await self.timed_wait("backoff", delay, messages=True)
                    finally:
                        self.state.sleep_until = None
                    if stop is not None:
                        return stop
                    self.transition(Status.RUNNING, "backoff_over")
                    continue  # re-read: a person may have changed the file meanwhile
            go = True
            for feature in self._hooked["before_step"]:
                stop, go = await feature.before_step(self, step.id, record.attempts if record else 0)
                if stop is not None:
                    return stop
                if not go:
                    break
            if not go:
                continue
            stop = await self._iterate(task, step)
            for feature in self._hooked["after_step"]:
                await feature.after_step(self, step.id)
            if stop is not None:
                return stop
            if self.settings.iteration_delay_seconds:
                stop = await self.wait(self.settings.iteration_delay_seconds, messages=True)
                if stop is not None:
                    return stop

    def _hook_after_the_last_step(self, stop: Stop) -> bool:
        """A stop hook seen when every step is done already (a person's `kiro loop stop` that came
        during the last step) pauses nothing: the loop completes, as it would have a moment earlier. A
        recurring task still pauses: its next run is what the hook stops."""
        if stop.reason != StopReason.STOP_HOOK or self.state.schedule is not None:
            return False
        task = self._read_task()
        return not isinstance(task, Stop) and task.current_step(self.cfg.include_optional) is None

    async def _all_done(self, task: tasks.TaskFile) -> Stop | bool | None:
        """Every step is done: what the features say (a stop, or True to go round again), if any."""
        for feature in self.features:
            said = await feature.all_done(self, task)
            if said is not None:
                return said
        return None

    async def _step_done(self, step: tasks.Step, *, recovering: bool = False) -> Checkpoint | None:
        """The step's box is checked and the state does not record the step yet: a checkpoint for
        `completed_steps[].checkpoint`, from the feature that made one (git)."""
        made = None
        for feature in self._hooked["step_done"]:
            made = await feature.step_done(self, step, recovering=recovering) or made
        return made

    def _read_task(self) -> tasks.TaskFile | Stop:
        """Re-read the task file (a person may have edited it). Its location was just checked by
        `interrupt_check` (or, on the first read, by `_loop`)."""
        try:
            return tasks.load(self.task_path)
        except TaskNotFound:
            stop = self._check_task_location()
            return stop or conditions.stopped("task_missing", f"task file {self.state.task_path} is gone")

    async def _reconcile(self, task: tasks.TaskFile) -> None:
        """After a crash: a step the state shows in progress whose box is checked was finished
        (the crash fell between checking the box and saving the state). Record it."""
        cur = self.state.current_step
        if cur is None or cur.status != "in_progress":
            return
        step = next((st for st in task.steps if st.id == cur.step_id and st.done), None)
        open_same = next((st for st in task.steps if st.id == cur.step_id and not st.done), None)
        if step is None or open_same is not None:
            cur.status = "interrupted"
            self.save()
            return
        logged = self._completion_logged(cur)
        if logged is not None:  # the kill fell after the completion's log line, before its state record
            checkpoint = await self._step_done(step, recovering=True)  # the commit made before the kill
            if isinstance(logged, ev.StepCompleted):
                seconds, attempts = logged.duration_seconds, self._attempts(step.id, logged.attempt)
                summary, agent = "(completed before a restart; recorded after it)", logged.agent
            else:
                seconds = (timeutil.now() - timeutil.parse(cur.started_at)).total_seconds() if cur.started_at else 0
                attempts = self._attempts(step.id, self.state.step_record(step.id).attempts) or 1
                summary, agent = "(recovered after a restart: the box was checked)", None
            self._record_success(step, seconds, summary=summary, attempts=attempts, checkpoint=checkpoint,
                                 agent=agent)
            for listener in self.listeners:  # the receipt (kiro.core.evidence) and the terminal: the log has it
                if listener is not self.log:
                    listener(logged)
            self.save()
            return
        problem = await self._confirm_recovered(task, step)
        if problem is not None:  # SPEC §14: the box is reopened, the step runs again
            with contextlib.suppress(TaskFileError, TaskNotFound):
                tasks.set_marker(self.task_path, step.key, " ", expected=tasks.load(self.task_path))
            self.emit(ev.StepReopened(step_id=step.id, reason=first_line(problem, CAUSE_CHARS)))
            rec = self.state.step_record(step.id)
            rec.attempts += 1  # the killed attempt was one
            rec.last_error = clip(f"the box was checked before a restart, but: {problem}", 3000)
            cur.status = "interrupted"
            self.save()
            return
        started = timeutil.parse(cur.started_at) if cur.started_at else timeutil.now()
        checkpoint = await self._step_done(step, recovering=True)
        self._record_success(step, (timeutil.now() - started).total_seconds(),
                             summary="(recovered after a restart: the box was checked)",
                             attempts=self._attempts(step.id, self.state.step_record(step.id).attempts) or 1,
                             checkpoint=checkpoint)
        self.emit(ev.StepRecovered(step_id=step.id, description=step.title))
        self.save()

    def _completion_logged(self, cur: CurrentStep) -> ev.StepCompleted | ev.StepRecovered | None:
        """The completion record of the attempt a kill cut short (`cur`, in progress in the state) that the
        log already holds: the event log is written when the step completes, its state record at the
        loop's next save (`save_soon`, one fdatasync a step), so a kill between the two leaves the first
        without the second. Its step, at the state's iteration, in the loop's own part of the log (after its
        last `loop_started`: an iteration number is used once a loop, by the attempt that completes)."""
        if not cur.started_at:
            return None
        found: dict[str, Any] | None = None
        for record in read_since(self.log.path, timeutil.parse(cur.started_at)):
            kind = record.get("event")
            if kind == "loop_started":
                found = None  # a new loop on this task id: its iterations count afresh
            elif (kind in ("step_completed", "step_recovered") and record.get("step_id") == cur.step_id
                  and record.get("iteration") == self.state.iteration):
                found = record
        logged = ev.parse(found) if found is not None else None
        return logged if isinstance(logged, (ev.StepCompleted, ev.StepRecovered)) else None

    # -- one iteration ---------------------------------------------------------------------

    def _reinjection_reason(self) -> str | None:
        s, cfg = self.state, self.settings
        if self._first_iteration_of_run and self.run_spec.resumed:
            return "resumed"
        if cfg.reinject_every_n_iterations and s.iteration % cfg.reinject_every_n_iterations == 0:
            return "every_n_iterations"
        if cfg.reinject_after_failure and s.consecutive_failures > 0:
            return "after_failure"
        if cfg.reinject_if_stale_seconds and self._stale_since:
            age = (timeutil.now() - timeutil.parse(self._stale_since)).total_seconds()
            if age > cfg.reinject_if_stale_seconds:
                return "stale"
        return None

    async def _iterate(self, task: tasks.TaskFile, step: tasks.Step) -> Stop | None:
        s = self.state
        before = s.current_step
        s.iteration += 1
        record = s.steps.get(step.id)  # read only; a step not tried yet has none (not made: `bound` drops it)
        attempt = record.attempts + 1 if record is not None else 1
        last_error, last_verify = (record.last_error, record.last_verify_output) if record is not None else (None, None)
        started = timeutil.now()
        slept = self.slept  # a step's duration leaves out its waits (a usage limit's sleep)
        s.current_step = CurrentStep(step_id=step.id, description=step.title or step.text,
                                     status="in_progress", started_at=timeutil.iso(started))
        reason = self._reinjection_reason()
        self._first_iteration_of_run = False
        continuation = prompts.continuation_context(s, step) if reason else None
        verify_cmd = self._verify_command(task)
        system, prompt = self.executor.build_prompts(  # the executor's own prompts and idea of "done"
            task, step, s, workspace=self.ws, attempt=attempt, previous_error=last_error,
            verify_output=last_verify, verify_command=verify_cmd, continuation=continuation,
            task_file=self.task_path,
        )
        s.context.last_prompt = clip(prompts.recent_prompt(prompt, continuation))  # without messages: never repeated
        s.steps_total, s.steps_done = len(task.steps), task.done_count
        await self.asave()
        if diskfull.hit() is not None:  # the last step's saves, written meanwhile, found the disk full
            s.iteration -= 1  # this attempt never ran: the loop stops before it, as it would have
            s.current_step = before
            return self.limit_check()
        self._stale_since = s.updated_at
        self.emit(ev.IterationStarted(step_id=step.id))
        if reason:
            self.emit(ev.Reinjected(reason=reason, step_id=step.id, chars=len(continuation or "")))
        self.emit(ev.StepStarted(step_id=step.id, description=step.title or step.text, attempt=attempt))
        self._in_progress = step.id  # `[-]` is kiro's while the step runs; taken back when the loop ends
        if step.marker != "-":
            with contextlib.suppress(TaskFileError, TaskNotFound):
                # one byte overwritten in place, no fsync (kiro.store.tasks): cheaper here than a thread hop
                task = tasks.set_marker(self.task_path, step.key, "-", expected=task, durable=False)

        remaining = (s.timeout_seconds or self.settings.timeout_seconds) - self.run_elapsed()
        ctx = StepContext(
            task_id=s.task_id, workspace=self.ws, project_dir=self.project_dir, task_path=self.task_path,
            task=task, step=step, iteration=s.iteration, attempt=attempt, prompt=prompt, system_prompt=system,
            reinjected=reason is not None, continuation=continuation, previous_error=last_error,
            verify_output=last_verify,
            timeout_seconds=max(0.1, min(self.cfg.step_timeout_seconds, remaining)),
            config=self.cfg, state=s, cancel=self.cancel, emit=self.emit, sleep=self._sleep_for_executor,
            guard=_LoopGuard(self), redact=self.redact, messages=lambda: self.take_messages("turn"),
        ).redacted()
        delivered = self.take_messages("prompt") if self.reads_messages else None
        if delivered:
            ctx.prompt = f"{ctx.prompt.rstrip()}\n\n{delivered}"
        for feature in self._hooked["prompt_addition"] if self.reads_messages else ():
            added = feature.prompt_addition(self)  # a scheduled run's first prompt: what earlier runs recorded
            if added:
                ctx.prompt = f"{ctx.prompt.rstrip()}\n\n{added}"
        self._pending_stop = None
        try:
            result = await self.executor.run_step(ctx)
        except ExecutorError:
            raise
        except Exception as exc:  # an executor bug is one failed attempt, not the end of the night
            if raise_errors():
                raise
            result = StepResult("failed", error=f"executor error: {type(exc).__name__}: {exc}")
        result.redact(self.redact)  # what an agent or a step printed enters the state, reports and prompts clean
        self.state.usage.add(result.usage)
        self.guardrails.attempt_done()
        s.context.last_response = clip(result.summary or result.error or "")
        cut = self._cut_short(result)
        if cut is not None:
            self._pending_stop = self._pending_stop or cut
            result = StepResult("interrupted", summary=result.summary, usage=result.usage, stop_reason=cut.reason)

        if result.outcome == "interrupted":
            s.current_step.status = "interrupted"
            self.emit(ev.StepInterrupted(step_id=step.id, reason=result.stop_reason or "stop"))
            # an attempt cut short (Ctrl-C, `stop --force`, the task moved, the time limit) is not an
            # iteration run: the step runs again, whole, as the same iteration, and no cap is spent on it
            s.iteration -= 1
            self.save()
            return self._pending_stop or self.interrupt_check() or conditions.stopped(
                result.stop_reason or "interrupted", "the step was interrupted")

        if result.outcome == "request_human":
            question = result.question or "(no question given)"
            s.report_path = self.ws.relative(self.ws.human_request(s.task_id))
            s.current_step.status = "pending"
            self.emit(ev.HumanRequested(step_id=step.id, question=question, path=s.report_path))  # the file: a listener
            self.save()
            return conditions.needs_action(f"the agent asks a person: {first_line(question)} "
                                           f"(see {s.report_path})", "request_human")

        verify = result.verify  # run where the step ran, when that is not here (a temporal worker)
        if result.ok and verify_cmd and verify is None:
            verify = await run_verify(verify_cmd, ctx)
            if not verify.passed:
                result = verify_failed(ctx, verify, result)
        verify_output = verify.output if verify is not None else None
        reopen: Reopen | None = None
        if result.ok:
            problem = await self._check_step(step, verify, result=result)
            if isinstance(problem, Reopen):
                reopen = problem
            elif problem is not None:
                result = StepResult("failed", summary=result.summary, usage=Usage(), error=problem)
        if reopen is not None:
            return await self._reopen(step, attempt, reopen)

        if result.ok:
            sync: list[int] = []
            try:
                # the box byte is written here; its fdatasync runs on the loop's writer thread before
                # the state record of this step (or any snapshot holding it) is written (kiro.store.state)
                done_task, checked = tasks.mark_done(self.task_path, step.key, expected=task,
                                                     include_optional=self.cfg.include_optional, sync_later=sync)
            except (TaskFileError, TaskNotFound) as exc:
                if result.checked_by_executor:
                    checked = [step.id]
                else:
                    result = StepResult("failed", error=f"could not check the box of step {step.id}: {exc}")
                    checked = []
            else:
                s.steps_total = len(done_task.steps)
                s.steps_done = done_task.done_count
            for fd in sync:
                self.store.sync_before_next_save(s.task_id, fd)
            if result.ok:
                self.guardrails.activity()
                self.guardrails.after_attempt(step.id, None)
                checkpoint = await self._step_done(step) or result.checkpoint
                self._in_progress = None  # checked
                # an attempt run beside others says how long it worked (it began before the engine asked)
                took = result.seconds if result.seconds is not None else \
                    (timeutil.now() - started).total_seconds() - (self.slept - slept)
                self._record_success(step, took, summary=result.summary, attempts=self._attempts(step.id, attempt),
                                     checkpoint=checkpoint, agent=result.agent)
                self.emit(ev.StepCompleted(step_id=step.id, description=step.title or step.text,
                                           duration_seconds=round(max(took, 0.0), 3),
                                           attempt=attempt, checked=checked, **self._step_extras(result)))
                await self._after_iteration()
                return None

        self._take_back_box(step)
        self._record_failure(step, result.error or "failed", attempt, verify_output)
        self.emit(ev.StepFailed(step_id=step.id, attempt=attempt, error=tail(result.error or "", 1500),
                                consecutive_failures=s.consecutive_failures, **self._step_extras(result, log=True)))
        stop = None
        allowed = 1 + (self.settings.max_step_retries if self.settings.retry_failed_steps else 0)
        repeated = self.guardrails.after_attempt(step.id, result.error or "failed")
        if repeated is not None and s.consecutive_failures < s.failure_threshold:
            stop = self.guardrail_stop(repeated)
        elif (failed := self._attempts(step.id, attempt)) >= allowed and s.consecutive_failures < s.failure_threshold:
            stop = conditions.step_retries(step.id, failed, self.settings.max_step_retries)
        await self._after_iteration()
        return stop

    async def _reopen(self, step: tasks.Step, attempt: int, reopen: Reopen) -> Stop | None:
        """A feature sent the step back to its agent (a reviewer's changes, SPEC §14): not a failure (no
        backoff, nothing toward failure_threshold or max_step_retries); its next prompt says why, as a
        failed attempt's does. The loop ends with the feature's stop, if any (a pause for a person)."""
        s = self.state
        self._take_back_box(step)
        rec = s.step_record(step.id)
        rec.attempts = attempt
        rec.reopened += 1
        rec.last_error = clip(reopen.reason, 3000)
        rec.last_verify_output = None
        rec.next_retry_at = None
        if s.current_step is not None:
            s.current_step.status = "pending" if reopen.stop is not None else "failed"
        await self._after_iteration()
        return reopen.stop

    def _attempts(self, step_id: str, attempt: int) -> int:
        """The step's attempts up to `attempt`, less the runs a feature sent back (`_reopen`): what counts toward
        max_step_retries and the receipt's `attempts`. Read, not made: a step with no record had none sent back (a
        record made here was one more model a step, cleared by `_record_success` field by field)."""
        rec = self.state.steps.get(step_id)
        return max(attempt - (rec.reopened if rec is not None else 0), 0)

    def _step_extras(self, result: StepResult, *, log: bool = False) -> dict[str, Any]:
        """A step event's optional fields, written only when there is something to say: the agent CLI
        that made the attempt, the loop's cost so far (when its executor reports one) and, with `log`,
        the attempt's log."""
        extras: dict[str, Any] = {"agent": result.agent} if result.agent else {}
        if log and result.log:
            extras["log"] = result.log
        if self.state.usage.cost_usd:
            extras["cost_usd"] = round(self.state.usage.cost_usd, 6)
        return extras

    def _cut_short(self, result: StepResult) -> Stop | None:
        """What ended the attempt when it was not the step's doing: a person moved (or removed) the
        task file while it ran, or the loop's run-time limit cut it. Such an attempt is interrupted,
        not failed. The location check also follows a moved file, so that a step that did succeed
        gets its box checked where the file is now."""
        moved = self._check_task_location()
        if result.outcome in ("interrupted", "request_human"):
            return None
        if moved is not None and (not result.ok or moved.reason == "task_missing"):
            return moved
        limit = self.state.timeout_seconds or self.settings.timeout_seconds
        if not result.ok and self.run_elapsed() >= limit:
            return conditions.timed_out(limit, self.run_elapsed())
        return None

    def _release_in_progress_box(self) -> None:
        """The loop ends (any way but a kill): no step runs any more, so kiro's `[-]` goes back to
        `[ ]` wherever the task file is now. A step that completed was checked already."""
        step_id, self._in_progress = self._in_progress, None
        if step_id is not None:
            resolved.release_in_progress_box(self.ws, self.task_path, self.state.task_id, step_id)

    def _take_back_box(self, step: tasks.Step) -> None:
        """A failed attempt of an executor whose agent checks boxes (`checks_boxes`: the command
        executor's agent CLIs) never counts as done: kiro puts a box it checked back to `[-]`. With
        the other executors only a person checks boxes, and a box a person checks means "skip this
        step", even while an attempt at it is failing."""
        if not self.executor.checks_boxes:
            return
        with contextlib.suppress(TaskFileError, TaskNotFound):
            fresh = tasks.load(self.task_path)
            again = fresh.find(step.key) or next((x for x in fresh.steps if x.id == step.id), None)
            if again is not None and again.done:
                tasks.set_marker(self.task_path, again.key, "-", expected=fresh)
                self.emit(ev.LoopWarning(message=f"step {step.id} failed but its box was checked; unchecked it"))

    def _verify_command(self, task: tasks.TaskFile) -> str | None:
        v = self.cfg.verify
        return v if isinstance(v, str) and v.strip() else None

    async def _check_step(self, step: tasks.Step, verify: VerifyRun | None, *, recovering: bool = False,
                          result: StepResult | None = None) -> str | Reopen | None:
        """What the features say of a step its executor (or, `recovering`, a box found checked after a
        kill) says is done: the first reason it is not (SPEC §14: protected paths, test counts, a review), or
        None."""
        for feature in self._hooked["check_step"]:
            problem = await feature.check_step(self, step, verify, recovering=recovering, result=result)
            if problem is not None:
                return problem
        return None

    async def _confirm_recovered(self, task: tasks.TaskFile, step: tasks.Step) -> str | None:
        """SPEC §14: a box checked during an attempt that kiro never recorded (a kill, a stop) counts only
        after verify passes and the features' checks hold, as after any attempt; else the reason."""
        verify_cmd = self._verify_command(task)
        verify = None
        if verify_cmd:
            s = self.state
            ctx = StepContext(
                task_id=s.task_id, workspace=self.ws, project_dir=self.project_dir, task_path=self.task_path,
                task=task, step=step, iteration=s.iteration, attempt=max(s.step_record(step.id).attempts, 1),
                prompt="", system_prompt="", reinjected=False, continuation=None, previous_error=None,
                verify_output=None, timeout_seconds=self.cfg.step_timeout_seconds, config=self.cfg, state=s,
                cancel=self.cancel, emit=self.emit, sleep=self._sleep_for_executor, redact=self.redact)
            verify = await run_verify(verify_cmd, ctx)
            if not verify.passed:
                return verify_error(verify)
        problem = await self._check_step(step, verify, recovering=True)
        return str(problem) if problem is not None else None

    def _record_success(self, step: tasks.Step, seconds: float, *, summary: str, attempts: int,
                        checkpoint: Checkpoint | None = None, agent: str | None = None) -> None:
        s = self.state
        finished = timeutil.now()
        s.completed_steps.append(CompletedStep(
            step_id=step.id, description=step.title or step.text, completed_at=timeutil.iso(finished),
            duration_seconds=round(max(seconds, 0.0), 3), iteration=s.iteration,
            attempts=attempts, summary=clip(summary, 500),
            checkpoint=checkpoint.commit if checkpoint else None,
            checkpoint_note=checkpoint.note if checkpoint else None, agent=agent))
        s.total_successes += 1
        s.consecutive_failures = 0
        rec = s.steps.get(step.id)
        if rec is not None:  # none made to be cleared: an absent record is a cleared one (LoopState.bound)
            rec.attempts = 0
            rec.reopened = 0
            rec.last_error = None
            rec.next_retry_at = None
            rec.last_verify_output = None
        if s.current_step is not None:
            s.current_step.status = "completed"

    def _record_failure(self, step: tasks.Step, error: str, attempt: int, verify_output: str | None) -> None:
        s = self.state
        s.total_failures += 1
        s.consecutive_failures += 1
        s.failed_steps.append(FailedStep(step_id=step.id, description=step.title or step.text,
                                         failed_at=timeutil.iso(), error=clip(error, 2000),
                                         retry_count=self._attempts(step.id, attempt) - 1,
                                         iteration=s.iteration))
        rec = s.step_record(step.id)
        rec.attempts = attempt
        rec.last_error = clip(error, 3000)
        rec.last_verify_output = clip(verify_output, 3000) if verify_output else None
        if self._rng is None:
            import random

            self._rng = random.Random()
        delay = backoff_delay(self._attempts(step.id, attempt), self.settings.backoff_base_seconds,
                              self.settings.backoff_max_seconds,
                              self.settings.exponential_backoff, self._rng)
        rec.next_retry_at = timeutil.iso(timeutil.now() + timedelta(seconds=delay)) if delay > 0 else None
        if s.current_step is not None:
            s.current_step.status = "waiting_retry" if delay > 0 else "failed"

    async def _after_iteration(self) -> None:
        """Record the attempt. The save is made when the loop next yields or saves (`save_soon`):
        on the straight path that is the next step's own `asave`, so one record, one append and one
        wait cover both saves; any wait, sleep or end of the run before it saves first."""
        s = self.state
        n = self.settings.backup_state_every_n_iterations
        if n and s.iteration % n == 0:
            self.save()  # the backup is of this iteration's save
            self.writes.submit(self.store.backup_job(s))  # with the journal: a snapshot now, copied
        else:
            self.save_soon()

    # -- the end ---------------------------------------------------------------------------

    def _complete(self, task: tasks.TaskFile) -> Stop:
        with contextlib.suppress(TaskFileError, TaskNotFound):
            task, _ = tasks.check_finished_parents(self.task_path, include_optional=self.cfg.include_optional)
        self.state.steps_total = len(task.steps)
        self.state.steps_done = task.done_count
        n, done = len(task.steps), task.done_count
        if done < n:  # optional steps left open (include_optional off): say so, as the step counts do
            left = n - done
            return conditions.completed(f"all required steps done: {done} of {n} checked, {left} optional "
                                        f"step{'s' if left != 1 else ''} left open")
        return conditions.completed(f"all {n} steps done" if n != 1 else "the one step is done")

    def _cause(self, stop: Stop) -> str:
        """How the run ended, in one line for `status` and the dashboards: the stop's message, and for a
        loop that failed, the first line of its last error (which names the attempt's log, whole)."""
        cause = first_line(stop.message, CAUSE_CHARS)
        failed = self.state.failed_steps
        if stop.status == Status.FAILED and failed:
            cause = f"{cause}; last error (step {failed[-1].step_id}): {first_line(failed[-1].error, CAUSE_CHARS)}"
        return cause

    def _finish(self, stop: Stop) -> Outcome:
        """Record how the loop ended, then tell the listeners: on `stop_condition` the task moves to
        Done/ and the report is written, on `loop_finished` the state is archived and notifiers run
        (kiro.core.listeners)."""
        s = self.state
        self._release_in_progress_box()
        if stop.reason.state_flag is not None:
            setattr(s.stop_conditions, stop.reason.state_flag, True)
        if stop.status == Status.TIMED_OUT:
            s.timeout_reached = True
        s.stop_reason = stop.reason
        s.stop_message = self.redact.text(self._cause(stop))
        self.transition(stop.status, stop.reason)
        if not stop.status.is_active:
            s.finished_at = timeutil.iso()
        s.pid = None
        if s.current_step is not None and stop.status == Status.COMPLETED:
            s.current_step = None
        if s.schedule is not None and stop.status == Status.COMPLETED:
            s.next_run_at = None  # the schedule ends with the task in Done/
        if stop.status == Status.COMPLETED:
            for note in resolved.archive_requests(self.ws, s.task_id):
                self.emit(ev.RequestResolved(message=note))
        self._finishing, self._finish_report = True, None
        try:
            self.emit(ev.StopCondition(**stop.fields()))
        finally:
            self._finishing = False
        report = self._finish_report
        self.save()
        self.emit(ev.LoopFinished(status=stop.status, reason=stop.reason, exit_code=stop.exit_code,
                                  message=stop.message, iterations=s.iteration, report=report))
        if report is None and stop.reason is StopReason.REQUEST_HUMAN:
            report = s.report_path  # the request file, written when the agent asked
        return Outcome(s.task_id, stop.status, stop.reason, stop.message, stop.exit_code, report)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""What stops a loop run in the foreground, state saved (exit 3): `kill`, Ctrl-C, and the terminal closing."""


def on_signals(callback: Callable[[str], None]) -> Callable[[], None]:
    """Call `callback(signal name)` on SIGTERM, SIGINT and SIGHUP in the running event loop; returns the
    function that removes the handlers again. Once one came, the stop is under way: the same signals
    coming again while the process winds down (a second Ctrl-C) are let go, not a KeyboardInterrupt."""
    aloop = asyncio.get_running_loop()
    installed = []
    came: list[str] = []

    def heard(name: str) -> None:
        came.append(name)
        callback(name)

    for sig in STOP_SIGNALS:
        try:
            aloop.add_signal_handler(sig, heard, signal.Signals(sig).name)
            installed.append(sig)
        except (NotImplementedError, RuntimeError):
            pass

    def remove() -> None:
        for sig in installed:
            aloop.remove_signal_handler(sig)
            if came:  # stopping already: the rest of the way out is not cut short (a handler, not SIG_IGN:
                signal.signal(sig, _let_go)  # a process started from here still stops on them)
        if came:
            atexit.register(_ignored_at_exit)

    return remove


def _let_go(signum: int, frame: object) -> None:
    return None


def _ignored_at_exit() -> None:
    """The interpreter, ending, puts a Python handler back to the default (death by the signal, exit 130):
    the last stretch of a process that stopped on a signal ignores the stop signals at the system's level."""
    for sig in STOP_SIGNALS:
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, signal.SIG_IGN)


def install_signal_handlers(loops: list[Loop]) -> Callable[[], None]:
    """SIGTERM / SIGINT / SIGHUP stop every loop of this process at once (state saved, exit 3)."""

    def stop_all(name: str) -> None:
        for lp in loops:
            lp.request_stop("signal", f"stopped by {name}")

    return on_signals(stop_all)
