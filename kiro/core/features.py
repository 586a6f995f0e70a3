"""The features a loop runs with, plugged in beside the engine (kiro.core.hooks.Feature): git checkpoints
(SPEC §9, kiro.git.checkpoints), the approval of steps an agent proposed (SPEC §11, kiro.store.approval), a
recurring task's runs (SPEC §11, kiro.core.scheduled), the pre-check gate (SPEC §11, kiro.core.precheck) and
the review points a person asked for (`pause_at_checkpoints`, `pause_every`).
`standard()` is what kiro.core.runner hands every loop it prepares."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import TYPE_CHECKING

from kiro.core import conditions
from kiro.core.conditions import Stop
from kiro.core.hooks import Feature, LoopHandle, Reopen
from kiro.core.looprun import names_schedule
from kiro.errors import TaskFileError, TaskNotFound, UserError
from kiro.executors.control import Look, TaskFiles, shared_look
from kiro.fs import writer
from kiro.git import gitcli
from kiro.status import Status, StopReason
from kiro.store import approval
from kiro.store import events as ev
from kiro.store.state import CompletedStep, GitInfo, LoopState
from kiro.store.tasks import Step, TaskFile, is_checkpoint
from kiro.views import reports

if TYPE_CHECKING:
    from kiro.core.scheduled import ScheduleRunner
    from kiro.executors.base import StepResult
    from kiro.git import checkpoints
    from kiro.store.config import Config
    from kiro.store.receipts import VerifyRun
    from kiro.store.workspace import Workspace


def attach(ws: Workspace, cfg: Config, state: LoopState, project_dir: Path) -> checkpoints.LoopGit | None:
    """The loop's git side (kiro.git.checkpoints, imported only then), or None when checkpoints are off or the
    project is in no git work tree. Records the choice in the state the first time; a resumed loop keeps the
    worktree and branch it started with."""
    info = state.git
    if info is not None and info.toplevel:
        if not info.checkpoints:
            return None
        top = Path(info.toplevel)
    else:
        mode = cfg.checkpoints
        if mode == "off":
            if cfg.isolation == "worktree":
                raise UserError("isolation: worktree needs checkpoints: git (the loop's work is kept as commits on "
                                "its branch); set checkpoints: git or isolation: none")
            state.git = GitInfo(checkpoints=False)
            return None
        found = gitcli.toplevel(project_dir)
        if found is None:
            if mode == "git" or cfg.isolation == "worktree":
                key = "checkpoints: git" if mode == "git" else "isolation: worktree"
                raise UserError(f"{key} needs the project directory {project_dir} inside a git work tree "
                                f"(run `git init` there, or set checkpoints: off and isolation: none)")
            state.git = GitInfo(checkpoints=False)
            return None
        top = found
        state.git = info = GitInfo(checkpoints=True, isolation=cfg.isolation, merge=cfg.merge)
    from kiro.git import checkpoints

    return checkpoints.LoopGit(ws, info, state.task_id, project_dir, top)


class Git(Feature):
    """A commit per step done; with isolation, the loop's own worktree, and its merge at the end (a
    merge that needs a person pauses the loop, exit 6, with an intervention file)."""

    def __init__(self) -> None:
        self.git: checkpoints.LoopGit | None = None

    async def open(self, loop: LoopHandle) -> None:
        self.git = git = attach(loop.ws, loop.cfg, loop.state, loop.project_dir)
        if git is None:
            return
        git.redact = loop.redact.text
        await loop.flush()
        events = await asyncio.to_thread(git.open, loop.resumed)
        for event in events:
            loop.emit(event)
        loop.project_dir = git.project_dir  # with isolation: the loop's worktree
        loop.save()

    async def step_done(self, loop: LoopHandle, step: Step, *, recovering: bool = False) -> checkpoints.Result | None:
        if self.git is None:
            return None
        title = step.title or step.text
        if recovering:  # the step succeeded before a crash; its checkpoint may be made already, or pending
            result = self.git.step_completed(step.id, title, loop.state.iteration, recovering=True)
        else:
            result = await asyncio.to_thread(self.git.step_completed, step.id, title, loop.state.iteration)
        for event in result.events:
            loop.emit(event)
        return result

    async def completing(self, loop: LoopHandle, stop: Stop) -> Stop:
        if self.git is None or stop.status != Status.COMPLETED:
            return stop
        await loop.asave()  # merge_status "merging" etc. are recorded by finish(); a kill mid-merge resumes here
        result = await asyncio.to_thread(self.git.finish)
        for event in result.events:
            loop.emit(event)
        if result.problem is None:
            loop.save()
            return stop
        s = loop.state
        path = loop.ws.intervention_request(s.task_id)
        loop.write_report(path, reports.merge_intervention(s, problem=result.problem, files=result.files))
        s.report_path = loop.ws.relative(path)
        loop.save()
        return conditions.needs_action(f"{result.problem}; see {s.report_path}", "merge_conflict")


class GitAttempts(Feature):
    """The times of a step's attempts, for its checkpoint to tell the files it changed from a person's or
    another loop's (kiro.git.checkpoints). Last of the features: an attempt another feature holds back
    never starts."""

    def __init__(self, git: Git) -> None:
        self.git = git

    async def before_step(self, loop: LoopHandle, step_id: str, attempts: int) -> tuple[Stop | None, bool]:
        if self.git.git is not None:
            await asyncio.to_thread(self.git.git.attempt_started, step_id, Path(loop.task_path))
        return None, True

    async def after_step(self, loop: LoopHandle, step_id: str) -> None:
        if self.git.git is not None:
            await asyncio.to_thread(self.git.git.attempt_ended)


class Approval(Feature):
    """Proposals a person moved to Approved/ or Rejected/ are applied each time round; a task whose
    steps are all done while proposals still wait pauses for the person."""

    def __init__(self) -> None:
        self._decided: tuple[str, ...] | None = None  # the Approved/ and Rejected/ folders

    def each_round(self, loop: LoopHandle) -> None:
        if self._decided is None:
            self._decided = tuple(os.path.join(loop.ws.root, area) for area in (approval.APPROVED, approval.REJECTED))
        if not any(os.path.isdir(folder) for folder in self._decided):
            return  # no decision folder: nothing to look at (asked every iteration)
        try:
            done = approval.apply_decisions(loop.ws, loop.state.task_id, loop.task_path, loop.redact.text)
        except (TaskFileError, TaskNotFound, OSError) as exc:
            loop.emit(ev.LoopWarning(message=f"could not handle a step proposal: {exc}"))
            return
        for d in done:
            loop.emit(ev.ProposalApproved(**d.fields) if d.kind == "approved" else ev.ProposalRejected(**d.fields))

    async def all_done(self, loop: LoopHandle, task: TaskFile) -> Stop | bool | None:
        waiting = approval.proposals(loop.ws, loop.state.task_id, approval.PENDING)
        if not waiting:
            return None
        return conditions.needs_action(
            f"every step is done but {len(waiting)} step proposal(s) wait for a person in "
            f"{approval.PENDING}/ ({', '.join(p.name for p in waiting)}): move each to Approved/ or "
            f"Rejected/, then `kiro loop resume --task-id {loop.state.task_id}`", "approval_pending")


class SealedTaskFiles(Feature):
    """SPEC §15, for every executor: around each step (its executor's processes and verify's), the
    workspace's task files are looked at (kiro.executors.control.TaskFiles). One that appears, or whose
    frontmatter changes, while the step runs waits for a person's approval (`Pending_Approval/`); this
    loop's own frontmatter is put back when the step ran unboxed (boxed, the file is read-only to it). While
    the step runs, a marker in `.state/running/` tells every starter (`start`, `watch`, `serve`) that a task
    file written since must not start (kiro.store.approval.check_task_file)."""

    def __init__(self) -> None:
        self.files: TaskFiles | None = None
        self.step_id: str | None = None
        self.marked = True  # `.state/running/<task_id>` may be there: a kill's at first, then this run's own

    async def before_step(self, loop: LoopHandle, step_id: str, attempts: int) -> tuple[Stop | None, bool]:
        await self._check(loop)  # a step the engine did not end here (another feature ran it, a kill before)
        approval.step_began(loop.ws, loop.state.task_id, boxed=_boxed(loop))
        self.marked = True
        # a few directory listings: at once when this loop runs alone (no other loop to share a look with); with
        # many loops, one look taken for all that ask in the same turn of the event loop (issue #41), a yield
        # that leaves the last iteration's owed save to this one's opening save (Loop.aside): one journal
        # record, one append and one fdatasync either way (Loop.save_soon)
        boxed = _boxed(loop)
        self.files = TaskFiles.take(loop.ws, loop.task_path, boxed=boxed, look=await _look(loop, boxed))
        self.step_id = step_id
        return None, True

    async def check_step(self, loop: LoopHandle, step: Step, verify: VerifyRun | None, *,
                         recovering: bool = False, result: StepResult | None = None) -> str | Reopen | None:
        """The step's processes and verify have ended (the last feature asked): its time to write ends here,
        before its box is checked. A task file a person drops once they see the box checked is theirs (it was
        held: the hold lasted until the step's commit and state were written)."""
        if not recovering:
            await self._check(loop)
        return None

    async def after_step(self, loop: LoopHandle, step_id: str) -> None:
        await self._check(loop)  # an attempt that failed, or that a feature's check refused

    async def completing(self, loop: LoopHandle, stop: Stop) -> Stop:
        await self._check(loop)
        return stop

    async def _check(self, loop: LoopHandle) -> None:
        files, step_id, self.files = self.files, self.step_id, None
        if files is not None and step_id is not None:
            boxed = files.looks_boxed(_boxed(loop))
            look = await _look(loop, boxed)  # taken after the step ended: all its writes are in it
            for line in files.check(boxed=boxed, task_id=loop.state.task_id, step_id=step_id, look=look):
                loop.emit(ev.LoopWarning(message=line))
        if self.marked:  # removed once a step ends, not at each of the three looks around it (a file system call)
            approval.step_ended(loop.ws, loop.state.task_id)
            self.marked = False


async def _look(loop: LoopHandle, boxed: bool) -> Look | None:
    """None (`TaskFiles` looks at once) when this loop runs alone in the process, else the look shared by every
    loop that asks in this turn of the event loop (kiro.executors.control.shared_look)."""
    return None if writer.alone() else await loop.aside(shared_look(loop.ws, boxed=boxed))


def _boxed(loop: LoopHandle) -> bool:
    from kiro.processes import sandbox

    return sandbox.wanted(loop.cfg.sandbox) and sandbox.unusable() is None


class Schedule(Feature):
    """A recurring task (`schedule:`): waits for its first run, starts the next run when a run's
    steps are done, and tells the agent what earlier runs recorded."""

    def __init__(self) -> None:
        self.runner: ScheduleRunner | None = None

    async def begin(self, loop: LoopHandle, task: TaskFile) -> Stop | None:
        self.runner = None
        if names_schedule(task):  # a plain task's loop imports no schedule code (kiro.core.scheduled, .schedule)
            from kiro.core import scheduled

            self.runner = scheduled.attach(loop, task)
        return await self.runner.before_first_run() if self.runner is not None else None

    async def all_done(self, loop: LoopHandle, task: TaskFile) -> Stop | bool | None:
        if self.runner is None or not self.runner.active(task):
            return None
        stop = await self.runner.after_run(task)  # the run's report and summary; wait; next run
        return stop if stop is not None else True

    def prompt_addition(self, loop: LoopHandle) -> str | None:
        return self.runner.preamble() if self.runner is not None else None

    def run_base(self) -> tuple[float, int]:
        if self.runner is None:
            return 0.0, 0
        return self.runner.run_elapsed_base(), self.runner.run_iteration_base()


class PreCheck(Feature):
    """`llm.precheck: every_iteration`: a cheap model decides before each attempt whether anything
    changed that is worth a full one."""

    def __init__(self) -> None:
        self._gated = False

    async def before_step(self, loop: LoopHandle, step_id: str, attempts: int) -> tuple[Stop | None, bool]:
        self._gated = every_iteration(loop)
        if not self._gated:
            return None, True
        from kiro.core import precheck  # here: only a gated loop runs it (a plain loop's start imports it not)

        return await precheck.before_iteration(loop, step_id, attempts)

    async def after_step(self, loop: LoopHandle, step_id: str) -> None:
        if self._gated:
            from kiro.core import precheck

            await precheck.after_iteration(loop, step_id)


def every_iteration(loop: LoopHandle) -> bool:
    """The pre-check gate asks before each attempt (`llm.precheck: every_iteration` with a `precheck_model`)."""
    return loop.cfg.llm.precheck_model is not None and loop.cfg.llm.precheck == "every_iteration"


class OneStep(Feature):
    """`kiro loop start --step ID`: the loop does that step (a parent: its open sub-steps, in order), optional
    or not, whatever comes before it, and ends once it is done: `stopped` with stop_reason `step_done`, exit 0
    (conditions.step_done), or `completed` when it was the last open step of the task."""

    def __init__(self, step_id: str) -> None:
        self.step_id = step_id

    @classmethod
    def for_task(cls, task: TaskFile, step_id: str, where: str) -> OneStep:
        """The feature, once `step_id` is known to name a step of `task` with something still to do; else a
        UserError (one line: the ids there are, or that the step is done)."""
        step = task.find(step_id)
        if step is None:
            ids = list(dict.fromkeys(s.id for s in task.steps if s.id[:1].isdigit() and len(s.id) <= 24))
            shown = ", ".join(ids[:40]) + (", ..." if len(ids) > 40 else "")
            unnumbered = sum(1 for s in task.steps if not s.id[:1].isdigit())
            if unnumbered:
                shown += f"{' and ' if ids else ''}{unnumbered} without a number, each named by its whole text"
            named = step_id if len(step_id) <= 60 else step_id[:57] + "..."
            raise UserError(f"--step {named!r}: {where} has no step with that id; its steps are {shown}")
        if _open_leaf(task, step) is None:
            raise UserError(f"--step {step_id}: step {step_id} of {where} is already done (its box is checked); "
                            f"uncheck it to do it again")
        return cls(step_id)

    def choose_step(self, loop: LoopHandle, task: TaskFile, step: Step | None) -> Step | Stop | None:
        chosen = task.find(self.step_id)
        if chosen is None:
            return conditions.because(StopReason.STEP_MISSING, f"step {self.step_id} is no longer in "
                                                                f"{loop.state.task_path}")
        leaf = _open_leaf(task, chosen)
        if leaf is not None:
            return leaf
        return None if step is None else conditions.step_done(self.step_id, loop.state.task_id)


def _open_leaf(task: TaskFile, step: Step) -> Step | None:
    """The first step in `step` and under it, in document order, that has no sub-steps and is not done."""
    if not step.children:
        return None if step.done else step
    for child in step.children:
        found = _open_leaf(task, task.steps[child])
        if found is not None:
            return found
    return None




class ReviewPoints(Feature):
    """`pause_at_checkpoints: true`: after a Kiro "Checkpoint" step is done, the loop pauses for a person
    (status paused, `stop_reason: checkpoint`, exit 6) with a review note in Needs_Action/: the steps done
    and the diff stat since the last review, and how verify went. `pause_every: N` does the same after
    every N completed steps. `kiro loop resume` goes on: the state counts the steps a person was shown
    (`reviewed_steps`), so a resumed loop does not pause again for them. A review point with nothing after
    it (most Kiro plans end with a "Final checkpoint") is no pause: the task is complete, and its completion
    report is what the person reads."""

    async def before_step(self, loop: LoopHandle, step_id: str, attempts: int) -> tuple[Stop | None, bool]:
        stop = await self._review(loop)
        return stop, stop is None

    async def _review(self, loop: LoopHandle) -> Stop | None:
        cfg, s = loop.cfg, loop.state
        if not (cfg.pause_at_checkpoints or cfg.pause_every):
            return None
        done = s.completed_steps
        if s.reviewed_steps > len(done):  # a recurring task's next run began afresh
            s.reviewed_steps = 0
        new = done[s.reviewed_steps:]
        if not new:
            return None
        if cfg.pause_at_checkpoints and any(is_checkpoint(c.description) for c in new):
            last = next(c for c in reversed(new) if is_checkpoint(c.description))
            why = f"checkpoint step {last.step_id} ({last.description}) is done"
        elif cfg.pause_every and len(new) >= cfg.pause_every:
            why = f"{len(new)} steps done since the last review (pause_every: {cfg.pause_every})"
        else:
            return None
        diff_stat = await asyncio.to_thread(_diff_stat, s, done[: s.reviewed_steps])
        verify = (f"`{cfg.verify}` passed after each of these steps (a step counts as done only when it passes)"
                  if cfg.verify else "no `verify` command is set: nothing checked these steps")
        path = loop.ws.review_note(s.task_id)
        loop.write_report(path, reports.review_note(s, why=why, steps=new, diff_stat=diff_stat, verify=verify))
        s.reviewed_steps = len(done)
        s.report_path = loop.ws.relative(path)
        loop.save()
        return conditions.needs_action(f"review point: {why}; see {s.report_path}, then `kiro loop resume "
                                       f"--task-id {s.task_id}`", "checkpoint")


def _diff_stat(state: LoopState, reviewed: list[CompletedStep]) -> str:
    """`git diff --stat` of the loop's work since the last review (its last checkpoint commit then, or the
    commit the loop started from), to the loop's latest commit."""
    g = state.git
    if g is None or not g.checkpoints or not g.toplevel:
        return "(no git checkpoints: checkpoints are off)"
    base = next((c.checkpoint for c in reversed(reviewed) if c.checkpoint), None) or g.base_commit
    if base is None:
        return "(no commit to compare with)"
    tree = gitcli.Git(Path(g.worktree or g.toplevel))
    try:
        return tree.run("diff", "--stat", "--no-ext-diff", "--no-color", base, "HEAD").stdout.rstrip() or "(no changes)"
    except gitcli.GitError as exc:
        return f"(git could not tell: {exc})"


def standard(*, git: bool = True) -> list[Feature]:
    """Every feature of a loop, in the order the engine asks them (`git=False`: the temporal
    backend's workspace side, where each step's worker makes the commit and gathers the step's evidence, which
    `Evidence(remote=True)` makes the receipt of and `Review(remote=True)` adds the worker's review rounds to;
    steps side by side need the loop's own git, so `parallel` is not built there)."""
    from kiro.core.evidence import Evidence
    from kiro.core.parallel import Parallel
    from kiro.core.review import Review

    if not git:
        return [Evidence(remote=True), Review(remote=True), Approval(), Schedule(), ReviewPoints(), PreCheck(),
                SealedTaskFiles()]
    git_feature = Git()
    return [git_feature, Evidence(), Review(), Approval(), Schedule(), ReviewPoints(), PreCheck(), SealedTaskFiles(),
            Parallel(), GitAttempts(git_feature)]
