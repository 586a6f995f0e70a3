"""Reports as markdown with YAML frontmatter: pure functions from a state (and a few facts) to text.

Shapes follow seed 004: completion report, intervention request, escalation, stop hook, progress
dashboard. Every report's frontmatter has `type`, `task_id` and `created` (SPEC §6).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import Enum
from typing import Any

from kiro import timeutil
from kiro.status import percent
from kiro.store import frontmatter
from kiro.store.state import CompletedStep, FailedStep, LoopState, first_line
from kiro.usage import dollars
from kiro.views import loops


def _frontmatter(fields: dict[str, Any]) -> str:
    fields = {k: v.value if isinstance(v, Enum) else v for k, v in fields.items()}  # Status -> its string
    return frontmatter.write(fields)


frontmatter_block = _frontmatter  # for reports written elsewhere (kiro.core.scheduled)


def _pct(x: float | None) -> str:
    return percent(x)


def _step_line(s: CompletedStep | FailedStep) -> str:
    if isinstance(s, CompletedStep):
        return f"- **{s.step_id}** {s.description} ({timeutil.human_duration(s.duration_seconds)})"
    return f"- **{s.step_id}** {s.description}: {first_line(s.error)} (attempt {s.retry_count + 1})"


def _list(items: Sequence[CompletedStep | FailedStep]) -> str:
    return "\n".join(_step_line(s) for s in items) if items else "_None._"


def _usage(state: LoopState) -> str:
    u = state.usage
    if not u.api_calls:
        return ""
    return (f"\n## Usage\n- **API calls**: {u.api_calls}\n- **Tokens**: {u.total_tokens} "
            f"({u.prompt_tokens} prompt, {u.completion_tokens} completion)\n- **Cost**: {dollars(u.cost_usd)}\n")


def _current(state: LoopState) -> str:
    c = state.current_step
    return f"{c.step_id} - {c.description}" if c else "-"


def completion_report(state: LoopState, *, moved_to: str | None) -> str:
    m = state.metrics
    where = f"and moved to `{moved_to}`" if moved_to else f"(task file: `{state.task_path}`)"
    return _frontmatter({
        "type": "completion_report",
        "task_id": state.task_id,
        "created": timeutil.iso(),
        "completed_at": state.finished_at or timeutil.iso(),
        "task_path": state.task_path,
        "status": "completed",
    }) + f"""
# Task Completion Report

## Summary
**Task**: {state.title or state.task_path} (`{state.task_path}`)
**Status**: ✅ COMPLETED
**Duration**: {timeutil.human_duration(m.total_duration_seconds)} ({m.total_duration_seconds:.1f} seconds)
**Iterations**: {state.iteration}

## Statistics
- **Total Steps**: {state.steps_total if state.steps_total is not None else len(state.completed_steps)}
- **Completed by this loop**: {len(state.completed_steps)}
- **Failed attempts**: {len(state.failed_steps)}
- **Success Rate**: {_pct(m.success_rate)}

## Completed Steps
{_list(state.completed_steps)}

## Failed Steps (Recovered)
{_list(state.failed_steps)}

## Metrics
- **Average Step Duration**: {m.average_step_duration:.2f}s
- **Total Successes**: {state.total_successes}
- **Total Failures**: {state.total_failures}
{_usage(state)}{_git(state)}{_receipts(state)}
---

**Task successfully completed {where}.**
"""


def _receipts(state: LoopState) -> str:
    """SPEC §14: a line per completed step's receipt (`kiro loop receipt` shows it whole)."""
    rows = []
    for c in state.completed_steps:
        r = c.receipt
        if r is None:
            continue
        v = r.verify
        verify = "no verify" if v is None else f"verify exit {v.exit_code}" + (
            f", {v.tests.describe()}" if v.tests is not None else "")
        guarded = "" if r.protected is None else ", protected paths untouched" if r.protected.ok else \
            ", protected paths changed"
        commit = f", commit `{r.checkpoint[:12]}`" if r.checkpoint else ""
        again = ", counted after a restart" if r.recovered else ""
        rows.append(f"- **{c.step_id}** {c.description}: {r.agent or r.executor or '-'}, {r.attempts} attempt(s), "
                    f"{verify}{guarded}{commit}{again}")
    if not rows:
        return ""
    return (f"\n## Receipts\n{chr(10).join(rows)}\n\n`kiro loop receipt --task-id {state.task_id}` shows each "
            f"in full.\n")


