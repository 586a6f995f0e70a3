"""What happens because of a loop's events, outside the loop (STYLE 13): the engine emits; these
listen. The runner (and the watch supervisor) registers them on each loop with `standard(loop)`.

- `DoneMover`     a completed task moves from Specs/ to Done/ (`auto_move_to_done`)
- `ReportWriter`  completion report, intervention request, escalation, progress reports
- `Archiver`      a completed loop's state goes to .state/archive/ (`archive_state_file`)
- `Notifier`      the `on_event` commands (completed, failed, paused, limit, finished)
- `DashboardFeed` Dashboard.md, rewritten as this process's loops change
- `DigestFeed`    Logs/digest/<date>.md and the `notify` URLs (kiro.core.digest)

Each is a `LoopListener`: called with every event of its loop, told after every state save, and
awaited (`aclose`) when the run ends. Order matters where one builds on another: the task is moved
before the completion report names where it went.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
from typing import TYPE_CHECKING, Final, cast

from kiro import timeutil
from kiro.core.hooks import LoopListener
from kiro.core.notify import NOTIFIER_TIMEOUT, run_notifier
from kiro.errors import KiroError
from kiro.fs import ownwrites
from kiro.status import Status, StopReason
from kiro.store import events, tasks
from kiro.store.state import LoopState
from kiro.views import dashboard, reports

if TYPE_CHECKING:
    from kiro.core.hooks import LoopHandle


class DoneMover(LoopListener):
    """On a completed stop: move the task file from Specs/ to Done/, same relative path."""

    def __call__(self, event: events.Event) -> None:
        if not isinstance(event, events.StopCondition) or event.status != Status.COMPLETED:
            return
        loop = self.loop
        if event.reason == StopReason.TASK_IN_DONE or not loop.settings.auto_move_to_done:
            return
        if loop.ws.area_of(loop.task_path) != "Specs":
            return
        try:
            self._move()
        except OSError as exc:
            loop.emit(events.LoopWarning(message=f"could not move the task to Done/: {exc}"))

    def _move(self) -> None:
        loop = self.loop
        source = loop.task_path
        target = loop.ws.counterpart(source, "Done")
        if target.exists():
            stamp = timeutil.now().strftime("%Y%m%d_%H%M%S")
            target = target.with_name(f"{target.stem}_{loop.state.task_id}_{stamp}{target.suffix}")
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(source, target)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            import shutil  # Done/ on another file system: copied (shutil is not imported by every run)

            shutil.move(str(source), str(target))
        ownwrites.note_own_removal(source)  # kiro's own move wakes no watcher of this process
        ownwrites.note_own_write(target)
        with contextlib.suppress(OSError):  # leave no empty spec folder behind in Specs/
            if source.parent != loop.ws.specs and not any(source.parent.iterdir()):
                source.parent.rmdir()
        loop.relocate(target, area="Done")


class ReportWriter(LoopListener):
    """The markdown reports of SPEC §6: on a stop, the completion report (completed), intervention
    request (max_iterations, timed_out) or escalation (failed); every
    `progress_report_every_n_iterations`, a progress report."""

    def __call__(self, event: events.Event) -> None:
        if isinstance(event, events.StopCondition):
            self._final(event)
        elif event.event == "human_requested":  # the agent asked a person (request_human): the file the pause names
            loop = self.loop
            text = reports.human_request(loop.state, question=cast("events.HumanRequested", event).question)
            loop.write_report(loop.ws.human_request(loop.state.task_id), text)
        elif event.event in ("step_completed", "step_failed"):
            self._progress()

    def _final(self, stop: events.StopCondition) -> None:
        loop, s = self.loop, self.loop.state
        status = Status(stop.status)
        try:
            if status == Status.COMPLETED and loop.settings.create_completion_report:
                report = loop.ws.completion_report(s.task_id)
                moved_to = s.task_path if loop.ws.area_of(loop.task_path) == "Done" else None
                loop.save()  # final metrics into the report
                loop.write_report(report, reports.completion_report(s, moved_to=moved_to))
            elif status in (Status.MAX_ITERATIONS, Status.TIMED_OUT):
                report = loop.ws.intervention_request(s.task_id)
                loop.write_report(report, reports.intervention_request(s, reason=stop.reason, detail=stop.message))
            elif status == Status.FAILED:
                report = loop.ws.escalation(s.task_id)
                loop.write_report(report, reports.escalation(s, reason=stop.reason, detail=stop.message,
                                                             recent=s.failed_steps[-5:]))
            else:
                return
        except OSError as exc:
            loop.emit(events.LoopWarning(message=f"could not write the report: {exc}"))
            return
        s.report_path = loop.ws.relative(report)
        loop.emit(events.ReportWritten(kind=report.parent.name if status == Status.COMPLETED else status,
                                       path=s.report_path))

    def _progress(self) -> None:
        loop, s = self.loop, self.loop.state
        every = loop.settings.progress_report_every_n_iterations
        if not loop.settings.create_progress_reports or not every or s.iteration % every:
            return
        try:
            task = tasks.load(loop.task_path)
        except KiroError:
            return
        listed = _window(task)
        steps = [(st.id, st.title or st.text, st.done) for st in task.steps[listed]]
        text = reports.progress_report(s, steps=steps, done=task.done_count, total=len(task.steps),
                                       before=listed.start, after=len(task.steps) - listed.stop)
        path = loop.ws.progress_report(s.task_id, s.iteration)
        loop.write_report(path, text, fsync=False)
        loop.emit(events.ReportWritten(kind="progress_report", path=loop.ws.relative(path)))


PROGRESS_STEPS_LISTED: Final = 300
"""A progress report lists every step of a file up to this long; of a longer one, this many around
the current step (reports every 25 iterations of a 5,000-step file would otherwise write 250 KB
each, and take longer than the iterations between them: issue #12)."""


def _window(task: tasks.TaskFile) -> slice:
    """The steps a progress report lists: all of them, or PROGRESS_STEPS_LISTED from a third of
    that above the current step (the first open one; the last ones when all are done)."""
    n = len(task.steps)
    if n <= PROGRESS_STEPS_LISTED:
        return slice(0, n)
    current = task.current_step(include_optional=True)
    at = current.index if current is not None else n
    start = max(0, min(at - PROGRESS_STEPS_LISTED // 3, n - PROGRESS_STEPS_LISTED))
    return slice(start, start + PROGRESS_STEPS_LISTED)


class Archiver(LoopListener):
    """A completed loop's state file moves to .state/archive/ once the loop has finished."""

    def __call__(self, event: events.Event) -> None:
        if (isinstance(event, events.LoopFinished) and event.status == Status.COMPLETED
                and self.loop.settings.archive_state_file):
            # after the loop's last save, or in its place when that is still queued (it holds all the save does)
            self.loop.writes.submit(self.loop.store.archive_job(self.loop.state), key="state")


class Notifier(LoopListener):
    """Runs the `on_event` command of a kind beside the loop: `limit` when a guardrail triggers; the
    status's kind and `finished` when the loop ends. A notifier that fails is logged
    (`notifier_failed`) and never stops the loop; the run waits for running notifiers at its end."""

    def __init__(self, loop: LoopHandle) -> None:
        super().__init__(loop)
        self.running: set[asyncio.Task[None]] = set()

    def __call__(self, event: events.Event) -> None:
        if event.event == "guardrail_triggered":
            limit = cast("events.GuardrailTriggered", event)
            self.notify("limit", limit.limit, limit.message)
        elif isinstance(event, events.LoopFinished):
            s = self.loop.state
            report = event.report or (s.report_path if event.reason == StopReason.REQUEST_HUMAN else None)
            kind = Status(event.status).notify_kind
            if kind is not None:
                self.notify(kind, event.reason, event.message, report)
            self.notify("finished", event.reason, event.message, report)

    def notify(self, kind: str, reason: str, message: str, report: str | None = None) -> None:
        loop = self.loop
        command = loop.cfg.on_event.get(kind)
        if not command:
            return
        s = loop.state
        facts = {"event": kind, "task_id": s.task_id, "status": str(s.status), "reason": reason, "message": message,
                 "task_path": s.task_path, "workspace": str(loop.ws.root),
                 "report": str(loop.ws.absolute(report)) if report else ""}

        async def go() -> None:
            problem = await run_notifier(command, facts, loop.ws.root)
            if problem is not None:  # not the command: it may hold a token
                loop.emit(events.NotifierFailed(kind=kind, error=problem))

        task = asyncio.get_running_loop().create_task(go())
        self.running.add(task)
        task.add_done_callback(self.running.discard)

    async def aclose(self) -> None:
        if self.running:  # bounded by the notifiers' own timeout
            await asyncio.wait(set(self.running), timeout=NOTIFIER_TIMEOUT + 5)


class DashboardFeed(LoopListener):
    """Hands the loop's live state to the workspace's Dashboard.md writer (one per process and
    workspace, at most one write a second); from the loop's end on, its state is read from disk."""

    def __init__(self, loop: LoopHandle) -> None:
        super().__init__(loop)
        self.service: dashboard.DashboardService | None = None
        self.closed = False

    def saved(self, state: LoopState) -> None:
        if self.service is None and not self.closed:
            self.service = dashboard.acquire(self.loop.ws, self.loop.store)
        if self.service is not None:
            self.service.update(state)

    def __call__(self, event: events.Event) -> None:
        if isinstance(event, events.LoopFinished) and self.service is not None:
            self.service.forget(self.loop.state)

    async def aclose(self) -> None:
        self.closed = True
        if self.service is not None:
            self.service.forget(self.loop.state)
            service, self.service = self.service, None
            await dashboard.release(service)


def standard(loop: LoopHandle) -> list[LoopListener]:
    """The listeners every loop run by kiro gets, in the order they must hear an event."""
    from kiro.core.digest import DigestFeed

    return [DoneMover(loop), ReportWriter(loop), Archiver(loop), Notifier(loop), DashboardFeed(loop), DigestFeed(loop)]
