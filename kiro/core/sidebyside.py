"""The executor of steps side by side (`parallel: N`, kiro.core.parallel says how): `SideBySide` runs the steps
that may run beside each other each in its own git worktree and branch (kiro.git.stepbranches) and brings their
work into the loop's tree in plan order. Imported by kiro.core.parallel's feature only when a loop runs steps side
by side, so a loop that does not imports no kiro.git for it (issue #41)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Any

from kiro.core import conditions
from kiro.core.conditions import Stop
from kiro.core.hooks import LoopHandle, LoopListener
from kiro.errors import ExecutorError, TaskFileError, TaskNotFound, raise_errors
from kiro.executors.base import Executor, StepContext, StepResult
from kiro.git import checkpoints, gitcli, stepbranches
from kiro.store import events as ev
from kiro.store import tasks
from kiro.store.state import ParallelAttempt
from kiro.store.tasks import Step, TaskFile
from kiro.usage import Usage
from kiro.views import reports


class Closer(LoopListener):
    """Ends the attempts still running when the loop ends (their steps were not completed: a later run does
    them again) and removes their worktrees."""

    def __init__(self, loop: LoopHandle, sides: SideBySide) -> None:
        super().__init__(loop)
        self.sides = sides

    def __call__(self, event: ev.Event) -> None:
        if isinstance(event, ev.StopCondition):  # the loop's last save comes next
            self.sides.settle()

    async def aclose(self) -> None:
        await self.sides.close()


@dataclasses.dataclass
class _Flight:
    step: Step
    task: asyncio.Task[StepResult]


class SideBySide:
    """The loop's executor, run in a worktree per step for the steps that may run side by side (see the
    module's text); any other step goes to the executor as before. Everything else is the executor's."""

    def __init__(self, loop: LoopHandle, inner: Executor, top: Path) -> None:
        self.loop = loop
        self.inner = inner
        self.name, self.checks_boxes, self.reads_prompt = inner.name, inner.checks_boxes, inner.reads_prompt
        self.top = top
        g = loop.state.git
        assert g is not None
        self.project_rel = g.project_rel
        self.excludes = checkpoints.kiro_paths(loop.ws, top)
        self.flights: dict[str, _Flight] = {}
        self.taken: set[str] = set()  # steps whose work was handed to the engine (their boxes come next)
        self.handed: dict[str, int] = {}  # those steps' `reopened` counts when handed over (see `after_attempt`)
        self.current: str | None = None  # the step the engine waits for
        self.template: StepContext | None = None
        self.blocked: tuple[str, str, list[str]] | None = None  # (step, branch, files) waiting for a person
        self.closing = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def build_prompts(self, *args: Any, **kwargs: Any) -> tuple[str, str]:
        return self.inner.build_prompts(*args, **kwargs)

    async def aclose(self) -> None:
        await self.close()
        await self.inner.aclose()

    # -- the engine's one call -------------------------------------------------------------------

    async def run_step(self, ctx: StepContext) -> StepResult:
        cfg = self.loop.cfg
        if not (cfg.parallel_by == "depends" or ctx.step.parallel):
            return await self.inner.run_step(ctx)  # not a step to run beside others: as ever
        self.template, self.current = ctx, ctx.step.id
        await self._sweep(ctx.task)
        flight = self.flights.get(ctx.step.id) or self._launch(ctx.step)
        self._top_up()
        try:
            result = await flight.task
        finally:
            self.flights.pop(ctx.step.id, None)
            self.current = None
        if result.ok:
            result = await self._take(ctx.step, result)
        if result.ok:
            self.taken.add(ctx.step.id)
            self.handed[ctx.step.id] = self.loop.state.step_record(ctx.step.id).reopened
        self._top_up()
        return result

    def after_attempt(self, step_id: str) -> None:
        """The engine is done with the attempt it was handed: when a feature sent the step back to its agent
        (a reviewer's changes, kiro.core.hooks.Reopen: the engine counts it in `reopened`), its work stays the
        start of its next attempt, which asks for the changes (`_fly`), as a step done in place keeps its work."""
        seen = self.handed.pop(step_id, None)
        rec = self._record(step_id)
        if seen is None or rec is None or rec.status != "merging":
            return
        if self.loop.state.step_record(step_id).reopened > seen:
            rec.status = "reopened"
            self.taken.discard(step_id)
            self.loop.save()

    async def _take(self, step: Step, result: StepResult) -> StepResult:
        """Bring the finished attempt's work into the loop's tree; on a conflict run the step again once on the
        merged tree and bring that in; a second conflict waits for a person."""
        for ran_again in (False, True):
            rec = self._record(step.id)
            assert rec is not None and rec.commit is not None
            files = await self._bring_in(rec)
            if not files:
                return result
            self.loop.emit(ev.ParallelConflict(step_id=step.id, files=files[:50], again=ran_again))
            if ran_again:
                rec.status = "conflict"
                self.blocked = (step.id, rec.branch, files)
                self.loop.save()
                return StepResult("failed", summary=result.summary, error=(
                    f"its work conflicts with the steps merged before it in {', '.join(files[:10])}, also when it "
                    f"ran again on the merged tree (its work: branch {rec.branch})"))
            try:
                result = await self._launch(step, rerun=True).task  # on the merged tree: made from HEAD now
            finally:
                self.flights.pop(step.id, None)
            if not result.ok:
                return result
        return result

    async def _bring_in(self, rec: ParallelAttempt) -> list[str]:
        """The conflicting files (none: the work is in the loop's tree, uncommitted, for the checkpoint)."""
        loop = self.loop
        again = rec.status == "merging"  # a kill fell while it was brought in: its files may be half written
        rec.status = "merging"
        await loop.asave()  # on disk before the first file changes
        assert rec.commit is not None
        brought = await asyncio.to_thread(stepbranches.bring_in, self.top, rec.commit, self.project_rel,
                                          self.excludes, again=again)
        if brought.conflicts:
            rec.status = "done"
            return brought.conflicts
        return []

    def wait_for_person(self) -> Stop:
        loop, s = self.loop, self.loop.state
        assert self.blocked is not None
        step_id, branch, files = self.blocked
        path = loop.ws.intervention_request(s.task_id)
        loop.write_report(path, reports.step_conflict(s, step_id=step_id, branch=branch, files=files))
        s.report_path = loop.ws.relative(path)
        loop.save()
        return conditions.needs_action(
            f"step {step_id}'s work conflicts with the steps merged before it in {', '.join(files[:5])}"
            f"{' ...' if len(files) > 5 else ''}, also when run again; see {s.report_path}", "step_conflict")

    # -- attempts --------------------------------------------------------------------------------

    def _record(self, step_id: str) -> ParallelAttempt | None:
        return next((r for r in self.loop.state.parallel if r.step_id == step_id), None)

    def _launch(self, step: Step, *, rerun: bool = False) -> _Flight:
        self.taken.discard(step.id)
        flight = _Flight(step, asyncio.create_task(self._fly(step, rerun=rerun)))
        self.flights[step.id] = flight
        flight.task.add_done_callback(lambda _t: self._top_up())
        return flight

    def _top_up(self) -> None:
        """Start the ready steps' attempts, in plan order, while fewer than N run and the limits allow."""
        loop, s, ctx = self.loop, self.loop.state, self.template
        if ctx is None or self.closing or ctx.cancel.is_set() or self.blocked is not None:
            return
        if loop.guardrails.hard_stop() is not None:
            return
        running = sum(1 for f in self.flights.values() if not f.task.done())
        waiting = sum(1 for sid in self.flights if sid != self.current)  # started, not yet taken up
        left = s.max_iterations - s.iteration - waiting  # the step the engine waits for is counted already
        for step in tasks.ready(ctx.task, loop.cfg.parallel_by, loop.cfg.include_optional):
            if running >= loop.cfg.parallel or left <= 0:
                return
            if step.id in self.flights or step.id in self.taken:
                continue
            self._launch(step)
            running += 1
            left -= 1

    async def _fly(self, step: Step, *, rerun: bool) -> StepResult:
        """One attempt at `step` in a fresh worktree (or, after a restart, the one that finished before it)."""
        loop, s = self.loop, self.loop.state
        rec = self._record(step.id)
        attempt = s.step_record(step.id).attempts + 1
        if (rec is not None and rec.status in ("done", "merging") and rec.commit and not rerun
                and rec.attempt == attempt):
            # (an earlier attempt's work that the engine took and then failed, verify say, is not taken again)
            return StepResult("completed", summary=f"(done before a restart: its work is {rec.commit[:12]} on "
                                                   f"branch {rec.branch})")
        carry = rec.commit if rec is not None and rec.status == "reopened" and not rerun else None
        if rec is not None and rec.status in ("merging", "reopened") and rec.commit and not rerun:
            # the engine took that attempt's work and the step failed after all (verify), or was sent back (a
            # reviewer): its files go back out of the loop's tree, so that the next attempt starts from the last
            # checkpoint as its worktree does; sent back, that worktree starts with the work (`carry`)
            await asyncio.to_thread(stepbranches.take_back, self.top, rec.commit, self.project_rel, self.excludes)
        opened = await asyncio.to_thread(stepbranches.open_attempt, loop.ws, self.top, self.top / self.project_rel,
                                         s.task_id, step.id)
        if carry is not None:
            brought = await asyncio.to_thread(stepbranches.bring_in, opened.worktree, carry, self.project_rel,
                                              self.excludes, again=False)
            if brought.conflicts and not self.closing:  # the steps merged since changed the same lines
                files = ", ".join(brought.conflicts[:5])
                loop.emit(ev.LoopWarning(message=f"step {step.id} was sent back, but its work ({carry[:12]}) does "
                                                 f"not merge with the steps done since ({files}): it runs again "
                                                 f"from the last checkpoint"))
        for event in opened.events:  # a worktree a kill left half added, a stale lock cleared
            if event.event != "worktree_created" and not self.closing:  # (parallel_step_started says that one)
                loop.emit(event)
        rec = ParallelAttempt(step_id=step.id, branch=opened.branch, worktree=str(opened.worktree), base=opened.base,
                              attempt=attempt)
        s.parallel = [r for r in s.parallel if r.step_id != step.id] + [rec]
        if not self.closing:
            loop.save()
            loop.emit(ev.ParallelStepStarted(step_id=step.id, branch=opened.branch,
                                             worktree=loop.ws.relative(opened.worktree)))
        task_copy, excludes = self._task_copy(opened.worktree, step)
        began, slept = time.monotonic(), loop.slept
        try:
            result = await self.inner.run_step(self._context(step, opened, task_copy))
        except ExecutorError:
            raise
        except Exception as exc:  # an executor bug is one failed attempt, as in the engine
            if raise_errors():
                raise
            result = StepResult("failed", error=f"executor error: {type(exc).__name__}: {exc}")
        result.seconds = round(max(time.monotonic() - began - (loop.slept - slept), 0.0), 3)  # not the merge's time
        # what the attempt spent counts now, taken up or not: the budgets see it before another attempt starts
        s.usage.add(result.usage)
        result.usage = Usage()  # (the engine adds what it is handed: nothing twice)
        if result.ok:
            try:
                rec.commit = await asyncio.to_thread(
                    stepbranches.commit_attempt, self.top, opened.worktree, self.project_rel, excludes, s.task_id,
                    step.id, step.title or step.text, s.iteration, loop.redact.text)
                rec.status = "done"
            except gitcli.GitError as exc:
                result = StepResult("failed", summary=result.summary,
                                    error=f"could not commit the step's work in its worktree: {exc}")
        if not result.ok:
            await asyncio.to_thread(stepbranches.remove, loop.ws, self.top, s.task_id, Path(rec.worktree).name)
            s.parallel = [r for r in s.parallel if r is not rec]
        if not self.closing:  # (after the loop's end nothing more is said: its last event is loop_finished)
            loop.save()
            loop.emit(ev.ParallelStepFinished(step_id=step.id, outcome=result.outcome, commit=rec.commit))
        return result

    def _task_copy(self, worktree: Path, step: Step) -> tuple[Path, list[str]]:
        """The task file as the attempt sees it: a copy in its worktree (kiro alone writes the real one), with
        the step's box `[-]` as the engine marks the step it runs, left out of the step's commit."""
        real = self.loop.task_path
        try:
            rel = Path(real).resolve().relative_to(self.top.resolve())
        except ValueError:
            rel = Path(".kiro-task") / real.name
        copy = worktree / rel
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(Path(real).read_bytes())
        with contextlib.suppress(TaskFileError, TaskNotFound):
            tasks.set_marker(copy, step.key, "-", durable=False)
        return copy, [*self.excludes, rel.as_posix()]

    def _context(self, step: Step, opened: stepbranches.Opened, task_copy: Path) -> StepContext:
        loop, s, tmpl = self.loop, self.loop.state, self.template
        assert tmpl is not None
        record = s.step_record(step.id)
        attempt = record.attempts + 1
        verify = loop.cfg.verify if isinstance(loop.cfg.verify, str) and loop.cfg.verify.strip() else None
        system, prompt = self.inner.build_prompts(
            tmpl.task, step, s, workspace=loop.ws, attempt=attempt, previous_error=record.last_error,
            verify_output=record.last_verify_output, verify_command=verify, continuation=None,
            task_path=str(task_copy), task_file=task_copy)
        return dataclasses.replace(
            tmpl, project_dir=opened.project_dir, task_path=task_copy, step=step, attempt=attempt, prompt=prompt,
            system_prompt=system, reinjected=False, continuation=None, previous_error=record.last_error,
            verify_output=record.last_verify_output, iteration=s.iteration).redacted()

    # -- before, between and after ---------------------------------------------------------------

    async def recover(self) -> None:
        """After a restart: keep the attempts that finished (their work is brought in when the engine gets to
        their steps); remove every other worktree and branch of this loop's attempts."""
        loop, s = self.loop, self.loop.state
        try:
            task = tasks.load(loop.task_path)
        except (TaskFileError, TaskNotFound):
            return
        open_ids = {st.id for st in tasks.open_leaves(task, True)}
        names = await asyncio.to_thread(stepbranches.leftovers, loop.ws, self.top, s.task_id)
        kept: list[ParallelAttempt] = []
        for rec in s.parallel:
            if rec.step_id in open_ids and rec.commit and (
                    rec.status in ("merging", "reopened")  # taken up: brought in again, or taken back (and carried)
                    or (rec.status == "done" and rec.attempt > s.step_record(rec.step_id).attempts)):
                kept.append(rec)
        for sid in open_ids - {r.step_id for r in kept}:  # finished, and killed before the state said so
            name = stepbranches.attempt_name(s.task_id, sid)
            if name not in names:
                continue
            before = next((r for r in s.parallel if r.step_id == sid), None)
            commit = await asyncio.to_thread(stepbranches.finished_commit, self.top, f"kiro/{name}",
                                             before.base if before else None, s.task_id, sid, loop.redact.text)
            if commit is not None:
                kept.append(ParallelAttempt(step_id=sid, branch=f"kiro/{name}", base=before.base if before else "",
                                            worktree=str(Path(loop.ws.root).resolve() / ".kiro" / "worktrees" / name),
                                            status="done", commit=commit, attempt=s.step_record(sid).attempts + 1))
        keep = {Path(r.worktree).name for r in kept}
        for name in names:
            if name not in keep:
                await asyncio.to_thread(stepbranches.remove, loop.ws, self.top, s.task_id, name)
        if kept != s.parallel:
            s.parallel = kept
            loop.save()

    async def _sweep(self, task: TaskFile) -> None:
        """Remove the worktrees and branches of steps whose boxes are checked now."""
        loop, s = self.loop, self.loop.state
        gone = [r for r in s.parallel if r.step_id not in self.flights
                and ((st := task.find(r.step_id)) is None or st.done)]
        for r in gone:
            await asyncio.to_thread(stepbranches.remove, loop.ws, self.top, s.task_id, Path(r.worktree).name)
        if gone:
            s.parallel = [r for r in s.parallel if r not in gone]
            self.taken -= {r.step_id for r in gone}
            loop.save()

    async def clear(self) -> None:
        """Every step is done: no worktree or branch of this loop's attempts is left."""
        await self._stop_flights()
        loop, s = self.loop, self.loop.state
        for name in await asyncio.to_thread(stepbranches.leftovers, loop.ws, self.top, s.task_id):
            await asyncio.to_thread(stepbranches.remove, loop.ws, self.top, s.task_id, name)
        s.parallel = []
        self.taken.clear()
        loop.save()

    def settle(self) -> None:
        """The loop ends: from here on nothing is started and the state is not saved again, so the state keeps
        now only the attempts the next run takes up (finished, their steps still open); `close` removes the
        worktrees and branches of the others."""
        self.closing = True
        loop, s = self.loop, self.loop.state
        running = {sid for sid, f in self.flights.items() if not f.task.done()}
        try:
            open_ids = {st.id for st in tasks.open_leaves(tasks.load(loop.task_path), True)}
        except (TaskFileError, TaskNotFound):
            open_ids = set()
        s.parallel = [r for r in s.parallel if r.step_id in open_ids and r.step_id not in running
                      and r.status in ("done", "merging", "conflict", "reopened")]

    async def close(self) -> None:
        """The run is over: attempts still running end (their steps run again later) and their worktrees go;
        finished ones stay for the next run to take up."""
        if not self.closing:
            self.settle()
        await self._stop_flights()
        loop, s = self.loop, self.loop.state
        if not self.top.is_dir():  # the loop's own worktree, merged and removed: its attempts went before
            return
        kept = {Path(r.worktree).name for r in s.parallel}
        for name in await asyncio.to_thread(stepbranches.leftovers, loop.ws, self.top, s.task_id):
            if name not in kept:
                await asyncio.to_thread(stepbranches.remove, loop.ws, self.top, s.task_id, name)

    async def _stop_flights(self) -> None:
        flights, self.flights = list(self.flights.values()), {}
        for f in flights:
            f.task.cancel()
        for f in flights:
            with contextlib.suppress(BaseException):
                await f.task
