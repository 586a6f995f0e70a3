"""A recurring task's runs inside one loop (SPEC §11; the policy is in kiro.core.schedule's docstring).

The engine calls `ScheduleRunner` at four narrow hooks:
  - `before_first_run`: a new scheduled loop waits for its first fire (cron) or starts at once
    (`every`); a loop resumed between runs waits for its next fire, or makes one catch-up run now
    when fires were missed while nothing ran; a loop resumed mid-run just continues that run;
  - `after_run` (every step done): the forced run summary, the run's report, then the wait for the
    next fire, then the boxes unchecked for the next run;
  - `preamble` (the first prompt of a run): what earlier runs recorded;
  - `run_elapsed_base` / `run_iteration_base`: `timeout_seconds` and `max_iterations` count per run.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import TYPE_CHECKING, Any

from kiro import timeutil
from kiro.core import precheck, schedule
from kiro.core.conditions import Stop
from kiro.core.schedule import Schedule
from kiro.errors import KiroError, TaskFileError, TaskNotFound
from kiro.status import Status
from kiro.store import events as ev
from kiro.store import tasks
from kiro.store.state import ScheduleInfo, first_line
from kiro.usage import Usage
from kiro.views import reports

if TYPE_CHECKING:
    from kiro.core.hooks import LoopHandle

SUMMARY_SYSTEM = ("You write the summary of one finished run of a recurring task. The next run of the task starts "
                  "from your summary, with no other memory of this run.")
SUMMARY_PROMPT = """Run {run} of the recurring task "{title}" ({schedule}) is finished: every step is done.

Steps of this run and what was reported for each:
{steps}