def _git(state: LoopState) -> str:
    """The loop's checkpoints, and its branch with isolation (SPEC §9)."""
    g = state.git
    if g is None or not g.checkpoints:
        return ""
    lines = ["", "## Checkpoints (git)"]
    for c in state.completed_steps:
        mark = f"`{c.checkpoint[:12]}`" if c.checkpoint else f"_{c.checkpoint_note or 'none'}_"
        lines.append(f"- **{c.step_id}**: {mark}")
    lines.append(f"- Review: `git log --grep 'Kiro-Task-Id: {state.task_id}'`")
    if g.isolation == "worktree" and g.branch:
        if g.merge_status == "merged":
            lines.append(f"- **Branch**: `{g.branch}` merged into `{g.base_branch or 'HEAD'}` as "
                         f"`{(g.merge_commit or '')[:12]}`")
        else:
            where = f"worktree `{g.worktree}`" if g.worktree else "made by kiro workers, fetched from the remote"
            lines.append(f"- **Branch**: `{g.branch}` left for review ({where}): "
                         f"`git log {g.base_branch or 'HEAD'}..{g.branch}`, then `git merge {g.branch}`")
    return "\n".join(lines) + "\n"


def merge_intervention(state: LoopState, *, problem: str, files: Sequence[str]) -> str:
    """A merge of a loop's branch that needs a person (SPEC §9): which branch, into what, which files."""
    g = state.git
    branch = g.branch if g else "?"
    into = (g.base_branch if g else None) or "HEAD"
    where = g.toplevel if g else "?"
    listed = "\n".join(f"- `{f}`" for f in files) or "_none listed_"
    return _frontmatter({
        "type": "intervention_request",
        "task_id": state.task_id,
        "created": timeutil.iso(),
        "reason": "merge_conflict",
        "task_path": state.task_path,
        "status": state.status,
        "branch": branch,
        "into": into,
        "files": list(files),
    }) + f"""
# Intervention Request: merge

## Reason
{problem}

**Branch**: `{branch}` into `{into}` (work tree `{where}`)

## Files
{listed}

## Options
- [ ] Resolve the conflicts in `{where}` (edit the files, `git add` them, `git commit`), then
      `kiro loop resume --task-id {state.task_id}`
- [ ] Or abort it (`git merge --abort`), merge `{branch}` yourself when ready, then resume
"""


def step_conflict(state: LoopState, *, step_id: str, branch: str, files: Sequence[str]) -> str:
    """A step run side by side (`parallel: N`) whose work conflicts with the steps merged before it, also when
    it ran again on the merged tree: which step, which branch holds its work, which files."""
    where = (state.git.worktree or state.git.toplevel) if state.git else "?"
    listed = "\n".join(f"- `{f}`" for f in files) or "_none listed_"
    return _frontmatter({
        "type": "intervention_request",
        "task_id": state.task_id,
        "created": timeutil.iso(),
        "reason": "step_conflict",
        "task_path": state.task_path,
        "step_id": step_id,
        "branch": branch,
        "files": list(files),
    }) + f"""
# Intervention Request: step {step_id} conflicts

## Reason
Step {step_id} ran beside other steps; its work conflicts with the steps merged before it in the files
below, and again when it ran once more on the merged tree (or those files hold changes nobody committed).

**Its work**: branch `{branch}` (`git diff HEAD...{branch}` in `{where}`)

## Files
{listed}

## Options
- [ ] Commit or undo the changes in those files in `{where}`, or do the step by hand and check its box
- [ ] Then `kiro loop resume --task-id {state.task_id}` (the step runs again on the tree as it is then)
"""


def intervention_request(state: LoopState, *, reason: str, detail: str) -> str:
    tid = state.task_id
    return _frontmatter({
        "type": "intervention_request",
        "task_id": tid,
        "created": timeutil.iso(),
        "reason": reason,
        "task_path": state.task_path,
        "status": state.status,
    }) + f"""
# Intervention Request

## Reason
{detail}

## Current Status
**Iteration**: {state.iteration}/{state.max_iterations}
**Success Rate**: {_pct(state.metrics.success_rate)}
**Current Step**: {_current(state)}
**Steps done**: {state.steps_done if state.steps_done is not None else '-'} of {state.steps_total or '-'}
{_usage(state)}
## Options
- [ ] {loops.advice(state, state.status, reason)}
- [ ] Review progress and provide guidance (edit the task file, then resume)
- [ ] Mark task as complete (move the task file to `Done/`)
- [ ] Cancel task

## State File
State saved at: `.state/autonomous_loop_{tid}.json`

---

**Please review and decide how to proceed.**
"""


def escalation(state: LoopState, *, reason: str, detail: str, recent: Iterable[FailedStep]) -> str:
    tid = state.task_id
    recent_text = "\n".join(
        f"- {f.failed_at} **{f.step_id}** (attempt {f.retry_count + 1}): {first_line(f.error, 400)}" for f in recent
    ) or "_None recorded._"
    return _frontmatter({
        "type": "escalation",
        "task_id": tid,
        "created": timeutil.iso(),
        "priority": "high",
        "reason": reason,
        "task_path": state.task_path,
    }) + f"""
# 🚨 Task Escalation

## Reason
{detail}

## Failure Details
**Consecutive Failures**: {state.consecutive_failures}
**Failure Threshold**: {state.failure_threshold}

## Recent Failures
{recent_text}

## Current Step
**Step**: {state.current_step.step_id if state.current_step else '-'}
**Description**: {state.current_step.description if state.current_step else '-'}

## Recommended Actions
1. Review error logs: `kiro loop logs --task-id {tid}`
2. Identify root cause
3. Provide guidance or fix issue
4. Resume loop (`kiro loop resume --task-id {tid} --reset-failures`) or cancel task

## State File
`.state/autonomous_loop_{tid}.json`

---

**Human intervention required to proceed.**
"""


