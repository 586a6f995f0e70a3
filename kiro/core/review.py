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
- On the temporal backend the step's worker reviews it in its clone, before it pushes it (kiro.temporal.attempt,
  with this module's functions); `Review(remote=True)` on the workspace host records its rounds and pauses.

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
from typing import cast

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
from kiro.store.state import LoopState, clip
from kiro.store.tasks import Step, TaskFile, is_checkpoint
from kiro.store.workspace import Workspace

DIFF_CHARS = 24_000  # of the step's diff, in the prompt
NEW_FILE_CHARS = 4_000  # of each new file's text, in the prompt
NEW_FILES_SHOWN = 20
VERIFY_TAIL_CHARS = 2_000
TRIES = 2  # a review whose answer kiro cannot read is made once more, then the loop pauses

# compiled when a review is first read (re's cache): no work at import
VERDICT = r"(?i)^REVIEW:\s*(APPROVE|CHANGES)\b[\s:.\-—]*(.*)$"

INSTRUCTIONS = """\
You are reviewing one step of a plan that another agent has just done. Read the step, the requirements it
cites, its diff and the output of the project's checks. Judge whether the step is really done: the work it
asks for is there and correct, the requirements hold, no test was weakened, skipped or deleted to make the
checks pass, nothing unrelated was changed. Do not change any file: you only read and judge.

The last line of your answer must be the verdict: `REVIEW: APPROVE` when the step is done, or
`REVIEW: CHANGES <what must change, in one line>` when it is not.
"""