Write the run summary the next run will start from: what was done and checked, what was found, and what
was deferred or should be looked at next time. Plain text, at most 200 words. Reply with the summary only."""


def attach(loop: LoopHandle, task: tasks.TaskFile) -> ScheduleRunner | None:
    """The runner for a scheduled task, None for a plain one. The value was checked when the loop
    was prepared; a value broken since then is said once and the task runs as a plain one."""
    try:
        sched = schedule.of_task(task, loop.ws.relative(loop.task_path))
    except KiroError as exc:
        loop.emit(ev.LoopWarning(message=f"{exc}; the task runs once, without its schedule"))
        return None
    if sched is None:
        return None
    return ScheduleRunner(loop, sched)


class ScheduleRunner:
    def __init__(self, loop: LoopHandle, sched: Schedule) -> None:
        self.loop = loop
        self.sched = sched
        self.tag = schedule.memory_source(loop.state.task_id)
        self._preamble_due = False
        s = loop.state
        if s.schedule is None:  # a new scheduled loop: `runs` counts scheduled runs from here on
            s.runs = 0
            s.schedule = ScheduleInfo(expression=sched.describe(), stateful=sched.stateful)
        else:
            s.schedule.expression, s.schedule.stateful = sched.describe(), sched.stateful

    def window(self) -> Any:
        """The window runs start in: the task's own `schedule.active_hours`, else the config's."""
        return self.sched.active_hours or self.loop.cfg.guardrails.active_hours

    @property
    def info(self) -> ScheduleInfo:
        assert self.loop.state.schedule is not None
        return self.loop.state.schedule

    # -- limits per run --------------------------------------------------------------------

    def run_elapsed_base(self) -> float:
        """Run time not counted against `timeout_seconds`: everything before this run (between runs,
        all of it: waiting for a fire never times out)."""
        if self.info.phase == "waiting":
            return self.loop.elapsed()
        return self.info.run_elapsed_base

    def run_iteration_base(self) -> int:
        return self.info.run_iteration_base

    # -- hooks -----------------------------------------------------------------------------

    async def before_first_run(self) -> Stop | None:
        s, info = self.loop.state, self.info
        if info.phase == "running" and s.runs > 0:
            self._preamble_due = True  # resumed mid-run: go on with it, the earlier runs told again
            return None
        now = timeutil.now()
        if s.next_run_at is None:  # never ran
            due, fires = schedule.first_fire(self.sched, now), 1
        else:
            due = timeutil.parse(s.next_run_at)
            fires = 1 + (self.sched.fires_between(due, now) if due <= now else 0)
        s.next_run_at = timeutil.iso(schedule.hold_for_active_hours(due, self.window()))
        return await self._wait_and_start(fires)

    def active(self, task: tasks.TaskFile) -> bool:
        """Whether the task is still scheduled (a person may have edited or removed `schedule:`)."""
        try:
            sched = schedule.of_task(task, self.loop.ws.relative(self.loop.task_path))
        except KiroError as exc:
            self.loop.emit(ev.LoopWarning(message=f"{exc}; keeping {self.sched.describe()}"))
            return True
        if sched is None:
            self.loop.emit(ev.LoopWarning(message="`schedule:` was removed from the task file: this is the last "
                                                  "run; the task completes"))
            self.loop.state.next_run_at = None
            return False
        if sched != self.sched:
            self.sched = sched
            self.info.expression, self.info.stateful = sched.describe(), sched.stateful
        return True

    async def after_run(self, task: tasks.TaskFile) -> Stop | None:
        loop, s, info = self.loop, self.loop.state, self.info
        finished = timeutil.now()
        started = timeutil.parse(info.run_started_at) if info.run_started_at else finished
        run = s.runs
        done = [c for c in s.completed_steps if c.iteration is None or c.iteration > info.run_iteration_base]
        steps_text = "\n".join(f"- {c.step_id} {c.description}: {first_line(c.summary, 300) or '(done)'}"
                               for c in done) or "- (no step ran: every box was already checked)"
        summary, source, memory_id, note = await self._summary(run, task, steps_text)
        s.last_run_at = timeutil.iso(finished)
        due, fires = schedule.next_fire(self.sched, started, finished)
        due = schedule.hold_for_active_hours(due, self.window())
        s.next_run_at = timeutil.iso(due)
        info.phase = "waiting"
        s.current_step = None
        path = loop.ws.logs / "completion_reports" / f"{s.task_id}_run{run}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        loop.write_report(path, run_report(s, run=run, started=started, finished=finished, steps=steps_text,
                                           summary=summary, summary_source=source, tokens=s.usage.total_tokens
                                           - info.run_tokens_base, schedule_text=self.sched.describe()))
        rel = loop.ws.relative(path)
        loop.emit(ev.ReportWritten(kind="run_report", path=rel))
        if self.sched.stateful:
            loop.emit(ev.RunSummarySaved(run=run, source=source, memory_id=memory_id, chars=len(summary), note=note))
        loop.emit(ev.RunFinished(run=run, report=rel, next_run_at=s.next_run_at,
                                 duration_seconds=round((finished - started).total_seconds(), 3)))
        await loop.asave()
        await precheck.remember(loop)  # the pre-check gate compares the next fire with what this run left
        return await self._wait_and_start(fires)

    def preamble(self) -> str | None:
        """For the first prompt of a run: the memories tagged `schedule:<task_id>` (run summaries
        and what the agent saved), oldest first."""
        if not self._preamble_due:
            return None
        self._preamble_due = False
        if not self.sched.stateful:
            return None
        try:
            from kiro.store.memory import MemoryStore  # here: only a scheduled run reads it (a start's imports)

            found = MemoryStore(self.loop.ws.memory_db()).recent(source=self.tag, limit=schedule.RECALL_LIMIT)
        except Exception as exc:  # noqa: BLE001 - a broken memory file costs the recall, not the run
            self.loop.emit(ev.LoopWarning(message=f"could not read earlier runs' memories: {exc}"))
            return None
        if not found:
            return None
        lines = ["## Earlier runs of this scheduled task",
                 f"This task runs on a schedule ({self.sched.describe()}); this is run {self.loop.state.runs}. "
                 f"What earlier runs recorded (memories tagged `{self.tag}`, oldest first):", ""]
        for m in reversed(found):
            lines.append(f"- [{m.type}, {m.created_at[:19]}] {m.content}")
        return self.loop.redact.text("\n".join(lines))

    # -- inside ----------------------------------------------------------------------------

    async def _summary(self, run: int, task: tasks.TaskFile, steps_text: str) -> tuple[str, str, int | None,
                                                                                        str | None]:
        """The forced run summary (seed 001's cycle summary): the agent writes it when the executor
        can be asked (openai); otherwise, or when that call fails, kiro makes it from the steps'
        summaries. Saved as a memory tagged `schedule:<task_id>` when the task is stateful."""
        loop = self.loop
        kiro_text = f"Run {run} ({self.sched.describe()}) finished; steps:\n{steps_text}"
        text, source, note = kiro_text, "kiro", None
        ask = getattr(loop.executor, "summarize", None)
        if self.sched.stateful and callable(ask):
            trigger = loop.guardrails.hard_stop() or loop.guardrails.before_model_call()
            if trigger is not None:
                note = f"no model call: {trigger.message}"
            else:
                prompt = SUMMARY_PROMPT.format(run=run, title=task.title, schedule=self.sched.describe(),
                                               steps=steps_text)
                reply, usage, error = await ask(SUMMARY_SYSTEM, prompt, iteration=loop.state.iteration)
                if isinstance(usage, Usage) and usage.api_calls:
                    loop.state.usage.add(usage)
                    loop.guardrails.record_model_call(usage)
                if reply and reply.strip():
                    text, source = reply.strip(), "model"
                else:
                    note = f"the model wrote no summary ({error or 'an empty reply'})"
        if note:
            loop.emit(ev.LoopWarning(message=f"run {run}: {note}; kiro wrote the run summary from the steps"))
        text = loop.redact.text(text)
        memory_id = None
        if self.sched.stateful:
            content = f"Run {run} summary ({timeutil.iso()[:19]}): {text}"
            try:
                from kiro.store.memory import MemoryStore

                memory_id = await asyncio.to_thread(MemoryStore(loop.ws.memory_db()).save, content, "run_summary",
                                                    0.8, self.tag)
            except Exception as exc:  # noqa: BLE001 - losing the memory row must not end the schedule
                loop.emit(ev.LoopWarning(message=f"could not save run {run}'s summary: {exc}"))
        return text, source, memory_id, note

    async def _wait_and_start(self, fires: int) -> Stop | None:
        """Sleep (status `sleeping`) until `next_run_at`; a stop condition (the task moved to Done/,
        a stop hook, a signal) ends the wait. Then start the next run."""
        loop, s = self.loop, self.loop.state
        assert s.next_run_at is not None
        slot = loop.slot
        while True:
            delay = (timeutil.parse(s.next_run_at) - timeutil.now()).total_seconds()
            if delay <= 0:
                if await precheck.check_run(loop):  # SPEC §11 pre-check gate: nothing changed skips this fire
                    stop = loop.interrupt_check()  # stopped while the pre-check model answered
                    if stop is not None:
                        return stop
                    break
                now = timeutil.now()
                s.next_run_at = timeutil.iso(schedule.hold_for_active_hours(self.sched.next_after(now),
                                                                            self.window()))
                fires = 1
                await loop.asave()
                continue
            loop.transition(Status.SLEEPING, "schedule")
            s.sleep_until = s.next_run_at
            await loop.asave()
            if slot is not None:
                slot.release()  # under watch: another task may run meanwhile
            try:
                stop = await loop.wait(delay)
            finally:
                s.sleep_until = None
            if stop is not None:
                return stop
        if slot is not None and not slot.held:
            stop = await self._take_slot(slot)
            if stop is not None:
                return stop
        return await self._start_run(fires)

    async def _take_slot(self, slot: Any) -> Stop | None:
        """Wait for a place among `max_parallel_loops` (status `pending`); a stop condition still
        ends the wait within a second."""
        loop = self.loop
        if slot.sem.locked():
            loop.transition(Status.PENDING, "max_parallel_loops")
            await loop.asave()
        while True:
            stop = loop.interrupt_check()
            if stop is not None:
                return stop
            try:
                await asyncio.wait_for(slot.acquire(), 0.5)
                return None
            except TimeoutError:
                continue

    async def _start_run(self, fires: int) -> Stop | None:
        loop, s, info = self.loop, self.loop.state, self.info
        try:
            fresh = tasks.load(loop.task_path)
            _, unchecked = await asyncio.to_thread(tasks.uncheck_all, loop.task_path, expected=fresh)
        except (TaskFileError, TaskNotFound):
            stop = loop.interrupt_check()
            if stop is not None:
                return stop
            raise
        now = timeutil.now()
        s.runs += 1
        info.phase = "running"
        info.run_started_at = timeutil.iso(now)
        info.run_iteration_base = s.iteration
        info.run_elapsed_base = loop.elapsed()
        info.run_tokens_base = s.usage.total_tokens
        info.fires = fires
        s.next_run_at = timeutil.iso(self.sched.next_after(now))
        s.consecutive_failures = 0
        s.steps = {}
        s.current_step = None
        s.stop_conditions = type(s.stop_conditions)()
        self._preamble_due = True
        loop.transition(Status.RUNNING, "schedule_fired")
        loop.emit(ev.ScheduleFired(run=s.runs, schedule=self.sched.describe(), catch_up=fires > 1,
                                   missed=max(fires - 1, 0), unchecked=len(unchecked)))
        await loop.asave()
        return None


def run_report(state: Any, *, run: int, started: datetime, finished: datetime, steps: str, summary: str,
               summary_source: str, tokens: int, schedule_text: str) -> str:
    """`Logs/completion_reports/<task_id>_run<N>.md`: one run of a scheduled task."""
    head = reports.frontmatter_block({
        "type": "run_report",
        "task_id": state.task_id,
        "created": timeutil.iso(),
        "run": run,
        "schedule": schedule_text,
        "started_at": timeutil.iso(started),
        "finished_at": timeutil.iso(finished),
        "next_run_at": state.next_run_at,
        "task_path": state.task_path,
        "status": "completed",
    })
    who = "written by the agent" if summary_source == "model" else "made by kiro from the steps"
    return head + f"""
# Run {run} of {state.title or state.task_path}

**Schedule**: {schedule_text}
**Started**: {timeutil.iso(started)}
**Finished**: {timeutil.iso(finished)} ({timeutil.human_duration((finished - started).total_seconds())})
**Next run**: {state.next_run_at or '-'}
**Tokens this run**: {tokens}

## Steps
{steps}

## Run summary ({who})
{summary}
"""
