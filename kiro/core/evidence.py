"""Evidence for the morning (SPEC §14), a feature beside the engine (kiro.core.hooks.Feature):

- every completed step gets a receipt (`completed_steps[].receipt`, kiro.store.receipts.Receipt): who did it,
  attempts, times, tokens and cost, verify's command, exit code, output tail and test counts, the checkpoint
  commit and its diff stat, the protected-path check. It is made when the engine records the step (the
  `step_completed` / `step_recovered` event), before the state's next save: the step and its receipt are
  one record, journaled together.
- `protected_paths`: before every attempt the protected files are hashed and copied to
  `.state/protected/<task_id>/`; a step that created, changed or deleted one fails, the paths are put back,
  and `Pending_Approval/protected_<task_id>_<n>.md` lets a person approve the change for the step's next
  attempt. An attempt that fails (or is cut short, or killed) has its protected changes put back too.
- `verify_report`: the JUnit XML report verify writes; fewer passed, or more skipped or xfailed, tests than
  the last receipt's fails the step.
- A box is done only with its receipt: the boxes checked when an attempt begins are kept in the state
  (`boxes_checked_before`); a box of another step that an agent checks during the attempt is reopened (with an
  agent that checks boxes: the command executor), and after a kill the in-flight step's box counts only once
  verify and these checks pass on the next run (the engine asks `check_step(recovering=True)`).
- On the temporal backend (`Evidence(remote=True)`, the workspace side) the step runs in a worker's clone: the
  worker runs verify, reads the report and checks protected paths there (kiro.temporal.attempt), and the
  attempt's result brings both back (`StepResult.verify`, `.protected`); here they go into the receipt, the test
  counts are held against the last receipt's, and nothing of the workspace's own checkout is hashed or put back.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any, cast

from kiro import timeutil
from kiro.core.hooks import Feature, LoopHandle
from kiro.errors import TaskFileError, TaskNotFound
from kiro.executors.base import StepResult
from kiro.processes import sandbox
from kiro.store import events, receipts, tasks
from kiro.store.receipts import Change, ProtectedCheck, Receipt, TestCounts, VerifyRecord, VerifyRun
from kiro.store.state import CompletedStep, LoopState, clip
from kiro.store.tasks import Step, TaskFile
from kiro.usage import Usage


class Evidence(Feature):
    def __init__(self, *, remote: bool = False) -> None:
        self.remote = remote  # the steps run elsewhere (temporal workers), which check protected paths there
        self.loop: LoopHandle | None = None
        self.step_id: str | None = None  # the step being attempted (its first attempt's start and usage below)
        self.first_started: str | None = None
        self.usage_before = Usage()
        self.manifest: dict[str, str] | None = None  # the protected files' hashes before this attempt
        self.approved: list[str] = []
        self.killed_changes: list[Change] = []  # protected changes a killed attempt left, put back at open
        self.pending: dict[str, tuple[VerifyRecord | None, ProtectedCheck | None]] = {}
        self.task: TaskFile | None = None

    # -- the hooks ---------------------------------------------------------------------------------------

    async def open(self, loop: LoopHandle) -> None:
        self.loop = loop
        loop.subscribe(self._on_event)
        cur = loop.state.current_step
        if self.remote or cur is None or cur.status != "in_progress":
            return
        # a killed attempt: what it did to protected paths goes back, boxes it checked for other steps reopen
        protected = self._protected(loop)
        if protected is not None:
            manifest = protected.manifest()
            if manifest is not None:
                self.approved = receipts.approved_paths(loop.ws, loop.state.task_id, cur.step_id)
                self.killed_changes = await self._put_back(loop, cur.step_id, manifest)
        self._reopen_foreign_boxes(loop, cur.step_id, after_kill=True)

    def choose_step(self, loop: LoopHandle, task: TaskFile, step: Step | None) -> Step | None:
        self.task = task  # the file as read this round: the boxes before the attempt
        return step

    async def before_step(self, loop: LoopHandle, step_id: str, attempts: int) -> tuple[None, bool]:
        s = loop.state
        if step_id != self.step_id or attempts == 0:
            self.step_id = step_id
            self.first_started = timeutil.iso()
            self.usage_before = s.usage.model_copy()
        if self.remote:
            return None, True
        if self.task is not None and _agent_writes_task_file(loop):
            s.boxes_checked_before = [st.id for st in self.task.steps if st.done]
        protected = self._protected(loop)
        if protected is not None:
            self.manifest = await asyncio.to_thread(protected.snapshot)
            self.approved = receipts.approved_paths(loop.ws, s.task_id, step_id)
        return None, True

    async def check_step(self, loop: LoopHandle, step: Step, verify: VerifyRun | None, *,
                         recovering: bool = False, result: StepResult | None = None) -> str | None:
        cfg = loop.cfg
        check: ProtectedCheck | None = result.protected if result is not None else None  # checked where it ran
        protected = self._protected(loop) if not self.remote else None
        if protected is not None and check is None:
            manifest = self.manifest if not recovering else protected.manifest()
            check = ProtectedCheck(globs=list(cfg.protected_paths), files=len(manifest or {}),
                                   approved=sorted(set(self.approved)))
            changes = list(self.killed_changes) if recovering else []
            if manifest is not None and not recovering:
                changes = await self._put_back(loop, step.id, manifest)
            if changes:
                check.ok = False
                check.changed = [str(c) for c in changes]
                return receipts.changed_reason(step.id, check.changed, self._proposal_note)
        record: VerifyRecord | None = None
        if verify is not None:
            record = verify.record()
            if cfg.verify_report:
                if verify.report_problem is not None:
                    return verify.report_problem
                problem = receipts.shrank(last_counts(loop.state), verify.tests) if verify.tests is not None else None
                if problem is not None:
                    loop.emit(events.TestsShrank(step_id=step.id, message=problem))
                    return f"{problem} (verify_report {cfg.verify_report}; tests can only grow)"
        self.pending[step.id] = (record, check)
        return None

    async def after_step(self, loop: LoopHandle, step_id: str) -> None:
        s = loop.state
        done = bool(s.completed_steps) and s.completed_steps[-1].step_id == step_id and \
            s.completed_steps[-1].iteration == s.iteration
        protected = self._protected(loop) if not self.remote else None
        if not done and protected is not None and self.manifest is not None:
            await self._put_back(loop, step_id, self.manifest)  # a failed attempt's changes
        self._reopen_foreign_boxes(loop, step_id, after_kill=False)
        self.pending.pop(step_id, None)
        if done:
            s.boxes_checked_before = None

    # -- receipts ----------------------------------------------------------------------------------------

    def _on_event(self, event: events.Event) -> None:
        if event.event in ("step_completed", "step_recovered") and self.loop is not None:  # by tag: no class made
            s = self.loop.state
            step_id = cast("events.StepCompleted | events.StepRecovered", event).step_id
            if s.completed_steps and s.completed_steps[-1].step_id == step_id:
                c = s.completed_steps[-1]
                c.receipt = self._receipt(self.loop, c, recovered=event.event == "step_recovered")
                self.killed_changes = []

    def _receipt(self, loop: LoopHandle, c: CompletedStep, *, recovered: bool) -> Receipt:
        s, cfg = loop.state, loop.cfg
        verify, check = self.pending.pop(c.step_id, (None, None))
        ours = self.step_id == c.step_id
        prompt = completion = total = 0  # what the loop spent from the step's first attempt on (its own run)
        cost: float = 0
        if ours:
            now, before = s.usage, self.usage_before
            prompt = max(now.prompt_tokens - before.prompt_tokens, 0)
            completion = max(now.completion_tokens - before.completion_tokens, 0)
            total = max(now.total_tokens - before.total_tokens, 0)
            cost = max(now.cost_usd - before.cost_usd, 0)
        model = cfg.llm.model if s.executor == "openai" or "model" in cfg.llm.model_fields_set else None
        started = self.first_started if ours else (s.current_step.started_at if s.current_step else None)
        return Receipt.model_validate({  # validated as keywords would be, without the keywords' dict (~9 K a step)
            "step_id": c.step_id, "title": c.description, "executor": s.executor, "agent": c.agent, "model": model,
            "attempts": c.attempts, "started_at": started, "finished_at": c.completed_at,
            "duration_seconds": _seconds(started, c.completed_at, c.duration_seconds),
            "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total,
            "cost_usd": round(cost, 6), "verify": verify,
            "checkpoint": c.checkpoint, "checkpoint_note": c.checkpoint_note,
            "diff_stat": _diff_stat(s, c.checkpoint) if c.checkpoint else None,
            "protected": check, "recovered": recovered})

    # -- protected paths ---------------------------------------------------------------------------------

    def _protected(self, loop: LoopHandle) -> receipts.Protected | None:
        globs = loop.cfg.protected_paths
        return receipts.Protected(loop.ws, loop.state.task_id, loop.project_dir, list(globs)) if globs else None

    _proposal_note = "Pending_Approval/"

    async def _put_back(self, loop: LoopHandle, step_id: str, manifest: dict[str, str]) -> list[Change]:
        """Put back what the attempt did to protected paths (but the changes a person approved), off the event
        loop; name it in an event and a proposal a person can approve. Returns the changes."""
        protected = self._protected(loop)
        assert protected is not None
        approved = set(self.approved)

        def restore() -> tuple[list[Change], list[str], Path | None]:
            changes = [c for c in protected.changes(manifest) if c.path not in approved]
            if not changes:
                return [], [], None
            failed = protected.put_back(manifest, changes)
            return changes, failed, receipts.propose_change(loop.ws, loop.state.task_id, step_id, changes)

        changes, failed, proposal = await asyncio.to_thread(restore)
        if proposal is not None:
            self._proposal_note = f"{loop.ws.relative(proposal)} (move it to Approved/)"
            loop.emit(events.ProtectedPathsChanged(step_id=step_id, changes=[str(c) for c in changes],
                                                   proposal=loop.ws.relative(proposal), not_put_back=failed))
        return changes

    # -- boxes -------------------------------------------------------------------------------------------

    def _reopen_foreign_boxes(self, loop: LoopHandle, step_id: str, *, after_kill: bool) -> None:
        """Boxes of other steps that were checked while the attempt at `step_id` ran outside the box: no
        receipt stands behind them, so they are unchecked (a person can check one again). In the box the task
        file is read-only (an agent checks its box in its own copy, kiro.executors.control.StepCopy), so a box
        checked there meanwhile is a person's and stays."""
        s = loop.state
        before = s.boxes_checked_before
        if before is None or self.remote or not _agent_writes_task_file(loop):
            return
        try:
            task = tasks.load(loop.task_path)
        except (TaskFileError, TaskNotFound):
            return
        was = set(before)
        recorded = {c.step_id for c in s.completed_steps}
        for st in task.steps:
            if not st.done or not st.is_leaf or st.id in was or st.id in recorded or st.id == step_id:
                continue
            with contextlib.suppress(TaskFileError, TaskNotFound):
                task = tasks.set_marker(loop.task_path, st.key, " ", expected=tasks.load(loop.task_path))
                when = "an attempt kiro never recorded (a kill)" if after_kill else "the attempt"
                loop.emit(events.StepReopened(step_id=st.id, reason=(
                    f"its box was checked during {when} at step {step_id}, with no receipt; unchecked "
                    f"(a person who meant to skip it checks it again)")))