class Review(Feature):
    """`remote=True`: the temporal backend's workspace side. There the step's worker reviews it in its clone, before
    it commits and pushes the step (kiro.temporal.attempt, with this module's functions): the rounds come back on
    the attempt's result (`StepResult.reviews`); here they are recorded for the receipt, and a step its reviewer
    still did not approve pauses the loop as locally."""

    def __init__(self, *, remote: bool = False) -> None:
        self.remote = remote
        self.loop: LoopHandle | None = None
        self.task: TaskFile | None = None
        self.base: str | None = None  # the commit the step's attempt began from
        self._reviewer: object | None = None  # the CommandExecutor that runs the reviewer, made once per run

    # -- the hooks ---------------------------------------------------------------------------------------

    async def open(self, loop: LoopHandle) -> None:
        self.loop = loop
        loop.subscribe(self._on_event)

    async def begin(self, loop: LoopHandle, task: TaskFile) -> Stop | None:
        if loop.cfg.review is not None and not self.remote:
            self._executor(loop)  # a reviewer that cannot run ends the run now (exit 1), not after a night's step
        return None

    def choose_step(self, loop: LoopHandle, task: TaskFile, step: Step | None) -> Step | None:
        self.task = task
        return step

    async def before_step(self, loop: LoopHandle, step_id: str, attempts: int) -> tuple[None, bool]:
        if loop.cfg.review is not None and not self.remote:
            self.base = await asyncio.to_thread(head_commit, loop.project_dir)
        return None, True

    async def check_step(self, loop: LoopHandle, step: Step, verify: VerifyRun | None, *,
                         recovering: bool = False, result: StepResult | None = None) -> str | Reopen | None:
        review = loop.cfg.review
        if review is None:
            return None
        if self.remote:
            return await self._remote(loop, step, result, recovering)
        s = loop.state
        if not applies(review.when, step, self._task(loop), loop.cfg.include_optional):
            return None
        rec = s.step_record(step.id)
        base = review_base(s, review.when, self.base if not recovering else None)
        if base is None:
            base = await asyncio.to_thread(head_commit, loop.project_dir)
        diff = await asyncio.to_thread(diff_since, loop.ws, loop.project_dir, loop.task_path, base)
        prompt = loop.redact.text(review_prompt(step, loop.task_path, s.task_path, review.when, diff, base, verify))
        who = reviewer_name(loop.cfg)
        last: ReviewRound | None = None
        for _ in range(TRIES):
            number = len(rec.reviews) + 1
            loop.emit(events.ReviewStarted(step_id=step.id, round=number, reviewer=who))
            # unboxed: the project's files as the reviewer found them
            kept = await asyncio.to_thread(keep, loop.cfg, loop.ws, s.task_id, loop.project_dir, loop.task_path)
            result, seconds = await self._run(loop, step, prompt, number)
            changed = await asyncio.to_thread(put_back, *kept) if kept is not None else []
            if result.outcome == "interrupted":
                return Reopen("the review was cut short; the step is reviewed again when the loop goes on",
                              stop=loop.interrupt_check() or conditions.stopped(
                                  result.stop_reason or "interrupted", "stopped during a review"))
            last = round_of(number, who, result, seconds, changed)
            rec.reviews = [*rec.reviews, last]  # a new list: the journal sees the change
            await loop.asave()
            if last.verdict == "approve":
                loop.emit(events.ReviewApproved(step_id=step.id, round=number, reviewer=who))
                return None
            if last.verdict == "changes":
                break
            loop.emit(events.LoopWarning(message=f"review of step {step.id} (round {number}, {who}) failed: "
                                                 f"{first_line(last.reasons)}"))
        assert last is not None
        counted = sum(1 for r in rec.reviews[rec.reviews_counted_from:] if r.verdict == "changes")
        paused = last.verdict != "changes" or counted >= review.max_rounds
        if last.verdict == "changes":
            loop.emit(events.ReviewRequestedChanges(step_id=step.id, round=last.round, reviewer=who,
                                                    reasons=clip(last.reasons, 1000), paused=paused))
        if not paused:
            return Reopen(changes_reason(who, last))
        return Reopen(changes_reason(who, last), stop=self._pause(loop, step, pause_why(who, last, counted,
                                                                                        review.max_rounds)))

    async def _remote(self, loop: LoopHandle, step: Step, result: StepResult | None,
                      recovering: bool) -> Reopen | None:
        """The temporal backend: the rounds the worker ran (its events told already) go on the step's record; a
        step its reviewer did not approve (the worker pushed nothing) pauses the loop, with the note, as locally."""
        review = loop.cfg.review
        if recovering or result is None or not result.reviews or review is None:
            return None  # a step a worker pushed was reviewed there before it was pushed
        rec = loop.state.step_record(step.id)
        rounds = [r.model_copy(update={"round": len(rec.reviews) + n}) for n, r in enumerate(result.reviews, 1)]
        rec.reviews = [*rec.reviews, *rounds]
        await loop.asave()
        last = rounds[-1]
        if last.verdict == "approve":
            return None
        counted = sum(1 for r in rounds if r.verdict == "changes")
        who = reviewer_name(loop.cfg)
        return Reopen(changes_reason(who, last), stop=self._pause(loop, step, pause_why(who, last, counted,
                                                                                        review.max_rounds)))

    def _task(self, loop: LoopHandle) -> TaskFile | None:
        if self.task is not None:
            return self.task
        try:
            return tasks.load(loop.task_path)
        except (TaskFileError, TaskNotFound):
            return None

    # -- the reviewer ------------------------------------------------------------------------------------

    def _executor(self, loop: LoopHandle) -> object:
        """The command executor that runs the reviewer, made once per run."""
        if self._reviewer is None:
            self._reviewer = reviewer_executor(loop.cfg, loop.ws, loop.state.task_id)
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
        if event.event not in ("step_completed", "step_recovered") or self.loop is None:
            return
        step_id = cast("events.StepCompleted | events.StepRecovered", event).step_id  # StepRecovered: by its tag
        s = self.loop.state
        rec = s.steps.get(step_id)
        if rec is None or not rec.reviews:
            return
        if s.completed_steps and s.completed_steps[-1].step_id == step_id:
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


def reviewer_executor(cfg: Config, ws: Workspace, task_id: str) -> object:
    """The command executor that runs the reviewer: the loop's config with the reviewer's command line (an
    ExecutorError, "review: ...", when it cannot run)."""
    from kiro.executors.command import CommandExecutor

    review = cfg.review
    assert review is not None
    rcfg = cfg.model_copy(update={
        "agent": review.agent, "executor_command": review.command, "agent_args": [], "fallback_agents": [],
        "command_success": "exit_code", "acp_command": cfg.acp_command if review.agent == cfg.agent else None})
    try:
        executor = CommandExecutor(rcfg, ws, task_id)
    except ExecutorError as exc:
        raise ExecutorError(f"review: {exc}") from None
    executor.reviewer = True
    return executor


