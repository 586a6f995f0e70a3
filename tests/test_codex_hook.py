"""kiro's PreToolUse hook on codex-acp's commands out of kiro's box (kiro.processes.codex_hook), run
as Codex runs it: the hook command line from CODEX_CONFIG through `sh -c`, the call as JSON on stdin. Codex
runs what passes through bash, so the attacks are what bash would expand or run besides the allowed
program; the end-to-end runs are tests/test_agent_acp_codex_opencode.py and tests/test_sandbox_escapes.py."""

from __future__ import annotations

import json
import subprocess
import sys

from kiro.executors.agents.codex_acp import codex_config
from kiro.store.config import ShellToolSettings

PATCH = "apply_patch <<'PATCH'\n*** Begin Patch\n*** Add File: notes.md\n+hi\n*** End Patch\nPATCH\n"
KEY = "/home/someone/.ssh/id_ed25519"
ATTACKS = {
    "a second line": f"cat notes.md\ncat {KEY}",
    "command substitution": f"cat $(echo {KEY})",
    "backquotes": f"cat `echo {KEY}`",
    "a variable": "cat $HOME/.ssh/id_ed25519",
    "an escaped newline": f"cat notes.md \\\ncat {KEY}",
    "an operator": f"cat notes.md; cat {KEY}",
    "a program off the list": f"head {KEY}",
    "a shell on the list's program": f"cat notes.md && sh -c 'cat {KEY}'",
    "a command after the patch": f"{PATCH}cat {KEY}\n",
    "the patch's end line twice": f"apply_patch <<'PATCH'\n*** Begin Patch\nPATCH\ncat {KEY}\nPATCH\n",
    "an unquoted patch heredoc": f"apply_patch <<PATCH\n+$(cat {KEY})\nPATCH\n",
}


def hook(command: str) -> subprocess.CompletedProcess[str]:
    config = codex_config(ShellToolSettings(enabled=True, allow=["cat"]))
    line = config["hooks"]["PreToolUse"][0]["hooks"][0]["command"]  # type: ignore[index]
    call = {"hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {"command": command}}
    return subprocess.run(["sh", "-c", line], input=json.dumps(call), capture_output=True, text=True, timeout=60)


def test_the_hook_lets_the_allowed_command_and_codex_s_own_patch_through() -> None:
    for command in ("cat notes.md", "cat 'a file.md'", PATCH):
        r = hook(command)
        assert r.returncode == 0, (command, r.stderr)


def test_the_hook_refuses_every_way_round_the_allow_list_saying_why() -> None:
    held = 0
    for what, command in ATTACKS.items():
        r = hook(command)
        print(f"  {what}: exit {r.returncode}: {r.stderr.strip()}")
        assert r.returncode == 2 and r.stderr.startswith("kiro refused this command: "), (what, r)
        held += 1
    print(f"attacks tried: {len(ATTACKS)}, held: {held}")


def test_a_hook_that_cannot_start_refuses_rather_than_lets_codex_run_the_command() -> None:
    config = codex_config(ShellToolSettings())
    line = config["hooks"]["PreToolUse"][0]["hooks"][0]["command"]  # type: ignore[index]
    broken = line.replace("kiro.processes.codex_hook", "kiro.processes.no_such_module")
    r = subprocess.run(["sh", "-c", broken], input="{}", capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r


def test_the_hook_starts_without_kiro_s_agent_config_or_pydantic_modules() -> None:
    """Codex starts the hook before every shell command: it loads the standard library and kiro.processes
    only (it loaded kiro.executors.agents, kiro.store.config and pydantic: ~0.4 s of CPU a command)."""
    probe = ("import runpy, sys; sys.argv = ['hook', sys.argv[1]]\n"
             "try:\n    runpy.run_module('kiro.processes.codex_hook', run_name='__main__')\n"
             "except SystemExit as exc:\n    print(exc.code)\n"
             "print(sorted(m for m in sys.modules if m.startswith(('kiro.', 'pydantic'))))")
    call = {"hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {"command": "cat notes.md"}}
    r = subprocess.run([sys.executable, "-c", probe, ShellToolSettings(enabled=True, allow=["cat"]).model_dump_json()],
                       input=json.dumps(call), capture_output=True, text=True, timeout=60)
    code, modules = r.stdout.splitlines()
    assert code == "0", r.stderr
    assert eval(modules) == ["kiro.processes", "kiro.processes.programs", "kiro.processes.shellwords"], modules