def _agent_writes_task_file(loop: LoopHandle) -> bool:
    """Whether the step's agent can check boxes in the task file itself: outside the box (inside, the file is
    read-only and the agent checks its box in its own copy); a shell step's command checks none."""
    return loop.executor.reads_prompt and not sandbox.wanted(loop.cfg.sandbox)


def last_counts(state: LoopState) -> TestCounts | None:
    """The test counts of the newest receipt that has them: what the next step's may not go below."""
    for c in reversed(state.completed_steps):
        if c.receipt is not None and c.receipt.verify is not None and c.receipt.verify.tests is not None:
            return c.receipt.verify.tests
    return None


def _seconds(started: str | None, finished: str, fallback: float) -> float:
    if not started:
        return fallback
    try:  # not contextlib.suppress: a context manager made each step for an error that does not come
        return round(max((timeutil.parse(finished) - timeutil.parse(started)).total_seconds(), 0.0), 3)
    except (ValueError, TypeError):
        return fallback


def _diff_stat(state: LoopState, commit: str) -> str | None:
    """`git show --stat` of the step's checkpoint commit."""
    from kiro.git import gitcli

    g = state.git
    if g is None or not g.toplevel:
        return None
    try:
        out = gitcli.Git(Path(g.worktree or g.toplevel)).run(
            "show", "--stat", "--format=", "--no-color", "--no-ext-diff", commit).stdout
    except gitcli.GitError as exc:
        return f"(git could not tell: {exc})"
    return clip(out.strip(), 2000) or "(no changes)"


def receipt_fields(receipt: Receipt) -> dict[str, Any]:
    return receipt.model_dump(mode="json", exclude_none=True)
