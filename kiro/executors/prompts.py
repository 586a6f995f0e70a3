"""The prompts kiro sends to agents, rendered from package data that a workspace can override.

Templates are `string.Template` files (`$name` placeholders) in `kiro/prompts/`; a workspace
overrides one by putting a file of the same name in `<workspace>/config/prompts/`. Rendering
never fails on a missing placeholder (safe_substitute), so an override can drop what it does not want.
"""

from __future__ import annotations

import os
import re
import stat
from functools import lru_cache
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING

from kiro.fs import statcache
from kiro.fs.statcache import StatCache
from kiro.status import percent
from kiro.store import kirospec
from kiro.store.state import clip

if TYPE_CHECKING:
    from kiro.store.state import LoopState
    from kiro.store.tasks import Step, TaskFile
    from kiro.store.workspace import Workspace

TEMPLATE_NAMES = ("system.md", "agent_cli.md", "step.md", "continuation.md")


_PACKAGED = Path(__file__).parent.parent / "prompts"  # kiro/prompts/, installed as files beside the modules


@lru_cache(maxsize=32)
def _packaged(name: str) -> str:
    """A template kiro ships. Read from the package's folder, not through importlib.resources: every loop reads
    one (a shell step's prompt too), and importlib.resources' import (its readers, zipfile) was ~9 M
    instructions of every start (issue #41)."""
    return (_PACKAGED / name).read_text(encoding="utf-8")


_files: StatCache[str] = StatCache(most=256)  # the files' texts, read again only when changed (kiro.fs.statcache)


def _read_text(path: str, errors: str = "strict") -> str | None:
    """The text of the file at `path`, or None when there is no file there. Read once per version
    of the file (kiro.fs.statcache): a loop builds prompts every iteration, and a person may edit
    these files at any time."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode):
        return None

    def read() -> str:
        with open(path, encoding="utf-8", errors=errors) as fh:
            return fh.read()

    return _files.read(path, st, read)


@lru_cache(maxsize=64)
def _template(text: str) -> Template:
    return Template(text)


class Overrides:
    """The workspace's own prompt files as one prompt's build finds them: `config/prompts/<name>` in place of a
    template kiro ships, `config/rules.md` (else `AGENTS.md` at the root) for the rules. What `config/` holds is
    looked at once a build (`kiro.fs.statcache.names`: a stat of it while nothing in it changed), and only a file
    it holds is stat'ed: a build with no override asks two stats (`config/`, `AGENTS.md`), not four (issue #41).
    Each file is still read fresh at every build: a person may add, edit or remove one at any time."""

    __slots__ = ("config", "root")

    def __init__(self, workspace: Workspace | None) -> None:
        self.root = os.fspath(workspace.root) if workspace is not None else None
        config = os.path.join(self.root, "config") if self.root is not None else None
        self.config = statcache.names(config) if config is not None else frozenset()

    def _in_config(self, name: str) -> bool:
        return self.config is None or name in self.config  # not listed: look at the file itself

    def template(self, name: str) -> Template:
        if self.root is not None and self._in_config("prompts"):
            override = _read_text(os.path.join(self.root, "config", "prompts", name))
            if override is not None:
                return _template(override)
        return _template(_packaged(name))

    def rules(self) -> str:
        """The workspace's own rules for agents: `config/rules.md`, or AGENTS.md at the root."""
        if self.root is None:
            return ""
        candidates = [os.path.join(self.root, "AGENTS.md")]
        if self._in_config("rules.md"):
            candidates.insert(0, os.path.join(self.root, "config", "rules.md"))
        for candidate in candidates:
            text = _read_text(candidate, errors="replace")
            if text is not None:
                return f"\n# Workspace rules\n{clip(text.strip(), 8000)}\n"
        return ""


def template(name: str, workspace: Workspace | None = None) -> Template:
    return Overrides(workspace).template(name)


def system_prompt(task: TaskFile, state: LoopState, workspace: Workspace | None = None,
                  *, executor: str = "openai", template_name: str | None = None,
                  overrides: Overrides | None = None) -> str:
    """The standing instructions from `template_name` (the executor's `system_template`): tool-calling
    agents get `system.md`, external agent CLIs `agent_cli.md`, which speaks of checkboxes instead
    of tools. Without a template, chosen by executor name (callers from before executors chose). `overrides`:
    the build's look at the workspace's prompt files (else one now)."""
    instructions = task.frontmatter.get("instructions")
    text = f"# Instructions for this task\n{instructions}\n" if isinstance(instructions, str) and instructions else ""
    name = template_name or ("system.md" if executor == "openai" else "agent_cli.md")
    overrides = overrides or Overrides(workspace)
    return overrides.template(name).safe_substitute(
        title=task.title, task_path=state.task_path, task_id=state.task_id,
        instructions=text, rules=overrides.rules(),
    )


_NESTED = re.compile(r"# Task Continuation Context\n.*?Please continue from where you left off\.\n*", re.S)


