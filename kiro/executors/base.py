"""The one interface every executor implements, and what passes between it and the engine.

The engine builds a `StepContext` for each attempt at a step and awaits `Executor.run_step`.
The executor never checks boxes itself (the command executor's external agent may); it reports a
`StepResult` and the engine decides: runs `verify`, checks the box, records the attempt.

An executor that cannot run at all (no endpoint, bad key, unknown model) raises
`kiro.errors.ExecutorError`: the run ends with exit code 1. Anything that is one failed attempt
(a tool error, a 500, a timeout, a non-zero exit) is a `StepResult` with outcome "failed".
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from kiro.store.redact import Redactor
from kiro.usage import Usage

if TYPE_CHECKING:
    from kiro.store.config import Config
    from kiro.store.receipts import ProtectedCheck, ReviewRound, VerifyRun
    from kiro.store.state import LoopState
    from kiro.store.tasks import Step, TaskFile
    from kiro.store.workspace import Workspace

__all__ = ["Executor", "Guard", "Outcome", "StepContext", "StepResult", "Usage"]

Outcome = Literal["completed", "failed", "request_human", "interrupted"]


@dataclass(eq=False)
class StepResult:
    outcome: Outcome
    summary: str = ""  # what was done (complete_step's summary, or the output's tail); -> context.last_response
    error: str | None = None  # why the attempt failed, for the next attempt's prompt and the state
    question: str | None = None  # request_human's question
    usage: Usage = field(default_factory=Usage)
    checked_by_executor: bool = False  # the external agent checked the step's box itself
    stop_reason: str | None = None  # for "interrupted": which stop condition cut the attempt short
    checkpoint: Any = None  # a checkpoints.Result made elsewhere (temporal backend: the worker's pushed commit)
    agent: str | None = None  # the agent CLI that made this attempt (the command executor; a fallback agent's name)
    log: str | None = None  # the attempt's full output, workspace-relative (an agent CLI's Logs/<id>/<step>-<n>.log)
    seconds: float | None = None  # how long the attempt worked, when it began before the engine asked (parallel)
    # Evidence gathered where the step ran, when that is not the loop's host (the temporal backend's worker):
    # its verify run (the engine then runs none), its protected-path check (SPEC §14, kiro.core.evidence) and its
    # review rounds (kiro.core.review's Review(remote=True))
    verify: VerifyRun | None = None
    protected: ProtectedCheck | None = None
    reviews: list[ReviewRound] | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == "completed"

    def redact(self, redactor: Redactor) -> None:
        """Cut secrets from what the attempt reports (an agent's or a step's output)."""
        self.summary = redactor.text(self.summary)
        self.error = redactor.text(self.error) if self.error else self.error
        self.question = redactor.text(self.question) if self.question else self.question


class Guard:
    """Limits the executor must respect mid-step (rate limits, budgets, stop requests).

    The engine passes a live one; this base class allows everything. `before_model_call` and
    `before_tool_call` may sleep (a rate limit) and return a stop reason when the loop must stop
    now (stop hook, budget exhausted): the executor then ends the attempt with outcome
    "interrupted" and that reason.
    """

    async def before_model_call(self) -> str | None:
        return None

    async def interruption(self) -> str:
        """Returns, with its stop reason, once a stop ends the loop now (a stop hook, the task file moved; a
        signal sets the step's `cancel` as well); no guardrail is counted or waited for. Awaited by the
        watchdog of an agent that runs on its own between the calls kiro sees (an ACP agent's turn:
        kiro.processes.spawn.Watchdog). Here: never."""
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def before_tool_call(self, name: str, arguments: Mapping[str, Any]) -> str | None:
        return None

    async def wait(self, limit: str, seconds: float, message: str, *, figure: Any = None,
                   note: str | None = None) -> str | None:
        """Sleep `seconds` because something outside asks for it (a server's long Retry-After, an agent
        CLI's usage limit), the way the loop sleeps for a budget: status `sleeping` (`note`, if given,
        is what `status` shows of it: "claude limit, resumes 03:10 UTC"), a stop hook ends it.
        Returns a stop reason when the wait was cut short."""
        await asyncio.sleep(seconds)
        return None

    def stop(self, limit: str, value: Any, figure: Any, message: str) -> str:
        """End the loop on a hard limit the executor found (exit 4, `stop_reason` the limit); returns
        the stop reason for the attempt's "interrupted" result."""
        return limit

    def after_model_call(self, usage: Usage) -> None:
        return None

    def after_tool_call(self, name: str, arguments: Mapping[str, Any], error: str | None) -> None:
        return None


@dataclass(eq=False, repr=False)
class StepContext:
    task_id: str
    workspace: Workspace
    project_dir: Path
    task_path: Path
    task: TaskFile
    step: Step
    iteration: int
    attempt: int  # 1 for the first attempt at this step
    prompt: str  # the step prompt (kiro.executors.prompts.step_prompt), with the continuation context when reinjected
    system_prompt: str  # kiro.executors.prompts.system_prompt for this task
    reinjected: bool  # the reinjection policy fired for this iteration (seed 004)
    continuation: str | None  # the seed's "Task Continuation Context" when reinjected
    previous_error: str | None
    verify_output: str | None
    timeout_seconds: float
    config: Config
    state: LoopState  # read-only for executors
    cancel: asyncio.Event  # set when the loop must stop now (SIGTERM, stop --force, overall timeout)
    emit: Callable[..., None]  # emit(events.SomeEvent(...)) -> every listener (the log, the terminal, ...)
    sleep: Callable[[float], Awaitable[str | None]]  # interruptible wait; returns a stop reason if cut short
    guard: Guard = field(default_factory=Guard)
    # The loop's redactor (kiro.store.redact): pass every text an executor writes to disk or sends
    # (attempt logs, transcripts, prompt files, requests) through `ctx.redact.text(...)`.
    redact: Redactor = field(default_factory=Redactor)
    # Messages queued for the loop since the prompt was made (SPEC §11): returns them as prompt text
    # (recorded as delivered) or None. A multi-turn executor calls it before each further model call.
    messages: Callable[[], str | None] | None = None

    def redacted(self) -> StepContext:
        """This context with its prompts cut of secrets: what the executor sends the model is clean,
        also a retry prompt that quotes a failed step's or verify's output."""
        r = self.redact
        self.prompt = r.text(self.prompt)
        self.system_prompt = r.text(self.system_prompt)
        self.continuation = r.text(self.continuation) if self.continuation else self.continuation
        self.previous_error = r.text(self.previous_error) if self.previous_error else self.previous_error
        self.verify_output = r.text(self.verify_output) if self.verify_output else self.verify_output
        return self


class Executor(Protocol):
    name: str
    checks_boxes: bool  # its agent checks the step's box itself: a failed attempt's box is put back
    reads_prompt: bool  # an agent reads the prompt; the shell executor runs the step's own command

    def build_prompts(self, task: TaskFile, step: Step, state: LoopState, *, workspace: Workspace, attempt: int,
                previous_error: str | None, verify_output: str | None, verify_command: str | None,
                continuation: str | None, task_path: str | None = None,
                task_file: Path | None = None) -> tuple[str, str]: ...

    async def run_step(self, ctx: StepContext) -> StepResult: ...

    async def aclose(self) -> None: ...

    def billing_line(self) -> str | None: ...

    def credential(self) -> str | None: ...


class ExecutorBase:
    """What an executor says about itself besides running a step: the prompts it sends and how its
    agent reports a step done (STYLE 15: the engine asks these, never "which executor is this?").
    The defaults fit a tool-calling agent: `system.md`, and "call `complete_step`"."""

    name: str = "base"
    system_template: str = "system.md"  # in kiro/prompts/, overridable in <workspace>/config/prompts/
    checks_boxes: bool = False
    reads_prompt: bool = True  # an agent reads the prompt (messages for the loop go into it); a command does not

    def billing_line(self) -> str | None:
        """The start line's account of the credential an agent CLI bills (None: nothing to say)."""
        return None

    def credential(self) -> str | None:
        """The credential the loop's agent bills, in a few words (`claude uses its login (~/...)`): recorded at
        its start, and a resume that would bill another is refused (kiro.core.runner.prepare_resume)."""
        return None

    def finish_instruction(self, step: Step, task_path: str, *, task: TaskFile | None = None,
                           task_file: Path | None = None) -> str:
        """How the agent reports the step done (the end of the step prompt)."""
        from kiro.executors import prompts

        return prompts.finish_instruction("openai", step, task_path, "exit_code")

    def build_prompts(self, task: TaskFile, step: Step, state: LoopState, *, workspace: Workspace, attempt: int,
                previous_error: str | None, verify_output: str | None, verify_command: str | None,
                continuation: str | None, task_path: str | None = None,
                task_file: Path | None = None) -> tuple[str, str]:
        """(system prompt, step prompt) for one attempt at `step`. `task_path`: the task file as the
        agent must name it (absolute when the loop works in its own git worktree), else the state's;
        `task_file`: where it is on disk. An executor whose agent reads no prompt (`reads_prompt`,
        the shell executor) gets no system prompt ("")."""
        from kiro.executors import prompts

        overrides = prompts.Overrides(workspace)  # the workspace's prompt files, looked at once for both
        text = prompts.step_prompt(task, step, state, attempt=attempt, previous_error=previous_error,
                                   verify_output=verify_output, verify_command=verify_command,
                                   continuation=continuation, workspace=workspace, overrides=overrides,
                                   finish=self.finish_instruction(step, task_path or state.task_path, task=task,
                                                                  task_file=task_file))
        if not self.reads_prompt:
            return "", text
        return prompts.system_prompt(task, state, workspace, template_name=self.system_template,
                                     overrides=overrides), text

    async def aclose(self) -> None:
        return None
