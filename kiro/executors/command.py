"""The command executor: an external agent CLI (`claude -p`, `codex exec`, `aider --message-file
{prompt_file}` ...). The iteration's prompt goes on stdin, or into a file whose path replaces
`{prompt_file}`. Success: exit 0 and the step's box checked by the agent, or exit 0 alone when
`command_success: exit_code` (SPEC §5)."""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

from kiro import tasks
from kiro.config import Config
from kiro.errors import ExecutorError, KiroError
from kiro.executors.base import StepContext, StepResult
from kiro.executors.process import last_line, run_process, tail
from kiro.executors.shell import step_env
from kiro.fsutil import atomic_write
from kiro.workspace import Workspace


class CommandExecutor:
    name = "command"

    def __init__(self, config: Config, workspace: Workspace, task_id: str) -> None:
        if not config.executor_command:
            raise ExecutorError(
                "the command executor needs `executor_command` (e.g. \"claude -p\") in config/autonomous_loop.yaml "
                "or KIRO_EXECUTOR_COMMAND"
            )
        try:
            self.argv = shlex.split(config.executor_command)
        except ValueError as exc:
            raise ExecutorError(f"executor_command {config.executor_command!r} cannot be split: {exc}") from None
        if not self.argv:
            raise ExecutorError("executor_command is empty")
        self.config = config
        self.workspace = workspace
        self.task_id = task_id
        self._check_program()

    def _check_program(self) -> None:
        """Fail before the loop starts (no iteration spent, no box marked in progress) when the agent
        program cannot be run: the same lookup exec does, PATH for a bare name, else a path relative
        to the project directory (the agent's cwd)."""
        prog = self.argv[0]
        if "{prompt_file}" in prog:
            return
        if "/" not in prog:
            if shutil.which(prog) is None:
                raise ExecutorError(f"executor_command program {prog!r} was not found on PATH")
            return
        path = Path(prog)
        if not path.is_absolute():
            path = self.workspace.root / self.config.project_dir / path
        if not path.is_file():
            raise ExecutorError(f"executor_command program {prog!r} does not exist ({path})")
        if not os.access(path, os.X_OK):
            raise ExecutorError(f"executor_command program {prog!r} is not executable ({path})")

    async def run_step(self, ctx: StepContext) -> StepResult:
        text = ctx.redact.text(f"{ctx.system_prompt}\n\n{ctx.prompt}")
        prompt_file = self.workspace.state_dir / "prompts" / f"{self.task_id}.md"
        uses_file = any("{prompt_file}" in a for a in self.argv)
        argv = [a.replace("{prompt_file}", str(prompt_file)) for a in self.argv]
        env = step_env(ctx)
        if uses_file:
            atomic_write(prompt_file, text, fsync=False)
            env["KIRO_PROMPT_FILE"] = str(prompt_file)
        try:
            result = await run_process(argv, cwd=ctx.project_dir, env=env,
                                       stdin_data=None if uses_file else text.encode("utf-8"),
                                       timeout=ctx.timeout_seconds, cancel=ctx.cancel)
        except FileNotFoundError:
            if not ctx.project_dir.is_dir():
                where = str(ctx.project_dir)
                raise ExecutorError(f"project directory {where!r} (project_dir) does not exist") from None
            raise ExecutorError(f"executor_command program {self.argv[0]!r} was not found on PATH") from None
        except PermissionError:
            raise ExecutorError(f"executor_command program {self.argv[0]!r} is not executable") from None
        output = tail(result.output)
        if result.cancelled:
            return StepResult("interrupted", summary=output, error="stopped while the agent ran")
        if result.timed_out:
            return StepResult("failed", summary=output,
                              error=f"agent timed out after {ctx.timeout_seconds:g} s (process group ended)"
                                    f"{self._take_back_box(ctx)}; output:\n{output}")
        if result.returncode != 0:
            note = self._take_back_box(ctx)
            return StepResult("failed", summary=output,
                              error=f"agent exited {result.returncode}: {last_line(output)}{note}\n{output}")
        if self.config.command_success == "exit_code":
            return StepResult("completed", summary=output or "(no output)")
        try:
            after = tasks.load(ctx.task_path)
        except KiroError as exc:
            return StepResult("failed", summary=output, error=f"agent exited 0 but the task file is unreadable: {exc}")
        step = after.find(ctx.step.key)
        if step is None:  # the agent may have retouched the line's text: fall back to the id
            step = next((s for s in after.steps if s.id == ctx.step.id), None)
        if step is not None and step.done:
            return StepResult("completed", summary=output or "(no output)", checked_by_executor=True)
        return StepResult(
            "failed", summary=output,
            error=(f"agent exited 0 but step {ctx.step.id}'s box in {self.workspace.relative(ctx.task_path)} is not "
                   f"checked; the agent must check it (or set command_success: exit_code). Output:\n{output}"),
        )

    def _take_back_box(self, ctx: StepContext) -> str:
        """An agent that checked its box and then failed (non-zero exit, timeout) has not done the step:
        put the box back to `[-]`, or the next iteration would take the step as done. Returns a note
        for the error message."""
        try:
            now = tasks.load(ctx.task_path)
            step = now.find(ctx.step.key) or next((s for s in now.steps if s.id == ctx.step.id), None)
            if step is None or not step.done:
                return ""
            tasks.set_marker(ctx.task_path, step.key, "-", expected=now)
        except KiroError:
            return ""
        return f" (it had checked step {ctx.step.id}'s box; kiro unchecked it)"

    async def aclose(self) -> None:
        return None