def applies(when: str, step: Step, task: TaskFile | None, include_optional: bool) -> bool:
    """Whether `step` is reviewed: every step (`when: step`); Kiro "Checkpoint" steps (`checkpoint`); the last step
    the loop has to do, every other step done (`task`)."""
    if when == "checkpoint":
        return is_checkpoint(step.title or step.text)
    if when == "task":
        return task is not None and not any(
            st.is_leaf and not st.done and st.id != step.id and (include_optional or not st.optional)
            for st in task.steps)
    return True


def review_base(state: LoopState, when: str, step_base: str | None) -> str | None:
    """The commit the work under review began from: the step's start (`when: step`, `step_base`); the last
    checkpoint step's commit, else the loop's first (`checkpoint`); the loop's first commit (`task`)."""
    first = state.git.base_commit if state.git is not None else None
    if when == "checkpoint":
        last = next((c.checkpoint for c in reversed(state.completed_steps)
                     if c.checkpoint and is_checkpoint(c.description)), None)
        return last or first
    if when == "task":
        return first
    return step_base


def round_of(number: int, who: str, result: StepResult, seconds: float, changed: list[str]) -> ReviewRound:
    """The record of one review round (both backends: the local loop above, the temporal worker's
    kiro.temporal.attempt): the reviewer's verdict and reasons as kiro read them (`invalid` when it changed the
    project's files, `changed`, which kiro put back), its usage, time and log."""
    verdict, reasons = read_answer(result)
    if changed:
        verdict, reasons = "invalid", (f"the reviewer changed the project's files (a reviewer only reads; "
                                       f"kiro put them back): {'; '.join(changed[:10])}")
    u = result.usage
    return ReviewRound(round=number, verdict=verdict, reasons=clip(reasons, 2000), agent=who,
                       prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens,
                       total_tokens=u.total_tokens, cost_usd=round(u.cost_usd, 6), seconds=round(seconds, 3),
                       log=result.log, at=timeutil.iso())


def changes_reason(who: str, last: ReviewRound) -> str:
    """What the step's next prompt says of its last review round (a CHANGES, or an answer kiro could not read)."""
    if last.verdict == "changes":
        return (f"A reviewer ({who}) read your work on this step and asked for changes before it counts as done "
                f"(review round {last.round}): {last.reasons}\nMake these changes, then finish the step as before.")
    return (f"The review of this step could not be read ({who}: {first_line(last.reasons)}); the step is reviewed "
            f"again after it runs again.")


def pause_why(who: str, last: ReviewRound, counted: int, max_rounds: int) -> str:
    """Why the loop pauses for a person after `last` (the note and the stop's message say it)."""
    if last.verdict == "changes":
        return f"the reviewer ({who}) still asks for changes after {counted} round(s) (max_rounds {max_rounds})"
    return f"the reviewer ({who}) gave no answer kiro could read, {TRIES} times"


# -- the prompt and the answer ---------------------------------------------------------------------------


def reviewer_name(cfg: Config) -> str:
    review = cfg.review
    assert review is not None
    if review.agent:
        return review.agent
    words = (review.command or "").split()
    return f"command {os.path.basename(words[0])}" if words else "command"


