"""Review by a second agent (SPEC §14 `review:`), a feature beside the engine (kiro.core.hooks.Feature).

After a step's executor says it is done and verify passed (and the other checks held: protected paths, test
counts), before its box is checked and its receipt made, a reviewer reads the step's work:

- `review: {agent: NAME}`: any preset or ACP agent kiro drives, run as a step attempt is (the command
  executor: boxed, billed, its usage limits waited out, its output in `Logs/<task_id>/<step>-review-<n>.log`,
  its usage added to the loop's); `review: {command: CMD}`: a command given the prompt on stdin, like
  `executor_command` (boxed).
- The prompt: the step's text, the Kiro spec requirements it cites (quoted from requirements.md), its diff
  against the commit it began from (new files included), and verify's command and output tail. The answer
  must end with `REVIEW: APPROVE` or `REVIEW: CHANGES <reasons>`.
- APPROVE: event `review_approved`, the step completes. CHANGES: event `review_requested_changes`, the step
  goes back to its agent with the reasons in its next prompt (kiro.core.hooks.Reopen: no failure counted,
  no backoff); after `max_rounds` rounds of changes the loop pauses (exit 6) with a note in `Needs_Action/`
  saying the reasons. Any other answer (or a reviewer that failed, or changed the project's files) is a
  failed review: tried once more, then the same pause.
- Every round (verdict, reasons, agent, tokens, seconds, log) is kept on the step's record in the state and
  goes into its receipt (`reviews`), shown by `kiro loop receipt`.

Steps side by side (`parallel: N`, kiro.core.parallel) take this same path: the engine brings each step's work
from its worktree into the loop's tree, one step at a time, before verify and these checks, so the diff since
the step's start is that step's own; a step sent back starts its next worktree from its work.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from pathlib import Path

from kiro import timeutil
from kiro.core import conditions
from kiro.core.conditions import Stop
from kiro.core.hooks import Feature, LoopHandle, Reopen
from kiro.errors import ExecutorError, TaskFileError, TaskNotFound
from kiro.executors.base import StepContext, StepResult
from kiro.processes import sandbox
from kiro.store import events, kirospec, receipts, tasks
from kiro.store.config import Config
from kiro.store.receipts import Receipt, ReviewRound, VerifyRun
from kiro.store.state import clip
from kiro.store.tasks import Step, TaskFile, is_checkpoint

DIFF_CHARS = 24_000  # of the step's diff, in the prompt
NEW_FILE_CHARS = 4_000  # of each new file's text, in the prompt
NEW_FILES_SHOWN = 20
VERIFY_TAIL_CHARS = 2_000
TRIES = 2  # a review whose answer kiro cannot read is made once more, then the loop pauses

VERDICT = re.compile(r"^REVIEW:\s*(APPROVE|CHANGES)\b[\s:.\-—]*(.*)$", re.I)

INSTRUCTIONS = """\
You are reviewing one step of a plan that another agent has just done. Read the step, the requirements it
cites, its diff and the output of the project's checks. Judge whether the step is really done: the work it
asks for is there and correct, the requirements hold, no test was weakened, skipped or deleted to make the
checks pass, nothing unrelated was changed. Do not change any file: you only read and judge.

