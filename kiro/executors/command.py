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

import asyncio
import contextlib
import dataclasses
import hashlib
import os
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from kiro import timeutil
from kiro.errors import ExecutorError, KiroError
from kiro.executors import agents, prompts
from kiro.executors.agents import Failure, Invocation, clean
from kiro.executors.base import ExecutorBase, StepContext, StepResult, Usage
from kiro.executors.control import UNCHECKED_NAMED, ControlSnapshot, StepCopy, Verdict, copy_path
from kiro.executors.shell import step_box, step_env
from kiro.fs.atomic import atomic_write
from kiro.processes.sandbox import Box
from kiro.processes.spawn import ProcessResult, run_process
from kiro.store import tasks
from kiro.store.config import Config
from kiro.store.events import AgentRan, AgentSilent, LoopWarning, ToolCalled, UsageLimit
from kiro.store.workspace import Workspace

LOG_KEPT = 256_000  # bytes of each stream kept for the attempt log (the tail)
LOG_NAME_CHARS = 80  # of a step's id in its attempt log's name

if TYPE_CHECKING:
    from kiro.store.tasks import Step, TaskFile


PROBE_FIRST_SECONDS = 300.0  # a usage limit without a reset time: try again after 5 min,
PROBE_MAX_SECONDS = 3600.0  # doubling each time it is still limited, to at most 1 h
RESET_MARGIN_SECONDS = 5.0  # after the reset a CLI gave (doubled each time it is limited again right away)


SILENCE_SAID_SECONDS = 60.0
"""An agent CLI silent this long (or a quarter of its idle timeout, if less) is said to be (`agent_silent`), and
again as long as it stays silent: a CLI retrying a dead endpoint says nothing for minutes."""

class _Agent:
    """One agent CLI the executor may hand a step to, and its usage-limit window."""

    def __init__(self, preset: agents.Preset, argv: list[str], idle_timeout: float | None,
                 billing: agents.Billing) -> None:
        self.preset, self.argv, self.idle_timeout = preset, argv, idle_timeout
        self.billing = billing  # the credential it bills, and the variables kept from it (agent_env)
        self.until = 0.0  # time.time() before which it is limited
        self.since = 0.0  # when the current run of limits began
        self.given = False  # `until` is the reset the CLI gave (not a probe)
        self.hits = 0  # limits in a row
        self.failure: Failure | None = None

    def ready(self) -> bool:
        return time.time() >= self.until

    def ran(self) -> None:
        """It answered (done or failed, not limited): its window is open."""
        self.until = self.since = 0.0
        self.hits = 0
        self.failure = None

    def limited(self, failure: Failure) -> None:
        now = time.time()
        self.since = self.since or now
        self.hits += 1
        self.failure = failure
        self.given = failure.resets_at is not None
        if failure.resets_at is not None:
            margin = min(RESET_MARGIN_SECONDS * 2 ** (self.hits - 1), PROBE_MAX_SECONDS)
            self.until = max(failure.resets_at.timestamp(), now) + margin
        else:
            self.until = now + min(PROBE_FIRST_SECONDS * 2 ** (self.hits - 1), PROBE_MAX_SECONDS)