def recent_prompt(prompt: str, continuation: str | None) -> str:
    """The prompt as "Recent Context" keeps it: without the continuation context it carried, so the
    next continuation does not nest this one (and that one the one before)."""
    if continuation:
        prompt = prompt.replace(continuation + "\n", "", 1).replace(continuation, "", 1)
    return _NESTED.sub("", prompt)  # also what a state saved by an older kiro may hold


def continuation_context(state: LoopState, step: Step | None = None) -> str:
    """Seed 004's "Task Continuation Context", from the state as it is now (P-6)."""
    cur = state.current_step
    return template("continuation.md").safe_substitute(
        task_path=state.task_path,
        iteration=state.iteration,
        max_iterations=state.max_iterations,
        status=state.status,
        completed_count=len(state.completed_steps),
        failed_count=len(state.failed_steps),
        success_rate=percent(state.metrics.success_rate),
        step_id=(step.id if step else cur.step_id if cur else "-"),
        step_description=(step.title if step else cur.description if cur else "-"),
        step_status=(cur.status if cur else "pending"),
        last_prompt=clip(recent_prompt(state.context.last_prompt, None), 1500) or "(none yet)",
        last_response=clip(state.context.last_response, 1500) or "(none yet)",
    )


def step_prompt(
    task: TaskFile,
    step: Step,
    state: LoopState,
    *,
    attempt: int,
    previous_error: str | None = None,
    verify_output: str | None = None,
    verify_command: str | None = None,
    continuation: str | None = None,
    workspace: Workspace | None = None,
    finish: str | None = None,
    overrides: Overrides | None = None,
) -> str:
    """The prompt for one attempt at one step. `finish` says how to report the step done; the
    default is the tool-calling agent's `complete_step`. `overrides`: as `system_prompt`'s."""
    counts = task.counts()
    details = [d for d in step.details if not d.strip().startswith("_Requirements")]
    requirements = [d for d in step.details if d.strip().startswith("_Requirements")]
    details_text = "## Details\n" + "\n".join(details) + "\n\n" if details else ""
    req_text = "## Requirements\n" + "\n".join(r.strip().strip("-").strip() for r in requirements) + "\n\n" \
        if requirements else ""
    spec = kirospec.context(task.path, step.title or step.text, step.details)  # a task file in .kiro/specs/
    if spec is not None:
        req_text = spec  # names requirements.md, design.md and steering, and quotes what the step cites
    previous = f"## The previous attempt failed\n{clip(previous_error, 3000)}\n\n" if previous_error else ""
    verify_block = ""
    if verify_command:
        verify_block = f"## Verification\nThe step counts as done only when `{verify_command}` exits 0.\n"
        if verify_output:
            verify_block += f"Its output last time:\n```\n{clip(verify_output, 3000)}\n```\n"
        verify_block += "\n"
    return (overrides or Overrides(workspace)).template("step.md").safe_substitute(
        continuation=(continuation + "\n") if continuation else "",
        step_id=step.id,
        step_title=step.title or step.text,
        iteration=state.iteration,
        max_iterations=state.max_iterations,
        attempt=attempt,
        task_path=state.task_path,
        steps_done=counts.done,
        steps_total=counts.total,
        details=details_text,
        requirements=req_text,
        previous=previous,
        verify_block=verify_block,
        finish=finish or "When the step is done, call `complete_step` with a one-paragraph summary.",
    )


def finish_instruction(executor: str, step: Step, task_path: str, command_success: str, *,
                       task: TaskFile | None = None, task_file: Path | None = None) -> str:
    """How an agent reports the step done, by executor. An agent CLI is told the task file's full
    path and the exact line to change (`- [-] 2.1 Title` -> `- [x] 2.1 Title`)."""
    if executor == "command":
        if command_success == "exit_code":
            return "When the step is done, exit with status 0; exit non-zero if you could not do it."
        where = str(task_file) if task_file is not None else task_path
        line = step_line(task, step) if task is not None else None
        if line is not None:
            done = line[: line.index("[") + 1] + "x" + line[line.index("[") + 2:]
            change = f"change this line:\n\n    {line}\n\nto\n\n    {done}\n\n"
        else:
            change = f"change `[-]` to `[x]` on the line of step {step.id} "
        return (f"When step {step.id} is done, check its box in the task file `{where}`: {change}and change nothing "
                f"else in that file. kiro counts the step done only when that box is checked and you exit with "
                f"status 0.")
    return "When the step is done, call `complete_step` with a one-paragraph summary."


def step_line(task: TaskFile, step: Step) -> str | None:
    """The step's line in the task file as the agent will see it while the step runs (box `[-]`)."""
    lines = task.text.splitlines()
    if not 0 <= step.line < len(lines):
        return None
    line = lines[step.line].rstrip()
    start = line.find("[")
    if start < 0 or start + 2 >= len(line) or line[start + 2] != "]":
        return None
    return line[: start + 1] + "-" + line[start + 2:]