The last line of your answer must be the verdict: `REVIEW: APPROVE` when the step is done, or
`REVIEW: CHANGES <what must change, in one line>` when it is not.
"""


class Review(Feature):
    def __init__(self) -> None:
        self.loop: LoopHandle | None = None
        self.task: TaskFile | None = None
        self.base: str | None = None  # the commit the step's attempt began from
        self._reviewer: object | None = None  # the CommandExecutor that runs the reviewer, made once per run

    # -- the hooks ---------------------------------------------------------------------------------------

    async def open(self, loop: LoopHandle) -> None:
        self.loop = loop
        loop.subscribe(self._on_event)

    async def begin(self, loop: LoopHandle, task: TaskFile) -> Stop | None:
        if loop.cfg.review is not None:
            self._executor(loop)  # a reviewer that cannot run ends the run now (exit 1), not after a night's step
        return None

    def choose_step(self, loop: LoopHandle, task: TaskFile, step: Step | None) -> Step | None:
        self.task = task
        return step

    async def before_step(self, loop: LoopHandle, step_id: str, attempts: int) -> tuple[None, bool]:
        if loop.cfg.review is not None:
            self.base = await asyncio.to_thread(_head, loop.project_dir)
        return None, True

    async def check_step(self, loop: LoopHandle, step: Step, verify: VerifyRun | None, *,
                         recovering: bool = False, result: StepResult | None = None) -> str | Reopen | None:
        review = loop.cfg.review
        if review is None:
            return None
        s = loop.state
        if review.when == "checkpoint" and not is_checkpoint(step.title or step.text):
            return None
        if review.when == "task" and not self._last_open(loop, step):
            return None
        rec = s.step_record(step.id)
        base = self._base(loop, review.when, recovering)
        if base is None:
            base = await asyncio.to_thread(_head, loop.project_dir)
        diff = await asyncio.to_thread(_diff, loop, base)
        prompt = loop.redact.text(review_prompt(loop, step, diff, base, verify))
        who = reviewer_name(loop.cfg)
        last: ReviewRound | None = None
        for _ in range(TRIES):
            number = len(rec.reviews) + 1
            loop.emit(events.ReviewStarted(step_id=step.id, round=number, reviewer=who))
            kept = await asyncio.to_thread(_keep, loop)  # unboxed: the project's files as the reviewer found them
            result, seconds = await self._run(loop, step, prompt, number)
            changed = await asyncio.to_thread(_put_back, *kept) if kept is not None else []
            if result.outcome == "interrupted":
                return Reopen("the review was cut short; the step is reviewed again when the loop goes on",
                              stop=loop.interrupt_check() or conditions.stopped(
                                  result.stop_reason or "interrupted", "stopped during a review"))
            verdict, reasons = read_answer(result)
            if changed:
                verdict, reasons = "invalid", (f"the reviewer changed the project's files (a reviewer only reads; "
                                               f"kiro put them back): {'; '.join(changed[:10])}")
            last = ReviewRound(round=number, verdict=verdict, reasons=clip(reasons, 2000), agent=who,
                               prompt_tokens=result.usage.prompt_tokens,
                               completion_tokens=result.usage.completion_tokens,
                               total_tokens=result.usage.total_tokens, cost_usd=round(result.usage.cost_usd, 6),
                               seconds=round(seconds, 3), log=result.log, at=timeutil.iso())
            rec.reviews = [*rec.reviews, last]  # a new list: the journal sees the change
            await loop.asave()
            if verdict == "approve":
                loop.emit(events.ReviewApproved(step_id=step.id, round=number, reviewer=who))
                return None
            if verdict == "changes":
                break
            loop.emit(events.LoopWarning(message=f"review of step {step.id} (round {number}, {who}) failed: "
                                                 f"{first_line(reasons)}"))
        assert last is not None
        if last.verdict == "changes":
            counted = sum(1 for r in rec.reviews[rec.reviews_counted_from:] if r.verdict == "changes")
            paused = counted >= review.max_rounds
            loop.emit(events.ReviewRequestedChanges(step_id=step.id, round=last.round, reviewer=who,
                                                    reasons=clip(last.reasons, 1000), paused=paused))
            reason = (f"A reviewer ({who}) read your work on this step and asked for changes before it counts as "
                      f"done (review round {last.round}): {last.reasons}\nMake these changes, then finish the step "
                      f"as before.")
            if not paused:
                return Reopen(reason)
            why = (f"the reviewer ({who}) still asks for changes after {counted} round(s) "
                   f"(max_rounds {review.max_rounds})")
        else:
            reason = (f"The review of this step could not be read ({who}: {first_line(last.reasons)}); the step is "
                      f"reviewed again after it runs again.")
            why = f"the reviewer ({who}) gave no answer kiro could read, {TRIES} times"
        return Reopen(reason, stop=self._pause(loop, step, why))

    def _base(self, loop: LoopHandle, when: str, recovering: bool) -> str | None:
        """The commit the work under review began from: the step's start (`when: step`); the last checkpoint
        step's commit, else the loop's first (`checkpoint`); the loop's first commit (`task`)."""
        s = loop.state
        first = s.git.base_commit if s.git is not None else None
        if when == "checkpoint":
            last = next((c.checkpoint for c in reversed(s.completed_steps)
                         if c.checkpoint and is_checkpoint(c.description)), None)
            return last or first
        if when == "task":
            return first
        return self.base if not recovering else None

    def _last_open(self, loop: LoopHandle, step: Step) -> bool:
        """Whether `step` is the last step the loop has to do (`when: task`): every other step is done."""
        task = self.task
        if task is None:
            try:
                task = tasks.load(loop.task_path)
            except (TaskFileError, TaskNotFound):
                return False
        optional = loop.cfg.include_optional
        return not any(st.is_leaf and not st.done and st.id != step.id and (optional or not st.optional)
                       for st in task.steps)

    # -- the reviewer ------------------------------------------------------------------------------------

    def _executor(self, loop: LoopHandle) -> object:
        """The command executor that runs the reviewer: the loop's config with the reviewer's command line."""
        if self._reviewer is None:
            from kiro.executors.command import CommandExecutor

            review = loop.cfg.review
            assert review is not None
            cfg = loop.cfg.model_copy(update={
                "agent": review.agent, "executor_command": review.command, "agent_args": [], "fallback_agents": [],
                "command_success": "exit_code",
                "acp_command": loop.cfg.acp_command if review.agent == loop.cfg.agent else None})
            try:
                executor = CommandExecutor(cfg, loop.ws, loop.state.task_id)
            except ExecutorError as exc:
                raise ExecutorError(f"review: {exc}") from None
            executor.reviewer = True
            self._reviewer = executor
        return self._reviewer

    async def _run(self, loop: LoopHandle, step: Step, prompt: str, number: int) -> tuple[StepResult, float]:
        from kiro.executors.command import CommandExecutor

        executor = self._executor(loop)
        assert isinstance(executor, CommandExecutor)
        s = loop.state
        task = self.task
        if task is None:
            with contextlib.suppress(TaskFileError, TaskNotFound):
                task = tasks.load(loop.task_path)
        assert task is not None

        async def sleep(seconds: float) -> str | None:
            stop = await loop.wait(seconds)
            return stop.reason if stop is not None else None

        ctx = StepContext(
            task_id=s.task_id, workspace=loop.ws, project_dir=loop.project_dir, task_path=loop.task_path,
            task=task, step=step, iteration=s.iteration, attempt=number, prompt=prompt, system_prompt="",
            reinjected=False, continuation=None, previous_error=None, verify_output=None,
            timeout_seconds=loop.cfg.step_timeout_seconds, config=executor.config, state=s, cancel=loop.cancel,
            emit=loop.emit, sleep=sleep, guard=loop.step_guard(), redact=loop.redact)
        began = time.monotonic()
        result = await executor.run_step(ctx)
        result.redact(loop.redact)
        s.usage.add(result.usage)  # the reviewer's usage counts in the loop's
        return result, time.monotonic() - began

    # -- the pause ---------------------------------------------------------------------------------------

    def _pause(self, loop: LoopHandle, step: Step, why: str) -> Stop:
        s = loop.state
        rec = s.step_record(step.id)
        path = loop.ws.review_changes_note(s.task_id)
        rounds = rec.reviews[rec.reviews_counted_from:]
        lines = [f"# Review of step {step.id} needs a person", "", f"Task `{s.task_path}`, step {step.id}: "
                 f"{step.title or step.text}", "", f"The loop paused because {why}.", "", "## The review rounds", ""]
        for r in rounds:
            lines.append(f"- round {r.round} ({r.agent}): **{r.verdict}**" + (f": {r.reasons}" if r.reasons else "")
                         + (f" (log: `{r.log}`)" if r.log else ""))
        lines += ["", "The step's box is open. Look at the work and the reasons; change the step, the code or the "
                      "review settings if needed, then `kiro loop resume --task-id " + s.task_id + "`: the step runs "
                      "again with the last reasons in its prompt, and is reviewed again (max_rounds counts afresh).",
                  ""]
        loop.write_report(path, loop.redact.text("\n".join(lines)))
        rec.reviews_counted_from = len(rec.reviews)
        s.report_path = loop.ws.relative(path)
        return conditions.needs_action(f"review of step {step.id}: {why}; see {s.report_path}, then "
                                       f"`kiro loop resume --task-id {s.task_id}`", "review_changes")

    # -- receipts ----------------------------------------------------------------------------------------

    def _on_event(self, event: events.Event) -> None:
        """The step's review rounds go into its receipt (made by kiro.core.evidence on the same event, before
        this listener hears it)."""
        if not isinstance(event, (events.StepCompleted, events.StepRecovered)) or self.loop is None:
            return
        s = self.loop.state
        rec = s.steps.get(event.step_id)
        if rec is None or not rec.reviews:
            return
        if s.completed_steps and s.completed_steps[-1].step_id == event.step_id:
            receipt = s.completed_steps[-1].receipt
            if receipt is not None:
                receipt.reviews = list(rec.reviews)
                _step_own_usage(receipt)
        rec.reviews = []
        rec.reviews_counted_from = 0


