"""The digest and the notifications that reach a phone (SPEC §14), a listener beside the engine.

`DigestFeed` is one of every loop's listeners (kiro.core.listeners.standard):

- when the loop ends (its `aclose`, after the engine put its last state and events on disk), it writes
  `Logs/digest/<date>.md` (kiro.views.digest) atomically through the loop's redactor; loops of one process
  and workspace that end together share one computation (`_Shared`);
- with `digest_at: "HH:MM"`, a clock writes the digest each day at that time while the loop runs, and sends
  it (`notify_on: digest`); of all the loops running then, in this process or another, the one that creates
  `.state/digest/<date>.sent` first writes and sends it;
- to the `notify` URLs (Apprise, kiro.core.notify.send) it sends the `notify_on` kinds: `loop_finished`
  (with the digest), `human_requested`, `approval_waiting` (a step proposal or a protected-path change in
  `Pending_Approval/`, or a loop paused for one),
  `usage_limit` (a limit longer than `max_limit_wait_seconds` ended the loop).

Sending runs beside the loop; a notifier that fails or hangs is a `notifier_failed` event (the URL's place
in the list, never the URL), never a stop. Everything sent passes the loop's redactor.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from datetime import date, datetime, timedelta
from typing import TYPE_CHECKING, cast

from kiro import timeutil
from kiro.core.hooks import LoopListener
from kiro.core.notify import SEND_TIMEOUT, send
from kiro.errors import contained
from kiro.fs.atomic import atomic_write
from kiro.status import StopReason
from kiro.store import events
from kiro.views import digest

if TYPE_CHECKING:
    from kiro.core.hooks import LoopHandle
    from kiro.store.redact import Redactor
    from kiro.store.statestore import StateStore

CLOCK_TICK = 60.0  # the clock looks at the time at least this often (a suspended laptop, a changed clock)
# A loop's end says which kind of notification it is: the reason, else loop_finished.
END_KINDS: dict[str, str] = {StopReason.REQUEST_HUMAN: "human_requested",
                             StopReason.APPROVAL_PENDING: "approval_waiting",
                             StopReason.MAX_LIMIT_WAIT_SECONDS: "usage_limit"}


def write(store: StateStore, day: date, digest_at: str | None, redact: Redactor) -> str:
    """Compute the digest dated `day`, write it to Logs/digest/<day>.md (atomically, redacted); its text."""
    text = redact.text(digest.render(digest.compute(store, day, digest_at)))
    # a file or folder name that is not UTF-8 (a lone surrogate) is written as \udcXX, never a crash
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    atomic_write(digest.path(store.ws, day), text)
    return text


class _Shared:
    """One digest computation for the loops of a workspace that end together in this process: a loop that ends
    before the running computation began joins it; one that ends after it began waits for the next."""

    jobs: dict[tuple[str, int], _Shared] = {}  # (workspace, event loop): a job is of one event loop

    def __init__(self, previous: asyncio.Task[str] | None) -> None:
        self.started = False
        self.previous = previous
        self.task: asyncio.Task[str] | None = None

    @classmethod
    async def digest(cls, loop: LoopHandle, day: date) -> str:
        key = (str(loop.ws.root), id(asyncio.get_running_loop()))
        job = cls.jobs.get(key)
        if job is None or job.started or job.task is None or job.task.done():
            job = cls(job.task if job is not None else None)
            job.task = asyncio.get_running_loop().create_task(job._run(loop, day))
            cls.jobs[key] = job
        assert job.task is not None
        return await asyncio.shield(job.task)

    async def _run(self, loop: LoopHandle, day: date) -> str:
        await asyncio.sleep(0)  # loops ending in the same turn join this one
        if self.previous is not None:
            with contextlib.suppress(Exception):
                await self.previous
        self.started = True
        return await asyncio.to_thread(write, loop.store, day, loop.cfg.digest_at, loop.redact)


class DigestFeed(LoopListener):
    """Writes the digest when the loop ends and at `digest_at`; sends what `notify_on` names to `notify`."""

    def __init__(self, loop: LoopHandle) -> None:
        super().__init__(loop)
        self.running: set[asyncio.Task[None]] = set()
        self.clock: asyncio.Task[None] | None = None
        self.finished: events.LoopFinished | None = None
        self.closed = False

    def __call__(self, event: events.Event) -> None:
        if self.clock is None and not self.closed and self.loop.cfg.digest_at:
            self.clock = asyncio.get_running_loop().create_task(self._clock(self.loop.cfg.digest_at),
                                                                name="kiro-digest-clock")
        if isinstance(event, events.LoopFinished):
            self.finished = event
        elif event.event == "steps_proposed":
            proposed = cast("events.StepsProposed", event)
            self._beside("approval_waiting", f"kiro: loop {self.loop.state.task_id}: a step proposal waits for a "
                                             f"person", f"{proposed.proposal}: move it to Approved/ or Rejected/ "
                                                        f"({len(proposed.steps)} steps proposed)")
        elif event.event == "protected_paths_changed":
            changed = cast("events.ProtectedPathsChanged", event)
            if changed.proposal:
                self._beside("approval_waiting", f"kiro: loop {self.loop.state.task_id}: step {changed.step_id} "
                                                 f"changed protected paths", f"{changed.proposal}: move it to "
                                                 f"Approved/ to let the change through "
                                                 f"({', '.join(changed.changes[:10])})")

    # -- sending -----------------------------------------------------------------------------------

    def _wanted(self, kind: str) -> bool:
        return bool(self.loop.cfg.notify) and kind in self.loop.cfg.notify_on

    async def _send(self, kind: str, title: str, body: str, *, warning: bool = False) -> None:
        loop = self.loop
        problems = await send(loop.cfg.notify, loop.redact.text(title), loop.redact.text(body), warning=warning)
        for problem in problems:
            loop.emit(events.NotifierFailed(kind=kind, error=loop.redact.text(problem)))

    def _beside(self, kind: str, title: str, body: str) -> None:
        """Send without holding up the loop; `aclose` waits for what is still going."""
        if not self._wanted(kind):
            return
        task = asyncio.get_running_loop().create_task(self._send(kind, title, body))
        self.running.add(task)
        task.add_done_callback(self.running.discard)

    # -- the daily clock -----------------------------------------------------------------------------

    async def _clock(self, digest_at: str) -> None:
        due = digest.next_time(timeutil.now(), digest_at)
        while True:
            left = (due - timeutil.now()).total_seconds()
            if left > 0:
                await asyncio.sleep(min(left, CLOCK_TICK))
                continue
            day = due.astimezone().date()  # the period that ended now is dated today
            due = digest.next_time(due + timedelta(seconds=1), digest_at)
            if not self._claim(day):
                continue
            text: str | None = None
            with contained():
                try:
                    text = await _Shared.digest(self.loop, day)
                except OSError as exc:
                    self.loop.emit(events.LoopWarning(message=f"could not write the digest: {exc}"))
            if text is None:
                continue
            if self._wanted("digest"):
                await self._send("digest", f"kiro digest {day.isoformat()}", text)

    def _claim(self, day: date) -> bool:
        """True for the first loop (of any process) to ask for `day`'s daily digest."""
        folder = self.loop.ws.state_dir / "digest"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(folder / f"{day.isoformat()}.sent", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return False
        except OSError as exc:
            self.loop.emit(events.LoopWarning(message=f"could not write the digest: {exc}"))
            return False
        os.close(fd)
        return True

    # -- the end -------------------------------------------------------------------------------------

    async def aclose(self) -> None:
        self.closed = True
        if self.clock is not None:
            self.clock.cancel()
            with contextlib.suppress(BaseException):
                await self.clock
        end, loop = self.finished, self.loop
        if end is not None:
            text: str | None = None
            with contained():  # a bug in the digest is no reason to lose the loop's end (raised in tests)
                try:
                    text = await _Shared.digest(loop, digest.day_of(datetime.now().astimezone(), loop.cfg.digest_at))
                except OSError as exc:
                    loop.emit(events.LoopWarning(message=f"could not write the digest: {exc}"))
            kind = END_KINDS.get(end.reason, "loop_finished")
            if self._wanted(kind):
                title = f"kiro: loop {loop.state.task_id} {end.status} ({end.reason})"
                body = end.message + (f"\n\nSee {end.report}" if end.report else "") + (
                    f"\n\n{text}" if text else "")
                await self._send(kind, title, body, warning=end.status != "completed")
        if self.running:  # bounded by the send's own timeout
            await asyncio.wait(set(self.running), timeout=SEND_TIMEOUT + 5)

