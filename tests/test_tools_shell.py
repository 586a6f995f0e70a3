"""run_command: off by default; when on, an allow-list, no shell, a time limit that kills the whole
process group, bounded output, and an environment without credentials."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kiro.executors.tools import ToolResult, toolset
from kiro.executors.tools.shell import clean_environment
from kiro.processes.shellwords import allowed, shell_words
from tests.fake_openai import StepHarness, invoke, make_harness

KEY_ENV = "KIRO_TEST_OPENAI_KEY"


def shell_harness(tmp_path: Path, **shell: Any) -> StepHarness:
    return make_harness(tmp_path / "ws", llm={"api_key_env": KEY_ENV},
                        tools={"shell": {"enabled": True, **shell}})


def run(h: StepHarness, command: str, **args: Any) -> ToolResult:
    async def go() -> ToolResult:
        return await invoke(h.tool_env(), "run_command", {"command": command, **args})

    return asyncio.run(go())


def test_off_by_default_and_not_offered(tmp_path: Path) -> None:
    h = make_harness(tmp_path / "ws")
    assert "run_command" not in toolset(h.config)
    env = h.tool_env()
    from kiro.executors.tools import shell  # called directly, as a model could not

    async def go() -> ToolResult:
        from kiro.executors.tools.base import execute
        return await execute(shell.TOOLS[0], shell.RunCommandArgs(command="echo hi"), env)

    result = asyncio.run(go())
    assert not result.ok and "tools.shell.enabled is false" in result.text


def test_allow_list_is_enforced(tmp_path: Path) -> None:
    h = shell_harness(tmp_path, allow=["echo", "git status"])
    assert run(h, "echo hello world").text.endswith("hello world\n")
    refused = run(h, "ls -la")
    assert not refused.ok and "'ls' is not on the allow-list" in refused.text
    assert "'git status'" in refused.text
    assert "not on the allow-list" in run(h, "git push --force").text
    assert "not on the allow-list" in run(h, "/bin/echo hi").text  # a path is not the allowed name
    assert "not on the allow-list" in run(h, "echoo hi").text


def test_an_empty_allow_list_allows_nothing(tmp_path: Path) -> None:
    h = shell_harness(tmp_path)
    assert "tools.shell.allow lists nothing" in run(h, "echo hi").text


@pytest.mark.parametrize("command", [
    "echo hi; rm -rf x", "echo hi && rm -rf x", "echo hi | sh", "echo hi > out.txt", "echo hi &",
    "echo $(id)x || true",
])
def test_no_shell_operators(tmp_path: Path, command: str) -> None:
    h = shell_harness(tmp_path, allow=["echo"])
    result = run(h, command)
    assert not result.ok and "without a shell" in result.text
    assert not (h.root / "out.txt").exists()


def test_no_shell_expansion(tmp_path: Path) -> None:
    """What a shell would expand is refused (the agent's idea of its words is a shell's); quoted, it is literal."""
    h = shell_harness(tmp_path, allow=["echo"])
    refused = run(h, "echo $HOME *")
    assert not refused.ok and "'$' outside quotes" in refused.text
    assert run(h, "echo '$HOME' '*'").text.endswith("$HOME *\n")


def test_runs_in_the_project_directory(tmp_path: Path) -> None:
    h = shell_harness(tmp_path, allow=["pwd"])
    assert run(h, "pwd").text.strip().endswith(str(h.root.resolve()))


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    h = shell_harness(tmp_path, allow=["sh"], timeout_seconds=30, trust_agent_code=True)
    h.config.sandbox = "off"  # the pid it records is the host's only without the box's PID namespace
    result = run(h, "sh -c 'sleep 60 & echo $! > child.pid; wait'", timeout_seconds=0.5)
    assert "killed after the 0.5 s time limit" in result.text and not result.ok
    child = int((h.root / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def test_timeout_argument_is_capped_by_config(tmp_path: Path) -> None:
    h = shell_harness(tmp_path, allow=["sleep"], timeout_seconds=0.5)
    result = run(h, "sleep 30", timeout_seconds=9999)
    assert "killed after the 0.5 s time limit" in result.text


def test_environment_has_no_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    canary = "sk-canary-env-5d2e8f1a9b"
    monkeypatch.setenv(KEY_ENV, canary)
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-canary-1234567")
    monkeypatch.setenv("DB_PASSWORD", "pw-canary-1234567")
    monkeypatch.setenv("INNOCENT_ALIAS", canary)  # the key under a harmless name
    monkeypatch.setenv("KIRO_VISIBLE", "yes")
    h = shell_harness(tmp_path, allow=["env"], trust_agent_code=True)
    out = run(h, "env").text
    assert "KIRO_VISIBLE=yes" in out and "PATH=" in out
    for leaked in (canary, "tok-canary", "pw-canary", KEY_ENV, "MY_SERVICE_TOKEN", "DB_PASSWORD",
                   "INNOCENT_ALIAS"):
        assert leaked not in out


def test_output_is_bounded_and_says_so(tmp_path: Path) -> None:
    h = shell_harness(tmp_path, allow=[sys.executable], max_output_chars=1000, trust_agent_code=True)
    result = run(h, f"{sys.executable} -c \"print('x' * 50000 + 'END')\"")
    assert "output truncated" in result.text and result.text.rstrip().endswith("END")
    assert len(result.text) < 1500


def test_missing_program_and_exit_status(tmp_path: Path) -> None:
    h = shell_harness(tmp_path, allow=["no-such-program-kiro", "false"])
    assert "not found" in run(h, "no-such-program-kiro").text
    failed = run(h, "false")
    assert "exit status 1" in failed.text and not failed.ok


def test_helpers() -> None:
    assert shell_words("pytest -q 'tests/a b.py'") == ["pytest", "-q", "tests/a b.py"]
    assert shell_words("echo 'a > b'") == ["echo", "a > b"]  # quoted: an argument, not a redirection
    assert allowed(["git", "status", "--short"], ["git status"])
    assert not allowed(["git"], ["git status"])
    env = clean_environment("MY_KEY_VAR", "sk-value-123456789",
                            {"PATH": "/bin", "MY_KEY_VAR": "x", "GH_AUTH": "y", "COPY": "sk-value-123456789"})
    assert env == {"PATH": "/bin"}