def _step_own_usage(receipt: Receipt) -> None:
    """The receipt's tokens and cost are the step's own: kiro.core.evidence counts what the loop spent from the
    step's first attempt on, the reviews too; theirs are in their rounds (`reviews`), so they come off here."""
    began = timeutil.parse(receipt.started_at) if receipt.started_at else None
    for r in receipt.reviews:
        if began is None or r.at is None or timeutil.parse(r.at) < began:
            continue  # a round before the receipt's window (an earlier run of the loop): not counted in it
        receipt.prompt_tokens = max(receipt.prompt_tokens - r.prompt_tokens, 0)
        receipt.completion_tokens = max(receipt.completion_tokens - r.completion_tokens, 0)
        receipt.total_tokens = max(receipt.total_tokens - r.total_tokens, 0)
        receipt.cost_usd = round(max(receipt.cost_usd - r.cost_usd, 0.0), 6)


# -- the prompt and the answer ---------------------------------------------------------------------------


def reviewer_name(cfg: Config) -> str:
    review = cfg.review
    assert review is not None
    if review.agent:
        return review.agent
    words = (review.command or "").split()
    return f"command {os.path.basename(words[0])}" if words else "command"


def _when(loop: LoopHandle) -> str:
    return loop.cfg.review.when if loop.cfg.review is not None else "step"


