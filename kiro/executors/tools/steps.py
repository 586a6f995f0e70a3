"""The step tools: how the agent tells kiro the step is done, failed, needs a person, needs more
steps, or must wait (complete_step, fail_step, request_human, add_steps, sleep; SPEC §5).

Only these end an attempt: kiro, not the model's prose, decides when a step is done. A reply that
says "all done" completes nothing; `complete_step` does, and then `verify` must still pass.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import Field, field_validator

from kiro.executors.tools.base import Args, Ending, Tool, ToolEnv, ToolResult
from kiro.executors.tools.errors import ToolError
from kiro.store.events import StepsProposed

SLEEP_MAX_SECONDS = 3600.0
TEXT_LIMIT = 8000


class CompleteStepArgs(Args):
    summary: str = Field(min_length=1, max_length=TEXT_LIMIT, description="what was done, in a paragraph")


async def complete_step(args: CompleteStepArgs, env: ToolEnv) -> ToolResult:
    summary = env.redact(args.summary.strip())
    return ToolResult("step reported complete; kiro verifies it and checks the box",
                      ending=Ending("completed", summary=summary))


class FailStepArgs(Args):
    error: str = Field(min_length=1, max_length=TEXT_LIMIT, description="why the step cannot be done now")


async def fail_step(args: FailStepArgs, env: ToolEnv) -> ToolResult:
    error = env.redact(args.error.strip())
    return ToolResult("step reported failed for this attempt", ending=Ending("failed", error=error))


class RequestHumanArgs(Args):
    question: str = Field(min_length=1, max_length=TEXT_LIMIT,
                          description="the decision or information only a person can give")


async def request_human(args: RequestHumanArgs, env: ToolEnv) -> ToolResult:
    question = env.redact(args.question.strip())
    return ToolResult("question passed to a person; the loop pauses",
                      ending=Ending("request_human", question=question))


class AddStepsArgs(Args):
    steps: list[str] = Field(min_length=1, max_length=20, description="titles of the new unchecked steps")
    after: str | None = Field(None, description="id of the step to insert after (e.g. '2.1'); "
                                                "omitted: appended at the end of the task")
    reason: str = Field("", max_length=2000, description="why these steps are needed (a person may have to "
                                                          "approve them)")

    @field_validator("steps")
    @classmethod
    def _one_line_each(cls, steps: list[str]) -> list[str]:
        cleaned = []
        for i, title in enumerate(steps):
            t = " ".join(title.split())
            if not t:
                raise ValueError(f"step {i + 1} is empty")
            if len(t) > 300:
                raise ValueError(f"step {i + 1} is longer than 300 characters")
            cleaned.append(t)
        return cleaned


async def add_steps(args: AddStepsArgs, env: ToolEnv) -> ToolResult:
    from kiro.errors import TaskFileError
    from kiro.store import tasks  # the task-file module, loaded when the tool is used

    after = args.after.strip().rstrip(".") if args.after is not None else None
    titles = [env.redact(t) for t in args.steps]
    try:
        if after is not None and tasks.load(env.ctx.task_path).find(after) is None:
            ids = ", ".join(s.id for s in tasks.load(env.ctx.task_path).steps[:60])
            raise ToolError(f"no step {args.after!r} in the task file; the step ids are: {ids}")
        if env.ctx.config.approval.agent_steps:
            return _propose(env, titles, after, env.redact(args.reason))
        _, added = tasks.add_steps(env.ctx.task_path, titles, after=after)
    except TaskFileError as exc:
        raise ToolError(str(exc)) from None
    listed = "; ".join(f"{s.id}: {s.title or s.text}" for s in added)
    return ToolResult(f"added {len(added)} unchecked step(s) to the task file: {listed}")


def _propose(env: ToolEnv, titles: list[str], after: str | None, reason: str) -> ToolResult:
    """approval.agent_steps (SPEC §11): a proposal for a person, not an edit of the task file."""
    from kiro.store import approval

    ctx = env.ctx
    path = approval.propose(ctx.workspace, ctx.task_id, ctx.workspace.relative(ctx.task_path), titles, after, reason)
    rel = ctx.workspace.relative(path)
    ctx.emit(StepsProposed(proposal=rel, steps=titles, after=after))
    return ToolResult(f"proposed {len(titles)} step(s) for a person's approval in {rel}; they are not in the task "
                      f"file yet. Go on with the current step; you will be told if they are rejected.")


class SleepArgs(Args):
    seconds: float = Field(gt=0, description=f"how long to wait (at most {SLEEP_MAX_SECONDS:g} s)")
    reason: str = Field(min_length=1, max_length=500, description="what the wait is for (e.g. CI to finish)")


async def sleep(args: SleepArgs, env: ToolEnv) -> ToolResult:
    seconds = min(args.seconds, SLEEP_MAX_SECONDS)
    remaining = env.remaining()
    if remaining is not None:
        if remaining < 2:
            raise ToolError("no time left in this step to sleep")
        seconds = min(seconds, remaining - 1)
    began = time.monotonic()
    stop = await env.ctx.sleep(seconds)
    if stop is not None:
        return ToolResult(f"sleep interrupted: {stop}", ending=Ending("interrupted", stop_reason=stop))
    slept = time.monotonic() - began
    if slept < seconds - 0.5:  # only a message ends a sleep early without a stop (SPEC §11)
        return ToolResult(f"woken after {slept:.1f} s of {seconds:g} s: a message arrived (it follows)")
    return ToolResult(f"slept {seconds:g} s")


TOOLS: tuple[Tool[Any], ...] = (
    Tool("complete_step", "Report the current step done, with a summary. Only this completes a step; "
                          "kiro then runs the verification and checks the box.",
         CompleteStepArgs, complete_step),
    Tool("fail_step", "Report that the current step cannot be done in this attempt, with the reason.",
         FailStepArgs, fail_step),
    Tool("request_human", "Pause the loop and ask a person a question (a request file is written).",
         RequestHumanArgs, request_human),
    Tool("add_steps", "Add unchecked steps to the task file, after a given step or at the end.",
         AddStepsArgs, add_steps),
    Tool("sleep", "Wait a while (bounded), e.g. for CI; a stop request ends the wait.", SleepArgs, sleep),
)
