"""The shell executor: runs the step's ```sh block with `bash -e` in the project directory.
Success is exit status 0 (SPEC §5)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from kiro.errors import ExecutorError
from kiro.executors.base import ExecutorBase, StepContext, StepResult
from kiro.executors.kinds import PROMPTLESS
from kiro.processes import sandbox
from kiro.processes.spawn import last_line, run_process, shell_argv, tail
from kiro.store.config import Config
from kiro.store.redact import env_key, looks_like_token, looks_secret
from kiro.store.statestore import SERVE_TOKEN_ENV
from kiro.store.workspace import Workspace

# kiro's environment without its secrets, for one `agent_env.pass`: the last one worked out (every step of a
# loop, and the loops of one config, share it; a changed environment is worked out again)
_clean_seen: list[tuple[tuple[Any, frozenset[str]], dict[str, str]]] = []


def _without_secrets(passed: frozenset[str]) -> dict[str, str]:
    """A copy of kiro's environment without kiro serve's token and the variables named or shaped like a
    secret, but those in `passed`: scanned once per environment, not once per step (issue #41)."""
    key = (env_key(os.environ), passed)
    if not _clean_seen or _clean_seen[0][0] != key:
        clean = {name: value for name, value in os.environ.items() if name != SERVE_TOKEN_ENV and (
            name in passed or not (looks_secret(name) or looks_like_token(value)))}
        _clean_seen[:] = [(key, clean)]
    return dict(_clean_seen[0][1])


def step_env(ctx: StepContext, *, whole: bool = False) -> dict[str, str]:
    """The environment a step's process sees: kiro's own plus what names the step. A shell step, verify
    and run_command get kiro's environment without the secrets in it (a variable named or shaped like
    one: AWS_SECRET_ACCESS_KEY, GITHUB_TOKEN, a `ghp_...` value), but those `agent_env.pass` names: a
    step's command may have been written by an agent, and whatever it prints reaches the next one.
    `whole`: all of it, for an agent CLI, whose preset then keeps only what it needs (agents.billing).
    kiro serve's token is never in it; with `protected_paths`, Python writes no bytecode (`no_bytecode`)."""
    if whole:
        env = {name: value for name, value in os.environ.items() if name != SERVE_TOKEN_ENV}
    else:
        env = _without_secrets(frozenset(ctx.config.agent_env.pass_))
    no_bytecode(ctx.config, env)
    env.update({
        "KIRO_TASK_ID": ctx.task_id,
        "KIRO_STEP_ID": ctx.step.id,
        "KIRO_TASK_FILE": str(ctx.task_path),
        "KIRO_ITERATION": str(ctx.iteration),
        "KIRO_ATTEMPT": str(ctx.attempt),
        "KIRO_WORKSPACE": str(ctx.workspace.root),
    })
    return env


def no_bytecode(cfg: Config, env: dict[str, str]) -> dict[str, str]:
    """With `protected_paths`, Python writes no bytecode in a step's processes (PYTHONDONTWRITEBYTECODE=1) and
    keeps none elsewhere (no PYTHONPYCACHEPREFIX): pytest run as verify, or by an agent, would otherwise write
    `tests/__pycache__/*.pyc`, a protected file the step created (kiro.store.receipts.bytecode), and bytecode
    kept outside the project is bytecode kiro does not check. Returns `env`, changed."""
    if cfg.protected_paths:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPYCACHEPREFIX", None)
    return env


def step_box(ctx: StepContext, env: Mapping[str, str], home_paths: Iterable[Path] = (),
             project: Path | None = None, read_paths: Iterable[Path] = (),
             ports: Iterable[int] = (), task_copy: Path | None = None, read_only: bool = False) -> sandbox.Box | None:
    """The box (kiro.processes.sandbox) a step's process runs in, or None with `sandbox: off` (or no
    setting where bwrap is not usable): `loop_box` for this step. `project`: where it runs, when not the
    step's project directory (verify in a worker's tree, run_command's confinement root)."""
    return loop_box(ctx.config, ctx.workspace, project or ctx.project_dir, ctx.task_path, env, home_paths=home_paths,
                    read_paths=read_paths, ports=ports, task_copy=task_copy, read_only=read_only)


def loop_box(cfg: Config, workspace: Workspace, project: Path, task_path: Path | None, env: Mapping[str, str], *,
             home_paths: Iterable[Path] = (), read_paths: Iterable[Path] = (), ports: Iterable[int] = (),
             task_copy: Path | None = None, read_only: bool = False) -> sandbox.Box | None:
    """The box of a loop's steps, run in `project`: what each step's process runs in, and what the loop's
    start line names (kiro.core.runner), from this one place. None with `sandbox: off` (or no setting where
    bwrap is not usable). `ports`: the host's loopback ports its own network reaches (an agent CLI's model
    endpoint). The task file, `Specs/` and `.kiro/specs/` are read-only in every box (SPEC §15: a step never
    writes a task's frontmatter, plants a task file, or writes a person's edits away); an agent that checks
    its box edits `task_copy`, its own copy (kiro.executors.control.StepCopy), read-write. `read_only`: the
    project read-only too (a reviewer's box, kiro.core.review). `task_path` None: no loop's task file yet
    (`kiro agents` shows the box its presets would run in). Worked out once per loop, not per step
    (sandbox.box_for keeps it while what it looked at on disk stays as it was)."""
    if not sandbox.wanted(cfg.sandbox):
        return None
    copy_rw = [str(task_copy.parent)] if task_copy is not None else []
    # task files are a person's: the loop's own, and every other in Specs/ and .kiro/specs/ (SPEC §15); read-only
    # at their real paths, worked out with the box (not at every step: box_for looks at what is there)
    return sandbox.box_for(project=project, workspace=workspace.root, state_dir=workspace.state_dir,
                           task_file=task_copy, home=_home(env.get("HOME")), home_paths=home_paths,
                           read_paths=read_paths, extra_rw=(*cfg.sandbox_paths.rw, *copy_rw),
                           extra_ro=tuple(cfg.sandbox_paths.ro), task_areas=_task_areas(workspace),
                           task_path=task_path, network=cfg.sandbox_network, ports=ports, read_only=read_only)


@cache
def _home(home: str | None) -> Path | None:
    """The box's home: a step's HOME, when it is an absolute path (the same Path from step to step)."""
    return Path(home) if home and os.path.isabs(home) else None


@cache
def _task_areas(workspace: Workspace) -> tuple[Path, Path]:
    """Where a workspace keeps task files besides the loop's own: Specs/ and .kiro/specs/."""
    return workspace.specs, workspace.root / ".kiro" / "specs"


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
        env = step_env(ctx)
        result = await run_process(shell_argv(command), cwd=ctx.project_dir, env=env,
                                   timeout=ctx.timeout_seconds, cancel=ctx.cancel, box=step_box(ctx, env))
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