def review_prompt(loop: LoopHandle, step: Step, diff: str | None, base: str | None, verify: VerifyRun | None) -> str:
    parts = [INSTRUCTIONS, f"## The step\n\nStep {step.id} of `{loop.state.task_path}`: {step.title or step.text}"]
    if step.details:
        parts[-1] += "\n\n" + "\n".join(step.details)
    cited = kirospec.cited_requirements(loop.task_path, step.details)
    if cited:
        parts.append("## The requirements it cites (from the spec's requirements.md)\n\n" + "\n".join(cited))
    if diff is None:
        parts.append("## Its diff\n\n(the project is not a git work tree: kiro has no diff to show; read the files)")
    else:
        more = f"\n... ({len(diff) - DIFF_CHARS} more characters)" if len(diff) > DIFF_CHARS else ""
        shown = diff[:DIFF_CHARS] + more
        since = {"step": "the step's start", "checkpoint": "the last checkpoint",
                 "task": "the loop's start: the whole task's work"}[_when(loop)]
        parts.append(f"## Its diff (against commit {base[:12] if base else '?'}, {since})\n\n```diff\n"
                     f"{shown or '(no changes)'}\n```")
    if verify is None:
        parts.append("## Verify\n\nNo verify command is set: nothing checked this step.")
    else:
        parts.append(f"## Verify\n\n`{verify.command}` exited {verify.exit_code}. The tail of its output:\n\n```\n"
                     f"{verify.output[-VERIFY_TAIL_CHARS:].strip()}\n```")
    parts.append("Now judge, and end with the REVIEW: line.")
    return "\n\n".join(parts) + "\n"


def read_answer(result: StepResult) -> tuple[str, str]:
    """(verdict, reasons): "approve", "changes" (the reasons), or "invalid" (what was wrong)."""
    if not result.ok:
        return "invalid", f"the reviewer failed: {first_line(result.error or 'no output')}"
    lines = [ln.strip().strip("*`_> ").strip() for ln in (result.summary or "").splitlines() if ln.strip()]
    if not lines:
        return "invalid", "the reviewer said nothing"
    m = VERDICT.match(lines[-1])
    if m is None:
        return "invalid", f"its answer does not end with a REVIEW: APPROVE or REVIEW: CHANGES line (it ends: " \
                          f"{clip(lines[-1], 200)!r})"
    if m.group(1).upper() == "APPROVE":
        return "approve", ""
    reasons = m.group(2).strip() or "\n".join(lines[-12:-1]).strip()
    if not reasons:
        return "invalid", "REVIEW: CHANGES without reasons"
    return "changes", reasons


def first_line(text: str) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return clip(line, 300)