class CommandExecutor(ExecutorBase):
    name = "command"
    system_template = "agent_cli.md"  # speaks of checkboxes, not tools
    checks_boxes = False  # the agent checks the step's box in its own copy (StepCopy): the task file is never its
    # a reviewer's (kiro.core.review): its box has the project read-only, its runs are logged as
    # `<step_id>-review-<round>.log` and are `agent_ran` events marked `review`
    reviewer = False

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
        # which credential the CLI bills, and the variables kept from it (agent_env): said at start
        self.billing = agents.billing(self.preset, config)
        # the configured agent first, then its fallbacks (their presets' own command lines, no agent_args)
        self.agents = [_Agent(self.preset, self.argv, idle, self.billing)]
        own = config.model_copy(update={"agent_args": [], "acp_command": None})  # the configured agent's
        for name in config.fallback_agents:
            preset = agents.get(name, own)
            idle = config.step_idle_timeout_seconds or preset.idle_timeout_seconds
            fallback = _Agent(preset, preset.template(), idle, agents.billing(preset, config))
            if shutil.which(fallback.argv[0]) is None:
                raise ExecutorError(f"fallback agent {name!r}: program {fallback.argv[0]!r} was not found on PATH; "
                                    f"install it with `{preset.install}` or remove it from fallback_agents")
            self.agents.append(fallback)
        cap = config.guardrails.max_cost_usd
        for agent in self.agents if cap is not None else []:  # a cost cap that could never fire is refused
            why = agent.preset.unpriced()
            if why is not None:
                raise ExecutorError(f"max_cost_usd {cap:g} cannot hold: {why}; or remove max_cost_usd "
                                    f"(max_total_tokens caps tokens)")

    def billing_line(self) -> str | None:
        """The start line's account of the credential, for a preset kiro knows (or variables it drops)."""
        if isinstance(self.preset, agents.CommandLine) and not self.billing.dropped:
            return None
        return f"agent {self.billing.line()}"

    def credential(self) -> str | None:
        return f"{self.billing.agent} {self.billing.credential.said()}"

    def _check_program(self) -> None:
        """Fail before the loop starts (no iteration spent, no box marked in progress) when the agent
        program cannot be run: the same lookup exec does, PATH for a bare name, else a path relative
        to the project directory (the agent's cwd)."""
        prog = self.argv[0]
        if any(p in prog for p in agents.PLACEHOLDERS):
            return
        hint = f"; install it with `{self.preset.install}`" if self.preset.install and self.preset.program else ""
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

    def log_path(self, ctx: StepContext, run: int = 1) -> Path:
        """`Logs/<task_id>/<step_id>-<attempt>.log` (`...-<attempt>.<run>.log` for the runs after a usage
        limit within the attempt). The id of a step with no number is its text: it is named as the
        redactor leaves it (a secret in it is no file name), and a long one is cut, with a hash of the
        whole to keep names apart (a file name has at most 255 bytes). A log already there is never
        replaced (a resumed loop numbers a step's attempts again): the next free `.<n>` is taken."""
        shown = ctx.redact.text(ctx.step.id)
        safe = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in shown) or "step"
        if len(safe) > LOG_NAME_CHARS:
            safe = f"{safe[:LOG_NAME_CHARS]}_{hashlib.sha256(shown.encode()).hexdigest()[:12]}"
        folder, name = self.workspace.logs / self.task_id, f"{safe}-{'review-' if self.reviewer else ''}{ctx.attempt}"
        path = folder / (f"{name}.log" if run == 1 else f"{name}.{run}.log")
        while path.exists():
            run += 1
            path = folder / f"{name}.{run}.log"
        return path

    async def run_step(self, ctx: StepContext) -> StepResult:
        """One attempt: the first configured agent that is not at its usage limit runs the step. A usage
        limit is no failure: the agent is set aside until its reset and the same attempt goes to the
        next agent (`fallback_agents`), or, when every agent is limited, the loop sleeps (status
        `sleeping`, a stop hook ends it) until the earliest reset and runs the attempt again."""
        run = 0
        while True:
            agent = next((a for a in self.agents if a.ready()), None)
            if agent is None:
                reason = await self._wait_for_reset(ctx)
                if reason is not None:
                    return StepResult("interrupted", error="stopped while waiting for a usage limit to reset",
                                      stop_reason=reason)
                first = min(self.agents, key=lambda a: a.until)
                if first.until - time.time() > 1.0:  # the wait ended early: the loop's run-time limit came first
                    return StepResult("failed", error=f"the loop's run time ran out while waiting for "
                                                      f"{first.preset.name}'s usage limit to reset")
                continue
            run += 1
            outcome, failure = await self._run(ctx, agent, run)
            outcome.agent = agent.preset.name
            if failure is None or failure.kind != "usage_limit":
                agent.ran()
                return outcome
            agent.limited(failure)
            nxt = next((a for a in self.agents if a.ready()), None)
            ctx.emit(UsageLimit(agent=agent.preset.name, step_id=ctx.step.id, attempt=ctx.attempt,
                                resets_at=timeutil.iso(failure.resets_at) if failure.resets_at else None,
                                message=ctx.redact.text(failure.line),
                                fallback=nxt.preset.name if nxt is not None else None))

    async def _wait_for_reset(self, ctx: StepContext) -> str | None:
        """Every agent is limited: sleep until the first one's window resets (the guard's wait, as for a
        long Retry-After), or end the loop (exit 4) when that is beyond `max_limit_wait_seconds`."""
        first = min(self.agents, key=lambda a: a.until)
        name = first.preset.name
        seconds = max(first.until - time.time(), 0.0)
        cap = self.config.max_limit_wait_seconds
        waited = time.time() - first.since
        when = datetime.fromtimestamp(first.until, UTC)
        said = f"{name} says: {first.failure.line}" if first.failure is not None else f"{name} is limited"
        if waited + seconds > cap:
            return ctx.guard.stop("max_limit_wait_seconds", cap, round(waited + seconds),
                                  f"{said}; waiting for it until {when:%Y-%m-%d %H:%M} UTC would exceed "
                                  f"max_limit_wait_seconds {cap:g}")
        how = "the reset it gave" if first.given else "the next probe (it gave no reset time)"
        message = f"{said}; sleeping {seconds:.0f} s until {how}, {when:%H:%M:%S} UTC"
        return await ctx.guard.wait("usage_limit", seconds, ctx.redact.text(message), figure=name,
                                    note=f"{name} limit, resumes {when:%H:%M} UTC")

    async def _run(self, ctx: StepContext, agent: _Agent, run: int) -> tuple[StepResult, Failure | None]:
        """One run of one agent CLI: the attempt's outcome and the failure the CLI reported, if any. The
        agent works on its own copy of the task file (kiro.executors.control.StepCopy)."""
        copy = StepCopy.make(self.workspace, self.task_id, ctx.step.id, ctx.task_path)
        try:
            return await self._run_on(ctx, agent, run, copy)
        finally:
            copy.drop()

    async def _run_on(self, ctx: StepContext, agent: _Agent, run: int,
                      copy: StepCopy) -> tuple[StepResult, Failure | None]:
        preset, template = agent.preset, agent.argv
        text = ctx.redact.text(f"{ctx.system_prompt}\n\n{ctx.prompt}")
        prompt_file = self.workspace.state_dir / "prompts" / f"{self.task_id}.md"
        inv = Invocation(prompt_file=prompt_file, task_file=copy.path, step_id=ctx.step.id,
                         project_dir=ctx.project_dir)
        uses_file = any("{prompt_file}" in a for a in template)
        argv = preset.argv(inv, template)
        env = agent.billing.apply(step_env(ctx, whole=True))  # what the CLI needs (agents.billing)
        env["KIRO_TASK_FILE"] = str(copy.path)  # the file it checks its box in
        env.update(preset.env(inv))
        for name in preset.env_unset:
            env.pop(name, None)
        box = step_box(ctx, env, preset.home_paths(env), read_paths=preset.read_paths(env),
                       ports=preset.endpoints(env), task_copy=copy.path, read_only=self.reviewer)
        if box is not None:
            argv = preset.boxed_argv(argv)
            env.update(preset.boxed_env(env, ctx.project_dir))
        if uses_file:
            atomic_write(prompt_file, text, fsync=False)
            env["KIRO_PROMPT_FILE"] = str(prompt_file)
        snapshot = ControlSnapshot.take(self.workspace, self.task_id, ctx.task_path)

        real = ctx.task_path.resolve()
        shown_copy = {str(copy.path): str(real), os.path.relpath(copy.path, ctx.project_dir):
                      os.path.relpath(real, ctx.project_dir)}

        def on_tool(call: agents.ToolCall) -> None:
            tool, argument = agents.shown_call(call, ctx.project_dir)
            for path, shown in shown_copy.items():  # its copy of the task file, named as the person knows it
                argument = argument.replace(path, shown)
            ctx.emit(ToolCalled(tool=tool, arguments=argument))

        watch = preset.watch(on_tool=on_tool)
        started = time.monotonic()
        heard = [started]  # when it last printed (a quarter of the idle timeout without a word is said)

        def on_stdout(data: bytes) -> bool:
            heard[0] = time.monotonic()
            return watch(data)

        async def say_silence(idle: float) -> None:
            every = min(SILENCE_SAID_SECONDS, idle / 4)
            while True:
                quiet = time.monotonic() - heard[0]
                if quiet >= every:
                    ctx.emit(AgentSilent(step_id=ctx.step.id, agent=preset.name, seconds=round(quiet, 1),
                                         idle_timeout=idle))
                    await asyncio.sleep(every)
                else:
                    await asyncio.sleep(every - quiet)

        silence = None
        try:
            if preset.speaks_acp:  # a session over the Agent Client Protocol: its transcript is the output
                from kiro.executors import acp

                # the agent's fs/write_text_file of the task file writes its copy
                on_copy = dataclasses.replace(ctx, task_path=copy.path)
                result = await acp.run_turn(argv, ctx=on_copy, env=env, box=box, prompt=text,
                                            idle_timeout=agent.idle_timeout, output_limit=LOG_KEPT,
                                            empty_when_missing=preset.empty_when_missing,
                                            auth_method=preset.acp_auth(env), exits_on_eof=preset.exits_on_eof,
                                            modes=preset.acp_modes(box is not None))
            else:
                if agent.idle_timeout:
                    silence = asyncio.ensure_future(say_silence(agent.idle_timeout))
                result = await run_process(argv, cwd=ctx.project_dir, env=env,
                                           stdin_data=None if uses_file else text.encode("utf-8"),
                                           timeout=ctx.timeout_seconds, cancel=ctx.cancel, output_limit=LOG_KEPT,
                                           separate_stderr=True, idle_timeout=agent.idle_timeout,
                                           on_stdout=on_stdout, box=box)
        except FileNotFoundError:
            if not ctx.project_dir.is_dir():
                where = str(ctx.project_dir)
                raise ExecutorError(f"project directory {where!r} (project_dir) does not exist") from None
            raise ExecutorError(f"agent program {template[0]!r} was not found on PATH") from None
        except PermissionError:
            raise ExecutorError(f"agent program {template[0]!r} is not executable") from None
        finally:
            if silence is not None:
                silence.cancel()
        touched = snapshot.restore()
        verdict = copy.verdict(ctx.step.line, ctx.step.box_offset)
        touched += verdict.touched
        self._propose(ctx, verdict)
        usage = preset.parse_usage(result.output) or Usage()
        if usage.total_tokens or usage.cost_usd:
            ctx.guard.after_model_call(usage)  # into the token window that token_budget_per_hour reads
        failure = watch.failure if result.aborted else None
        if not (result.cancelled or result.timed_out or result.idle_timed_out or result.aborted):
            failure = preset.classify_failure(result.returncode, result.output, result.stderr)
            if failure is not None and not failure.fatal and not touched:
                failure = preset.usage_limit(result.output, result.stderr) or failure
        seconds = time.monotonic() - started
        log = self._write_log(ctx, agent, argv, result, failure, touched, snapshot.unchecked, seconds, run, box)
        summary = ctx.redact.text(preset.summary(result.output, result.stderr, text))
        outcome = self._outcome(ctx, agent, result, failure, touched, summary, log, verdict)
        outcome.usage = usage
        outcome.log = self.workspace.relative(log)
        if outcome.outcome == "failed":
            outcome.error = ctx.redact.text(outcome.error or "")
        limited = failure is not None and failure.kind == "usage_limit"
        ctx.emit(AgentRan(step_id=ctx.step.id, attempt=ctx.attempt, agent=preset.name,
                          outcome="usage_limit" if limited else outcome.outcome, prompt_tokens=usage.prompt_tokens,
                          completion_tokens=usage.completion_tokens, cost_usd=usage.cost_usd,
                          seconds=round(seconds, 3), **({"review": True} if self.reviewer else {})))
        if failure is not None and failure.fatal and not touched:
            raise ExecutorError(f"{preset.program or argv[0]} failed ({failure.kind.replace('_', ' ')}): "
                                f"{ctx.redact.text(failure.line)} — {preset.fix(failure)} (full output in "
                                f"{self.workspace.relative(log)})")
        return outcome, failure

    def _outcome(self, ctx: StepContext, agent: _Agent, result: ProcessResult, failure: Failure | None,
                 touched: list[str], summary: str, log: Path, verdict: Verdict) -> StepResult:
        where = f" (full output: {self.workspace.relative(log)})"
        if result.cancelled:
            return StepResult("interrupted", summary=summary, error="stopped while the agent ran")
        if touched:
            return StepResult("failed", summary=summary,
                              error=(f"the agent changed kiro's files, which it must not touch; kiro put them back: "
                                     f"{'; '.join(touched)}{where}"))
        if result.idle_timed_out:
            return StepResult("failed", summary=summary,
                              error=(f"agent printed nothing for {agent.idle_timeout:g} s "
                                     f"(step_idle_timeout_seconds; a dead endpoint?), so kiro ended it"
                                     f"{where}\n{summary}"))
        if result.timed_out:
            return StepResult("failed", summary=summary,
                              error=f"agent timed out after {ctx.timeout_seconds:g} s (process group ended)"
                                    f"{where}\n{summary}")
        if failure is not None:
            kind = {"rate_limit": "rate limited", "usage_limit": "at its usage limit",
                    "failure": "failed"}.get(failure.kind, failure.kind)
            return StepResult("failed", summary=summary,
                              error=f"agent {kind} (exit {result.returncode}): {failure.line}{where}\n{summary}")
        if self.config.command_success == "exit_code":
            return StepResult("completed", summary=summary or "(no output)")
        if verdict.checked:
            return StepResult("completed", summary=summary or "(no output)", checked_by_executor=True)
        said = self.preset.reported_error(result.output, result.stderr)
        said = f"; {self.preset.program or 'the agent'} reported: {ctx.redact.text(said)}" if said else ""
        return StepResult(
            "failed", summary=summary,
            error=(f"agent exited 0 but step {ctx.step.id}'s box in {self.workspace.relative(ctx.task_path)} is not "
                   f"checked; the agent must check it (or set command_success: exit_code){said}{where}. "
                   f"It said:\n{summary}"),
        )

    def _write_log(self, ctx: StepContext, agent: _Agent, argv: list[str], result: ProcessResult,
                   failure: Failure | None, touched: list[str], unchecked: list[str], seconds: float,
                   run: int = 1, box: Box | None = None) -> Path:
        path = self.log_path(ctx, run)
        how = ("cancelled" if result.cancelled else "idle timeout" if result.idle_timed_out
               else "timed out" if result.timed_out else f"exit {result.returncode}")
        lines = [
            f"# {self.task_id} step {ctx.step.id} attempt {ctx.attempt} (iteration {ctx.iteration})",
            f"# agent: {agent.preset.name}",
            f"# command: {' '.join(argv)}",
            f"# cwd: {ctx.project_dir}",
            f"# credential: {agent.billing.line()}",
            f"# sandbox: bwrap ({box.describe()})" if box is not None else "# sandbox: off",
            f"# result: {how} after {seconds:.3f} s",
        ]
        if failure is not None:
            lines.append(f"# failure: {failure.kind}: {failure.line}"
                         + (f" (resets {timeutil.iso(failure.resets_at)})" if failure.resets_at else ""))
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

    def finish_instruction(self, step: Step, task_path: str, *, task: TaskFile | None = None,
                           task_file: Path | None = None) -> str:
        """Check the box (the exact line, in the task file's full path) and exit 0, or exit 0 alone
        with `command_success: exit_code`."""
        copy = copy_path(self.workspace, self.task_id, step.id, task_file) if task_file is not None else None
        return prompts.finish_instruction("command", step, task_path, self.config.command_success, task=task,
                                          task_file=copy)

    def _propose(self, ctx: StepContext, verdict: Verdict) -> None:
        """The `- [ ]` steps the agent added to its copy: a proposal for a person (`Pending_Approval/`), or
        into the task file at once with `approval.agent_steps: false`."""
        from kiro.store import approval

        for after, titles in verdict.added:
            if self.config.approval.agent_steps:
                path = approval.propose(self.workspace, self.task_id, self.workspace.relative(ctx.task_path), titles,
                                        after, "added to the task file by the agent while it ran step "
                                               f"{ctx.step.id}")
                ctx.emit(LoopWarning(message=f"the agent added {len(titles)} step(s) to the task file; they wait "
                                             f"for your approval in {self.workspace.relative(path)}"))
            else:
                with contextlib.suppress(KiroError):
                    tasks.add_steps(ctx.task_path, titles, after=after)


def clean_log(text: str) -> str:
    """The log keeps everything the agent printed, minus terminal escapes."""
    return clean(text)


