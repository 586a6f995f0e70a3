"""The shell executor: runs the step's ```sh block with `bash -e` in the project directory.
Success is exit status 0 (SPEC §5)."""

from __future__ import annotations

import os

from kiro.errors import ExecutorError
from kiro.executors.base import ExecutorBase, StepContext, StepResult
from kiro.executors.kinds import PROMPTLESS
from kiro.processes.spawn import last_line, run_process, tail
from kiro.store.config import Config
from kiro.store.workspace import Workspace


def step_env(ctx: StepContext) -> dict[str, str]:
    """The environment a step's process sees: kiro's own plus what names the step."""
    env = dict(os.environ)
    env.update({
        "KIRO_TASK_ID": ctx.task_id,
        "KIRO_STEP_ID": ctx.step.id,
        "KIRO_TASK_FILE": str(ctx.task_path),
        "KIRO_ITERATION": str(ctx.iteration),
        "KIRO_ATTEMPT": str(ctx.attempt),
        "KIRO_WORKSPACE": str(ctx.workspace.root),
    })
    return env


class ShellExecutor(ExecutorBase):
    """Runs the step's own command; the prompts are recorded (`context.last_prompt`) but sent nowhere."""

    name = "shell"
    reads_prompt = name not in PROMPTLESS  # False: messages wait for an executor whose agent reads them

    def __init__(self, config: Config, workspace: Workspace) -> None:
        self.config = config
        self.workspace = workspace

    async def run_step(self, ctx: StepContext) -> StepResult:
        command = ctx.step.command
        if not command:  # no retry can fix this: the loop ends at once (exit 1), saying how to
            raise ExecutorError(f"step {ctx.step.id} has no ```sh block for the shell executor to run; add one "
                                f"under the step, or run this task with an agent (--agent claude, or "
                                f"--executor openai), then `kiro loop resume`")
        result = await run_process(["bash", "-e", "-c", command], cwd=ctx.project_dir, env=step_env(ctx),
                                   timeout=ctx.timeout_seconds, cancel=ctx.cancel)
        output = tail(result.output)
        if result.cancelled:
            return StepResult("interrupted", summary=output, error="stopped while the command ran")
        if result.timed_out:
            return StepResult("failed", summary=output,
                              error=f"timed out after {ctx.timeout_seconds:g} s; output:\n{output}")
        if result.returncode != 0:
            return StepResult("failed", summary=output,
                              error=f"exit status {result.returncode}: {last_line(output)}\n{output}")
        return StepResult("completed", summary=output or "(no output)")