# -- git ---------------------------------------------------------------------------------------------------


def _head(project: Path) -> str | None:
    from kiro.git import checkpoints

    try:
        out = checkpoints.Git(project).run("rev-parse", "--verify", "-q", "HEAD", check=False, timeout=30).stdout
    except checkpoints.GitError:
        return None
    return out.strip() or None


def _keep(loop: LoopHandle) -> tuple[receipts.Protected, dict[str, str]] | None:
    """With the box off (`sandbox: off`), before a reviewer runs: a copy of the project's files git knows (tracked,
    and untracked but not ignored; the task file too), in `.state/review/<task_id>/`, to put back what the
    reviewer changes, as kiro.core.evidence puts protected paths back. None when the reviewer runs in its box (the
    project is read-only there) or the project is not in a git work tree."""
    from kiro.git import checkpoints

    if sandbox.wanted(loop.cfg.sandbox):
        return None
    project = Path(loop.project_dir)
    top = checkpoints.toplevel(project)
    if top is None:
        return None
    rel = os.path.relpath(project.resolve(), top)
    spec = checkpoints.pathspec("" if rel == "." else Path(rel).as_posix(), checkpoints.kiro_paths(loop.ws, top))
    task_file: list[str] = []
    with contextlib.suppress(ValueError):
        task_file.append(Path(loop.task_path).resolve().relative_to(top).as_posix())

    def files() -> list[str]:
        out = checkpoints.Git(top).run("ls-files", "--cached", "--others", "--exclude-standard", "-z", "--",
                                       *spec).stdout
        return sorted({n for n in out.split("\0") if n} | set(task_file))

    kept = receipts.Protected(loop.ws, loop.state.task_id, top, [], files=files, area="review")
    try:
        return kept, kept.snapshot()
    except (checkpoints.GitError, OSError):
        return None


def _put_back(kept: receipts.Protected, manifest: dict[str, str]) -> list[str]:
    """What the reviewer changed of the files `_keep` kept ("changed: app.py"), put back."""
    from kiro.git import checkpoints

    try:
        changes = kept.changes(manifest)
    except checkpoints.GitError as exc:
        return [f"git could not tell ({exc})"]
    failed = kept.put_back(manifest, changes)
    return [str(c) for c in changes] + [f"not put back: {f}" for f in failed]


def _diff(loop: LoopHandle, base: str | None) -> str | None:
    """The step's work: `git diff` of the project's files against `base` (kiro's own folders and the task file
    left out), then
    each new file not ignored, with its text. None when the project is not in a git work tree."""
    from kiro.git import checkpoints

    project = Path(loop.project_dir)
    top = checkpoints.toplevel(project)
    if top is None or base is None:
        return None
    rel = os.path.relpath(project.resolve(), top)
    excludes = checkpoints.kiro_paths(loop.ws, top)
    with contextlib.suppress(ValueError):  # the task file: its boxes are kiro's, not the step's work
        excludes.append(Path(loop.task_path).resolve().relative_to(top).as_posix())
    spec = checkpoints.pathspec("" if rel == "." else Path(rel).as_posix(), excludes)
    git = checkpoints.Git(top)
    try:
        diff = git.run("diff", "--no-color", "--no-ext-diff", "--no-textconv", base, "--", *spec).stdout
        new = git.run("ls-files", "--others", "--exclude-standard", "-z", "--", *spec).stdout.split("\0")
    except checkpoints.GitError as exc:
        return f"(git could not tell: {exc})"
    parts = [diff.rstrip()] if diff.strip() else []
    new = sorted(n for n in new if n)
    for name in new[:NEW_FILES_SHOWN]:
        try:
            with open(top / name, "rb") as fh:
                data = fh.read(NEW_FILE_CHARS + 1)
        except OSError:
            continue
        if b"\0" in data:
            parts.append(f"new file {name} (binary)")
            continue
        text = data.decode("utf-8", "replace")
        more = "\n... (more)" if len(text) > NEW_FILE_CHARS else ""
        parts.append(f"new file {name}:\n" + "\n".join(f"+{ln}" for ln in text[:NEW_FILE_CHARS].splitlines()) + more)
    if len(new) > NEW_FILES_SHOWN:
        parts.append(f"... and {len(new) - NEW_FILES_SHOWN} more new files: " + ", ".join(new[NEW_FILES_SHOWN:][:50]))
    return "\n".join(parts)