def review_prompt(step: Step, task_file: Path, shown_path: str, when: str, diff: str | None, base: str | None,
                  verify: VerifyRun | None) -> str:
    """The reviewer's prompt for `step` of the task file `task_file` (`shown_path`: its path as the state shows it)."""
    parts = [INSTRUCTIONS, f"## The step\n\nStep {step.id} of `{shown_path}`: {step.title or step.text}"]
    if step.details:
        parts[-1] += "\n\n" + "\n".join(step.details)
    cited = kirospec.cited_requirements(task_file, step.details)
    if cited:
        parts.append("## The requirements it cites (from the spec's requirements.md)\n\n" + "\n".join(cited))
    if diff is None:
        parts.append("## Its diff\n\n(the project is not a git work tree: kiro has no diff to show; read the files)")
    else:
        more = f"\n... ({len(diff) - DIFF_CHARS} more characters)" if len(diff) > DIFF_CHARS else ""
        shown = diff[:DIFF_CHARS] + more
        since = {"step": "the step's start", "checkpoint": "the last checkpoint",
                 "task": "the loop's start: the whole task's work"}[when]
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
    m = re.match(VERDICT, lines[-1])
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


def head_commit(project: Path) -> str | None:
    from kiro.git import gitcli

    try:
        out = gitcli.Git(project).run("rev-parse", "--verify", "-q", "HEAD", check=False, timeout=30).stdout
    except gitcli.GitError:
        return None
    return out.strip() or None


def keep(cfg: Config, ws: Workspace, task_id: str, project_dir: Path,
         task_path: Path) -> tuple[receipts.Protected, dict[str, str]] | None:
    """With the box off (`sandbox: off`), before a reviewer runs: a copy of the project's files git knows (tracked,
    and untracked but not ignored; the task file too), in `.state/review/<task_id>/`, to put back what the
    reviewer changes, as kiro.core.evidence puts protected paths back. None when the reviewer runs in its box (the
    project is read-only there) or the project is not in a git work tree."""
    from kiro.git import checkpoints, gitcli

    if sandbox.wanted(cfg.sandbox):
        return None
    project = Path(project_dir)
    top = gitcli.toplevel(project)
    if top is None:
        return None
    rel = os.path.relpath(project.resolve(), top)
    spec = checkpoints.pathspec("" if rel == "." else Path(rel).as_posix(), checkpoints.kiro_paths(ws, top))
    task_file: list[str] = []
    with contextlib.suppress(ValueError):
        task_file.append(Path(task_path).resolve().relative_to(top).as_posix())

    def files() -> list[str]:
        out = gitcli.Git(top).run("ls-files", "--cached", "--others", "--exclude-standard", "-z", "--",
                                       *spec).stdout
        return sorted({n for n in out.split("\0") if n} | set(task_file))

    kept = receipts.Protected(ws, task_id, top, [], files=files, area="review")
    try:
        return kept, kept.snapshot()
    except (gitcli.GitError, OSError):
        return None


def put_back(kept: receipts.Protected, manifest: dict[str, str]) -> list[str]:
    """What the reviewer changed of the files `keep` kept ("changed: app.py"), put back."""
    from kiro.git import gitcli

    try:
        changes = kept.changes(manifest)
    except gitcli.GitError as exc:
        return [f"git could not tell ({exc})"]
    failed = kept.put_back(manifest, changes)
    return [str(c) for c in changes] + [f"not put back: {f}" for f in failed]


def diff_since(ws: Workspace, project_dir: Path, task_path: Path, base: str | None) -> str | None:
    """The step's work: `git diff` of the project's files against `base` (kiro's own folders and the task file
    left out), then
    each new file not ignored, with its text. None when the project is not in a git work tree."""
    from kiro.git import checkpoints, gitcli

    project = Path(project_dir)
    top = gitcli.toplevel(project)
    if top is None or base is None:
        return None
    rel = os.path.relpath(project.resolve(), top)
    excludes = checkpoints.kiro_paths(ws, top)
    with contextlib.suppress(ValueError):  # the task file: its boxes are kiro's, not the step's work
        excludes.append(Path(task_path).resolve().relative_to(top).as_posix())
    spec = checkpoints.pathspec("" if rel == "." else Path(rel).as_posix(), excludes)
    git = gitcli.Git(top)
    try:
        diff = git.run("diff", "--no-color", "--no-ext-diff", "--no-textconv", base, "--", *spec).stdout
        new = git.run("ls-files", "--others", "--exclude-standard", "-z", "--", *spec).stdout.split("\0")
    except gitcli.GitError as exc:
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
