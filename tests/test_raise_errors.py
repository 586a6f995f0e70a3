"""KIRO_RAISE_ERRORS=1 (issue 7 item 15): an unexpected exception in an executor, a tool or a CLI
command re-raises instead of becoming a failed attempt, an error text for the model or an
"internal error" line. Every test runs with it set (conftest); these tests prove each of the three
places honours it, and that without it a person still gets the forgiving behaviour."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from kiro.cli import app
from kiro.core.runner import prepare_start, run_loops
from kiro.errors import raise_errors
from kiro.executors.base import ExecutorBase, StepContext, StepResult
from kiro.executors.tools.base import Tool, ToolEnv, ToolResult, execute
from kiro.store.workspace import Workspace as KiroWorkspace
from tests.conftest import Workspace, shell_task
from tests.fake_openai import make_harness


def test_every_test_and_every_kiro_subprocess_runs_with_the_switch(ws: Workspace) -> None:
    assert os.environ.get("KIRO_RAISE_ERRORS") == "1"
    assert raise_errors()
    assert ws.env()["KIRO_RAISE_ERRORS"] == "1"


@pytest.mark.parametrize("value, expected", [("1", True), ("0", False), ("", False)])
def test_the_switch_reads_the_environment(monkeypatch: pytest.MonkeyPatch, value: str, expected: bool) -> None:
    monkeypatch.delenv("KIRO_DEBUG", raising=False)
    monkeypatch.setenv("KIRO_RAISE_ERRORS", value)
    assert raise_errors() is expected


class _Bug(BaseModel):
    path: str


async def _buggy(args: _Bug, env: ToolEnv) -> ToolResult:
    raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")


def BuggyTool() -> Tool[_Bug]:
    return Tool(name="buggy", description="a tool with a bug", args=_Bug, run=_buggy)


def test_a_tool_bug_raises_instead_of_becoming_text_for_the_model(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    env = make_harness(tmp_path / "ws").tool_env()
    with pytest.raises(TypeError, match="unsupported operand"):
        asyncio.run(execute(BuggyTool(), _Bug(path="a"), env))
    monkeypatch.delenv("KIRO_RAISE_ERRORS")
    monkeypatch.delenv("KIRO_DEBUG", raising=False)
    result = asyncio.run(execute(BuggyTool(), _Bug(path="a"), env))
    assert not result.ok and "buggy failed: TypeError" in result.text


class BuggyExecutor(ExecutorBase):
    name = "shell"

    def __init__(self) -> None:
        self.calls = 0

    async def run_step(self, ctx: StepContext) -> StepResult:
        self.calls += 1
        raise TypeError("'NoneType' object is not subscriptable")

    async def aclose(self) -> None:
        return None


def _run_buggy(ws: Workspace, task_id: str) -> tuple[Any, BuggyExecutor]:
    ex = BuggyExecutor()
    run = prepare_start(KiroWorkspace(ws.root), "Specs/feature/tasks.md", task_id=task_id, executor=ex)
    [outcome] = asyncio.run(run_loops([run]))
    return outcome, ex


def test_an_executor_bug_raises_instead_of_becoming_a_failed_attempt(ws: Workspace,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    ws.task(shell_task(2))
    with pytest.raises(TypeError, match="not subscriptable"):
        _run_buggy(ws, "bug1")
    assert ws.state("bug1")["status"] != "completed"

    monkeypatch.delenv("KIRO_RAISE_ERRORS")
    monkeypatch.delenv("KIRO_DEBUG", raising=False)
    ws.task(shell_task(2), "Specs/other/tasks.md")
    run = prepare_start(KiroWorkspace(ws.root), "Specs/other/tasks.md", task_id="bug2", executor=BuggyExecutor())
    [outcome] = asyncio.run(run_loops([run]))
    assert outcome.exit_code == 5
    assert "executor error: TypeError" in ws.state("bug2")["steps"]["1"]["last_error"]


def test_a_cli_bug_raises_instead_of_printing_internal_error(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise TypeError("a bug in the status view")

    monkeypatch.setattr("kiro.views.loops.all_rows", broken)
    monkeypatch.chdir(ws.root)
    ws.task(shell_task(1))
    r = CliRunner().invoke(app, ["loop", "status"])
    assert isinstance(r.exception, TypeError)

    monkeypatch.delenv("KIRO_RAISE_ERRORS")
    monkeypatch.delenv("KIRO_DEBUG", raising=False)
    r = CliRunner().invoke(app, ["loop", "status"])
    assert r.exit_code == 1
    assert "internal error: TypeError: a bug in the status view" in r.output


class BrokenClose(ExecutorBase):
    name = "shell"

    async def run_step(self, ctx: StepContext) -> StepResult:
        return StepResult("completed", summary="ok")

    async def aclose(self) -> None:
        raise TypeError("a bug in aclose")


def test_a_bug_in_clean_up_surfaces_too(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    """Clean-up that must not end a person's loop (closing the executor) still fails a test."""
    ws.task(shell_task(1))
    run = prepare_start(KiroWorkspace(ws.root), "Specs/feature/tasks.md", task_id="c1", executor=BrokenClose())
    with pytest.raises(TypeError, match="a bug in aclose"):
        asyncio.run(run_loops([run]))
    monkeypatch.delenv("KIRO_RAISE_ERRORS")
    monkeypatch.delenv("KIRO_DEBUG", raising=False)
    ws.task(shell_task(1), "Specs/other/tasks.md")
    run = prepare_start(KiroWorkspace(ws.root), "Specs/other/tasks.md", task_id="c2", executor=BrokenClose())
    [outcome] = asyncio.run(run_loops([run]))
    assert outcome.exit_code == 0