def review_note(state: LoopState, *, why: str, steps: Sequence[CompletedStep], diff_stat: str,
                verify: str) -> str:
    """A review point (`pause_at_checkpoints`, `pause_every`): what was done since the last one, for a person."""
    tid = state.task_id
    return _frontmatter({
        "type": "review",
        "task_id": tid,
        "created": timeutil.iso(),
        "reason": "checkpoint",
        "task_path": state.task_path,
    }) + f"""
# Review point: {why}

## Steps done since the last review
{_list(steps)}

## Changes since the last review
```
{diff_stat.rstrip() or "(no changes)"}
```

## Verify
{verify}

## What to Do
- [ ] Review the changes (`git log`, `git diff`), fix or edit the task file as you see fit
- [ ] Go on: `kiro loop resume --task-id {tid}` (or delete this note while `kiro loop watch` runs)
"""


def human_request(state: LoopState, *, question: str) -> str:
    tid = state.task_id
    return _frontmatter({
        "type": "intervention_request",
        "task_id": tid,
        "created": timeutil.iso(),
        "reason": "agent_request",
        "task_path": state.task_path,
    }) + f"""
# The agent asks for help

## Question
{question}

## Current Status
**Iteration**: {state.iteration}/{state.max_iterations}
**Current Step**: {_current(state)}

## What to Do
- [ ] Answer the question: add the answer to the task file (under the step, or in its `instructions`)
- [ ] Resume the loop: `kiro loop resume --task-id {tid}`

---

**Loop is PAUSED until it is resumed.**
"""


def stop_hook(state: LoopState | None, *, task_id: str, reason: str, by: str = "kiro loop stop") -> str:
    if state is not None:
        status = (f"**Iteration**: {state.iteration}/{state.max_iterations}\n"
                  f"**Current Step**: {_current(state)}\n"
                  f"**Success Rate**: {_pct(state.metrics.success_rate)}")
    elif task_id == "*":
        status = "Every loop in this workspace pauses at its next safe point and starts no new step."
    else:
        status = "_No state recorded yet._"
    if task_id == "*":
        resume = ("1. Delete this file (a running `kiro loop watch` continues its loops), or run "
                  "`kiro loop resume --all`\n   (removes this file and continues every loop it paused)")
    else:
        resume = ("1. Delete this file (a running `kiro loop watch` continues the loop), or run "
                  f"`kiro loop resume --task-id {task_id}`")
    return _frontmatter({
        "type": "stop_hook",
        "task_id": task_id,
        "created": timeutil.iso(),
        "reason": reason,
        "created_by": by,
    }) + f"""
# Stop Autonomous Loop

## Reason for Stopping

{reason}

## Current Status

{status}

## What to Do

- [ ] Review progress so far
- [ ] Provide guidance for next steps
- [ ] Resume loop
- [ ] Cancel task

## Resume Instructions

To resume the loop:
{resume}
2. Or move task back to active folder (`Specs/`)
3. Loop will continue from saved state

---

**Loop is PAUSED until this file is deleted or task is moved.**
"""


def progress_report(state: LoopState, *, steps: Sequence[tuple[str, str, bool]], done: int | None = None,
                    total: int | None = None, before: int = 0, after: int = 0) -> str:
    """`steps`: (id, title, done) of the steps listed, which are all of them unless `before` and
    `after` say how many are left out above and below (then `done` and `total` count them all)."""
    if done is None:
        done = sum(1 for _, _, d in steps if d)
    if total is None:
        total = len(steps)
    lines = "\n".join(f"- [{'x' if d else ' '}] {sid} {title}" for sid, title, d in steps)
    if before:
        lines = f"_{before:,} step{'s' if before != 1 else ''} above not listed_\n" + lines
    if after:
        lines += f"\n_{after:,} step{'s' if after != 1 else ''} below not listed_"
    return _frontmatter({
        "type": "progress_report",
        "task_id": state.task_id,
        "created": timeutil.iso(),
        "iteration": state.iteration,
    }) + f"""
# Progress Report: {state.title or state.task_path}

**Iteration**: {state.iteration}/{state.max_iterations}
**Steps done**: {done}/{total}
**Success Rate**: {_pct(state.metrics.success_rate)}
**Current Step**: {_current(state)}
**Duration**: {timeutil.human_duration(state.metrics.total_duration_seconds)}
{_usage(state)}
## Steps
{lines}
"""
