"""The command executor: an external agent CLI (`claude -p`, `codex exec`, `aider --message-file
{prompt_file}` ...). The iteration's prompt goes on stdin, or into a file whose path replaces
`{prompt_file}`. Success: exit 0 and the step's box checked by the agent, or exit 0 alone when
`command_success: exit_code` (SPEC §5).

The command line comes from an agent preset (`agent:`, kiro.executors.agents) or from
`executor_command`. Around each attempt: the full output goes to `Logs/<task_id>/<step_id>-<attempt>.log`
(bounded, redacted); tokens and cost read from the CLI's output go into `usage`; the CLI's own error
line names the failure, and a usage or auth error ends the run (exit 1) instead of being retried;
`step_idle_timeout_seconds` ends a silent process; kiro's control files and the task file's other
lines are put back if the agent changed them (kiro.executors.control).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from kiro.errors import ExecutorError, KiroError
from kiro.executors import agents, prompts
from kiro.executors.agents import Failure, Invocation, clean
from kiro.executors.base import ExecutorBase, StepContext, StepResult, Usage
from kiro.executors.control import UNCHECKED_NAMED, ControlSnapshot
from kiro.executors.shell import step_box, step_env
from kiro.fs.atomic import atomic_write
from kiro.processes.sandbox import Box
from kiro.processes.spawn import ProcessResult, run_process
from kiro.store import tasks
from kiro.store.config import Config
from kiro.store.workspace import Workspace

LOG_KEPT = 256_000  # bytes of each stream kept for the attempt log (the tail)
LOG_NAME_CHARS = 80  # of a step's id in its attempt log's name

if TYPE_CHECKING:
    from kiro.store.tasks import Step, TaskFile


class CommandExecutor(ExecutorBase):
    name = "command"
    system_template = "agent_cli.md"  # speaks of checkboxes, not tools
    checks_boxes = True  # the agent checks the step's box; a failed attempt's box is put back

    def __init__(self, config: Config, workspace: Workspace, task_id: str) -> None:
        self.preset, self.argv = agents.resolve(config)
        self.config = config
        self.workspace = workspace
        self.task_id = task_id
        idle = config.step_idle_timeout_seconds
        if idle is None and config.agent:
            idle = self.preset.idle_timeout_seconds
        self.idle_timeout = idle
        self._check_program()

    def _check_program(self) -> None:
        """Fail before the loop starts (no iteration spent, no box marked in progress) when the agent
        program cannot be run: the same lookup exec does, PATH for a bare name, else a path relative
        to the project directory (the agent's cwd)."""
        prog = self.argv[0]
        if any(p in prog for p in agents.PLACEHOLDERS):
            return
        hint = f"; install it with `{self.preset.install}`" if self.preset.install else ""
        if "/" not in prog:
            if shutil.which(prog) is None:
                raise ExecutorError(f"agent program {prog!r} was not found on PATH{hint}")
            return
        path = Path(prog)
        if not path.is_absolute():
            path = self.workspace.root / self.config.project_dir / path
        if not path.is_file():
            raise ExecutorError(f"executor_command program {prog!r} does not exist ({path})")
        if not os.access(path, os.X_OK):
            raise ExecutorError(f"executor_command program {prog!r} is not executable ({path})")

    def log_path(self, ctx: StepContext) -> Path:
        """`Logs/<task_id>/<step_id>-<attempt>.log`. The id of a step with no number is its text: it is
        named as the redactor leaves it (a secret in it is no file name), and a long one is cut, with a
        hash of the whole to keep names apart (a file name has at most 255 bytes)."""
        shown = ctx.redact.text(ctx.step.id)
        safe = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in shown) or "step"
        if len(safe) > LOG_NAME_CHARS:
            safe = f"{safe[:LOG_NAME_CHARS]}_{hashlib.sha256(shown.encode()).hexdigest()[:12]}"
        return self.workspace.logs / self.task_id / f"{safe}-{ctx.attempt}.log"

    async def run_step(self, ctx: StepContext) -> StepResult:
        text = ctx.redact.text(f"{ctx.system_prompt}\n\n{ctx.prompt}")
        prompt_file = self.workspace.state_dir / "prompts" / f"{self.task_id}.md"
        inv = Invocation(prompt_file=prompt_file, task_file=ctx.task_path, step_id=ctx.step.id,
                         project_dir=ctx.project_dir)
        uses_file = any("{prompt_file}" in a for a in self.argv)
        argv = self.preset.argv(inv, self.argv)
        env = step_env(ctx)
        env.update(self.preset.env(inv))
        box = step_box(ctx, env, self.preset.home_paths(env), read_paths=self.preset.read_paths(env))
        if box is not None:
            argv = self.preset.boxed_argv(argv)
            env.update(self.preset.boxed_env(env, ctx.project_dir))
        if uses_file:
            atomic_write(prompt_file, text, fsync=False)
            env["KIRO_PROMPT_FILE"] = str(prompt_file)
        snapshot = ControlSnapshot.take(self.workspace, self.task_id, ctx.task_path)
        watch = self.preset.watch()
        started = time.monotonic()
        try:
            result = await run_process(argv, cwd=ctx.project_dir, env=env,
                                       stdin_data=None if uses_file else text.encode("utf-8"),
                                       timeout=ctx.timeout_seconds, cancel=ctx.cancel, output_limit=LOG_KEPT,
                                       separate_stderr=True, idle_timeout=self.idle_timeout, on_stdout=watch,
                                       box=box)
        except FileNotFoundError:
            if not ctx.project_dir.is_dir():
                where = str(ctx.project_dir)
                raise ExecutorError(f"project directory {where!r} (project_dir) does not exist") from None
            raise ExecutorError(f"agent program {self.argv[0]!r} was not found on PATH") from None
        except PermissionError:
            raise ExecutorError(f"agent program {self.argv[0]!r} is not executable") from None
        touched = snapshot.restore(ctx.step.line, ctx.step.box_offset)
        usage = self.preset.parse_usage(result.output) or Usage()
        if usage.total_tokens or usage.cost_usd:
            ctx.guard.after_model_call(usage)  # into the token window that token_budget_per_hour reads
        failure = watch.failure if result.aborted else None
        if not (result.cancelled or result.timed_out or result.idle_timed_out or result.aborted):
            failure = self.preset.classify_failure(result.returncode, result.output, result.stderr)
        log = self._write_log(ctx, argv, result, failure, touched, snapshot.unchecked, time.monotonic() - started,
                              box)
        summary = ctx.redact.text(self.preset.summary(result.output, result.stderr, text))
        outcome = self._outcome(ctx, result, failure, touched, summary, log)
        outcome.usage = usage
        if outcome.outcome == "failed":
            outcome.error = ctx.redact.text(outcome.error or "")
        if failure is not None and failure.fatal and not touched:
            raise ExecutorError(f"{self.preset.program or argv[0]} failed ({failure.kind.replace('_', ' ')}): "
                                f"{ctx.redact.text(failure.line)} — {self.preset.fix(failure)} (full output in "
                                f"{self.workspace.relative(log)})")
        return outcome

    def _outcome(self, ctx: StepContext, result: ProcessResult, failure: Failure | None, touched: list[str],
                 summary: str, log: Path) -> StepResult:
        where = f" (full output: {self.workspace.relative(log)})"
        if result.cancelled:
            return StepResult("interrupted", summary=summary, error="stopped while the agent ran")
        if touched:
            note = self._take_back_box(ctx)
            return StepResult("failed", summary=summary,
                              error=(f"the agent changed kiro's files, which it must not touch; kiro put them back: "
                                     f"{'; '.join(touched)}{note}{where}"))
        if result.idle_timed_out:
            return StepResult("failed", summary=summary,
                              error=(f"agent printed nothing for {self.idle_timeout:g} s "
                                     f"(step_idle_timeout_seconds; a dead endpoint?), so kiro ended it"
                                     f"{self._take_back_box(ctx)}{where}\n{summary}"))
        if result.timed_out:
            return StepResult("failed", summary=summary,
                              error=f"agent timed out after {ctx.timeout_seconds:g} s (process group ended)"
                                    f"{self._take_back_box(ctx)}{where}\n{summary}")
        if failure is not None:
            note = self._take_back_box(ctx)
            kind = {"rate_limit": "rate limited", "failure": "failed"}.get(failure.kind, failure.kind)
            return StepResult("failed", summary=summary,
                              error=f"agent {kind} (exit {result.returncode}): {failure.line}{note}{where}\n{summary}")
        if self.config.command_success == "exit_code":
            return StepResult("completed", summary=summary or "(no output)")
        try:
            after = tasks.load(ctx.task_path)
        except KiroError as exc:
            return StepResult("failed", summary=summary, error=f"agent exited 0 but the task file is unreadable: {exc}")
        step = after.find(ctx.step.key)
        if step is None:  # the agent may have retouched the line's text: fall back to the id
            step = next((s for s in after.steps if s.id == ctx.step.id), None)
        if step is not None and step.done:
            return StepResult("completed", summary=summary or "(no output)", checked_by_executor=True)
        return StepResult(
            "failed", summary=summary,
            error=(f"agent exited 0 but step {ctx.step.id}'s box in {self.workspace.relative(ctx.task_path)} is not "
                   f"checked; the agent must check it (or set command_success: exit_code){where}. "
                   f"It said:\n{summary}"),
        )

    def _write_log(self, ctx: StepContext, argv: list[str], result: ProcessResult, failure: Failure | None,
                   touched: list[str], unchecked: list[str], seconds: float, box: Box | None = None) -> Path:
        path = self.log_path(ctx)
        how = ("cancelled" if result.cancelled else "idle timeout" if result.idle_timed_out
               else "timed out" if result.timed_out else f"exit {result.returncode}")
        lines = [
            f"# {self.task_id} step {ctx.step.id} attempt {ctx.attempt} (iteration {ctx.iteration})",
            f"# agent: {self.preset.name}",
            f"# command: {' '.join(argv)}",
            f"# cwd: {ctx.project_dir}",
            f"# sandbox: bwrap ({box.describe()})" if box is not None else "# sandbox: off",
            f"# result: {how} after {seconds:.3f} s",
        ]
        if failure is not None:
            lines.append(f"# failure: {failure.kind}: {failure.line}")
        lines += [f"# touched: {t}" for t in touched]
        if unchecked:  # a warning only: other loops write these while the agent runs (kiro.executors.control)
            named = ", ".join(unchecked[:UNCHECKED_NAMED]) + (", ..." if len(unchecked) > UNCHECKED_NAMED else "")
            lines.append(f"# unchecked: {len(unchecked)} of kiro's files of other loops (or shared) changed during the "
                         f"attempt; without a sandbox kiro cannot tell their writes from the agent's, so it left "
                         f"them as they are: {named}")
        body = "\n".join(lines) + "\n\n## stdout\n" + result.output + "\n\n## stderr\n" + result.stderr + "\n"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, ctx.redact.text(clean_log(body)), fsync=False)
        return path

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

    def finish_instruction(self, step: Step, task_path: str, *, task: TaskFile | None = None,
                           task_file: Path | None = None) -> str:
        """Check the box (the exact line, in the task file's full path) and exit 0, or exit 0 alone
        with `command_success: exit_code`."""
        return prompts.finish_instruction("command", step, task_path, self.config.command_success, task=task,
                                          task_file=task_file)


def clean_log(text: str) -> str:
    """The log keeps everything the agent printed, minus terminal escapes."""
    return clean(text)


