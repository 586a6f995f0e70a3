"""run_command: one allow-listed program, run without a shell, in the project directory.

Off unless `tools.shell.enabled`; then the command's leading words must equal one allow-list
entry (`pytest` allows `pytest -q tests/`; `git status` allows `git status --short` but not
`git push`). Its words are read as bash would read them and must be literal (kiro.processes.shellwords: the
one check every allow-list shares, also where an agent's own shell runs the command), so `pytest; rm -rf ~`,
`{a,b}`, `*`, `$VAR` or `~` are refused with a message saying so rather than passed on.

The child gets its own process group (killed whole on timeout or when kiro stops), a bounded
output, and an environment without credentials: no variable whose name contains KEY, TOKEN,
SECRET, PASSWORD, CREDENTIAL or AUTH, not the variable `llm.api_key_env` names, and none whose
value is the API key under another name. It runs without capabilities (setpriv), with HOME set
to an empty temporary folder, and git pinned to the real repository with its helpers off.
Programs that run code the agent can write (shells, interpreters, build tools, package managers)
are refused on the allow-list unless `tools.shell.trust_agent_code` (see kiro.processes.programs).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from kiro.executors.shell import no_bytecode, step_box
from kiro.executors.tools.base import Args, Tool, ToolEnv, ToolResult
from kiro.executors.tools.errors import ToolError
from kiro.processes import groups, programs, shellwords
from kiro.processes.spawn import run_process
from kiro.store.config import ShellToolSettings
from kiro.store.redact import looks_secret


class RunCommandArgs(Args):
    command: str = Field(min_length=1, max_length=10_000,
                         description="one program and its arguments, e.g. 'pytest -q tests/test_x.py'")
    timeout_seconds: float | None = Field(None, gt=0, description="time limit in seconds (capped by kiro)")


def clean_environment(api_key_env: str, api_key: str | None = None,
                      environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of the environment without anything that looks like a credential."""
    env = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for name, value in env.items():
        if looks_secret(name) or name.upper() == api_key_env.upper():
            continue
        if api_key and len(api_key) >= 8 and api_key in value:
            continue
        out[name] = value
    return out


def permitted(command: str, settings: ShellToolSettings) -> list[str]:
    """The argv of an agent's command when `tools.shell` lets it run (kiro.processes.shellwords.permitted);
    else a ToolError saying why."""
    try:
        return shellwords.permitted(command, settings)
    except shellwords.Refused as exc:
        raise ToolError(str(exc)) from None


async def run_command(args: RunCommandArgs, env: ToolEnv) -> ToolResult:
    settings = env.ctx.config.tools.shell
    argv = permitted(args.command, settings)
    timeout = min(args.timeout_seconds or settings.timeout_seconds, settings.timeout_seconds)
    remaining = env.remaining()
    if remaining is not None:
        if remaining < 1:
            raise ToolError("no time left in this step to run a command")
        timeout = min(timeout, remaining - 0.5)
    if not groups.confinement_available():
        raise ToolError("run_command is unavailable: kiro runs as root and `setpriv` (util-linux) is not installed, "
                        "so it cannot drop the command's capabilities; install util-linux")
    api_key = os.environ.get(env.api_key_env)
    home = Path(tempfile.mkdtemp(prefix="kiro-home-"))
    try:
        # Also drop what the loop's redactor knows is secret (key formats, URL passwords, secret_env).
        known = {k: v for k, v in clean_environment(env.api_key_env, api_key).items()
                 if not env.ctx.redact.contains_secret(v)}
        child_env = no_bytecode(env.ctx.config, programs.safe_home_environment(known, home, env.confinement.root))
        if programs.program_name(argv[0]) == "git":
            try:
                child_env = programs.git_environment(env.confinement.root, child_env)
            except programs.NoRepository as exc:
                raise ToolError(f"git: {exc}; kiro does not let git take files in the project for a "
                                f"repository") from None
        result = await run_process(argv, cwd=env.confinement.root, env=child_env, timeout=timeout,
                                   cancel=env.ctx.cancel, output_limit=settings.max_output_chars, confine=True,
                                   box=step_box(env.ctx, child_env, project=env.confinement.root))
    except FileNotFoundError:
        raise ToolError(f"program {argv[0]!r} not found (looked on PATH and in the project directory)") \
            from None
    except PermissionError:
        raise ToolError(f"program {argv[0]!r} is not executable") from None
    finally:
        shutil.rmtree(home, ignore_errors=True)
    output = env.redact(result.output)
    cut = len(result.output.encode("utf-8", errors="replace")) >= settings.max_output_chars
    if result.cancelled:
        status = "stopped: kiro is stopping"
    elif result.timed_out:
        status = f"killed after the {timeout:g} s time limit"
    else:
        status = f"exit status {result.returncode}"
    text = f"$ {args.command}\n[{status}, {result.duration:.1f} s]\n"
    if cut:
        text += f"[output truncated: only the last {settings.max_output_chars} characters are kept]\n"
    text += output if output.strip() else "(no output)"
    return ToolResult(text, ok=result.ok)


TOOLS: tuple[Tool[Any], ...] = (
    Tool("run_command",
         "Run one allow-listed program in the project directory, without a shell (no pipes, redirection, "
         "'&&', globbing or $VARS), and return its exit status and output (bounded).",
         RunCommandArgs, run_command),
)
