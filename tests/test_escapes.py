"""The adversarial suite: what a hostile agent tries, as a table (issue #7, "Must show").

Each row is one escape attempt made the way an agent makes it (a tool call, an allow-list a person
might write, a file planted in the project) against the real programs (git, coreutils, /proc).
A row HOLDS when kiro refuses or the attempt has no effect: no file outside the project or in a
control folder changed, no planted command ran (no PWNED file), no secret came back.

    pytest -s tests/test_escapes.py     # prints the table and "escapes tried: N, held: N"

The file-tool rows come from tests/test_tools_confinement.py (ESCAPES); the rows here add the
allow-listed programs (item 1), /proc/<kiro pid>/environ (item 3d), ReDoS (item 2), hard links
and secrets.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from kiro.executors.tools import ToolResult
from kiro.processes.sandbox import SERVE_FOLDER
from kiro.store.config import Config
from tests.fake_openai import StepHarness, invoke, make_harness
from tests.test_tools_confinement import ESCAPES as FILE_ESCAPES
from tests.test_tools_confinement import SECRET, snapshot

REPO = Path(__file__).resolve().parent.parent
ALLOW = ["git status", "git diff", "git log", "git grep", "git show", "cat", "ls", "echo", "base64", "cut",
         "head", "tail", "od", "grep", "wc"]


@dataclass
class Row:
    area: str
    tried: str
    held: bool
    detail: str = ""


def print_table(title: str, rows: list[Row]) -> None:
    width = max(len(r.tried) for r in rows)
    print(f"\n{title}")
    print(f"{'area':<12} {'escape tried':<{width}}  result")
    for r in rows:
        verdict = "held" if r.held else f"ESCAPED: {r.detail}"
        print(f"{r.area:<12} {r.tried:<{width}}  {verdict}")
    print(f"escapes tried: {len(rows)}, held: {sum(r.held for r in rows)}")


def run(h: StepHarness, command: str) -> ToolResult:
    async def go() -> ToolResult:
        return await invoke(h.tool_env(), "run_command", {"command": command})

    return asyncio.run(go())


def shell_harness(root: Path, allow: list[str] | None = None) -> StepHarness:
    return make_harness(root, tools={"shell": {"enabled": True, "allow": allow or ALLOW}})


def plant_fake_repository(project: Path, command: str) -> None:
    """The attack of issue #7 item 1: plain files that make git take the folder for a repository
    whose config runs `command` as core.fsmonitor."""
    (project / "HEAD").write_text("ref: refs/heads/main\n")
    (project / "commondir").write_text("c\n")
    (project / "config.worktree").write_text(f"[core]\n\tworktree = {project}\n\tbare = false\n")
    (project / "c" / "refs").mkdir(parents=True, exist_ok=True)
    (project / "c" / "objects").mkdir(exist_ok=True)
    (project / "c" / "config").write_text(
        f'[core]\n\trepositoryformatversion = 1\n\tfsmonitor = "{command}"\n[extensions]\n\tworktreeConfig = true\n')


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                   env={**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"})


def real_repository(root: Path) -> StepHarness:
    h = shell_harness(root)
    git(root, "init", "-q")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "init")
    (root / "a.txt").write_text("one\n")
    return h


# -- item 1: the exact attack, with the real git CLI -----------------------------------------------


def test_issue_7_item_1_planted_repository_does_not_run_fsmonitor(tmp_path: Path) -> None:
    """The README's example allow-list, a project that is not a git checkout, and the four files."""
    h = make_harness(tmp_path / "ws", tools={"shell": {"enabled": True, "allow": ["git status"]}})
    plant_fake_repository(h.root, "touch PWNED; false")
    # The attack is real: git itself takes the folder for a repository and runs the command.
    subprocess.run(["git", "status", "--short"], cwd=h.root, capture_output=True,
                   env={**os.environ, "GIT_CEILING_DIRECTORIES": str(h.root.parent)})
    assert (h.root / "PWNED").exists()
    (h.root / "PWNED").unlink()

    result = run(h, "git status --short")
    assert not result.ok and "not inside a git checkout" in result.text
    assert not (h.root / "PWNED").exists()


# -- item 3d: /proc/<kiro pid>/environ ------------------------------------------------------------

PROBE = textwrap.dedent("""\
    import asyncio, json, os, sys
    from pathlib import Path
    from kiro.processes import groups
    from tests.fake_openai import invoke, make_harness
    groups.make_undumpable()  # what the engine does when a loop starts
    h = make_harness(Path(sys.argv[1]), tools={"shell": {"enabled": True, "allow": json.loads(sys.argv[2])}})
    pid = os.getpid()
    out = {}
    async def main():
        for command in json.loads(sys.argv[3]):
            r = await invoke(h.tool_env(), "run_command", {"command": command.format(pid=pid)})
            out[command] = r.text
    asyncio.run(main())
    own = Path("/proc/self/environ").read_bytes().decode(errors="replace")
    print(json.dumps({"results": out, "own_environ_has_canary": os.environ["PROBE_PLAIN"] in own}))
    """)

PROC_ATTEMPTS = [
    "cat /proc/{pid}/environ",
    "base64 /proc/{pid}/environ",
    "cut -c1-100000 /proc/{pid}/environ",
    "head -c 100000 /proc/{pid}/environ",
    "tail -c 100000 /proc/{pid}/environ",
    "od -c /proc/{pid}/environ",
    "grep -a PROBE /proc/{pid}/environ",
    "cat /proc/self/../{pid}/environ",
    "cat /proc/{pid}/task/{pid}/environ",
    "cat /proc/{pid}/root/proc/{pid}/environ",
    "ls -l /proc/{pid}/fd/",
    "cat /proc/{pid}/mem",
]


def proc_rows(tmp_path: Path) -> list[Row]:
    """Run kiro's run_command in a process whose environment holds two canaries (one under a name
    the redactor knows, one under a plain name it cannot know), and read that process's /proc."""
    plain, keyed = f"plain-{uuid.uuid4().hex}", f"sk-{uuid.uuid4().hex}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PROBE_PLAIN": plain, "OPENAI_API_KEY": keyed}
    done = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "probe"), json.dumps(ALLOW),
                           json.dumps(PROC_ATTEMPTS)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["own_environ_has_canary"]  # the canary really is in the environ under attack
    rows = []
    for command, text in report["results"].items():
        leaked = plain in text or keyed in text
        rows.append(Row("proc", f"run_command {command}", not leaked and "exit status 0" not in text,
                        text[:120].replace("\n", " ")))
    return rows


def test_issue_7_item_3d_agent_commands_cannot_read_kiros_environment(tmp_path: Path) -> None:
    rows = proc_rows(tmp_path)
    print_table("agent commands vs /proc/<kiro pid>", rows)
    assert all(r.held for r in rows), [r for r in rows if not r.held]


# -- the table ---------------------------------------------------------------------------------------

REFUSED_ENTRIES = [
    "bash", "sh -c", "python3", "python3.12", "/usr/bin/python3", "node", "perl", "ruby", "env", "xargs",
    "find", "make", "npm test", "npx", "pip install", "pytest", "sed", "awk", "./run.sh", "scripts/build.sh",
    "git", "git config", "git submodule", "git bisect", "git rebase", "vim", "less", "tar", "ssh", "nohup",
    "timeout", "sudo", "docker",
]


def config_rows() -> list[Row]:
    rows = []
    for entry in REFUSED_ENTRIES:
        try:
            Config.model_validate({"tools": {"shell": {"enabled": True, "allow": [entry]}}})
        except ValidationError as exc:
            rows.append(Row("allow-list", f"tools.shell.allow: [{entry!r}]", "trust_agent_code" in str(exc)))
        else:
            rows.append(Row("allow-list", f"tools.shell.allow: [{entry!r}]", False, "accepted"))
    return rows


def git_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Row]:
    rows: list[Row] = []

    def attempt(area: str, tried: str, h: StepHarness, command: str,
                check: Callable[[ToolResult], bool] = lambda r: True) -> None:
        for stale in h.root.rglob("PWNED*"):
            stale.unlink()
        if (h.root / ".state").is_dir():  # kiro's own, made before a step's box runs: `kiro serve`'s token folder
            (h.root / ".state" / SERVE_FOLDER).mkdir(mode=0o700, exist_ok=True)
        before = snapshot(h.root / ".state") if (h.root / ".state").exists() else {}
        result = run(h, command)
        pwned = [p.name for p in h.root.rglob("PWNED*")] + [p.name for p in tmp_path.glob("PWNED*")]
        after = snapshot(h.root / ".state") if (h.root / ".state").exists() else {}
        held = not pwned and before == after and check(result)
        rows.append(Row(area, tried, held, f"{pwned} {result.text[:100]!r}"))

    # Not a checkout: planted repository files, for every allowed git subcommand.
    bare = shell_harness(tmp_path / "bare")
    plant_fake_repository(bare.root, "touch PWNED; false")
    for sub in ("status --short", "diff", "log", "grep x", "show"):
        attempt("git", f"planted HEAD/commondir/config.worktree, git {sub}", bare, f"git {sub}")
    monkeypatch.setenv("GIT_DIR", str(bare.root))  # even when kiro's own environment points git there
    attempt("git", "GIT_DIR in kiro's environment -> planted repo", bare, "git status")
    monkeypatch.delenv("GIT_DIR")

    # A real checkout: configuration the agent could have written outside .git/.
    repo = real_repository(tmp_path / "repo")
    home = tmp_path / "home"
    (home / ".config" / "git").mkdir(parents=True)
    (home / ".gitconfig").write_text(f'[core]\n\tfsmonitor = "touch {tmp_path}/PWNED_home; false"\n'
                                     f'[alias]\n\tstatus = "!touch {tmp_path}/PWNED_alias"\n')
    (home / ".config" / "git" / "config").write_text(
        f'[core]\n\tpager = "touch {tmp_path}/PWNED_pager"\n\thooksPath = {tmp_path}/hooks\n')
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    attempt("git", "~/.gitconfig with core.fsmonitor", repo, "git status")
    attempt("git", "~/.config/git/config with core.pager", repo, "git log")
    (repo.root / ".gitattributes").write_text("* diff=evil filter=evil\n")
    attempt("git", ".gitattributes naming diff/filter drivers", repo, "git diff")
    refused = lambda r: not r.ok and "refuses" in r.text  # noqa: E731
    attempt("git", "git diff --output=.state/x", repo, "git diff --output=.state/x", refused)
    attempt("git", "git diff --outp=.state/x (abbreviated)", repo, "git diff --outp=.state/x", refused)
    attempt("git", "git grep -O'touch PWNED' x", repo, "git grep -O'touch PWNED' x", refused)
    attempt("git", "git grep --open-files-in-pager=touch", repo, "git grep --open-files-in-pager=touch x", refused)
    attempt("git", "git diff --no-index /etc/hostname", repo, "git diff --no-index /etc/hostname a.txt", refused)
    attempt("git", "git show --ext-diff", repo, "git show --ext-diff", refused)
    attempt("git", "git push (allow-list says git status)", repo, "git push",
            lambda r: "not on the allow-list" in r.text)
    attempt("shell", "git status; touch PWNED", repo, "git status; touch PWNED",
            lambda r: "without a shell" in r.text)
    attempt("shell", "echo $(touch PWNED)", repo, "echo $(touch PWNED)")
    attempt("shell", "echo `touch PWNED`", repo, "echo `touch PWNED`")
    # A program of the same name planted in the project, with "." on PATH.
    fake_ls = repo.root / "ls"
    fake_ls.write_text(f"#!/bin/sh\ntouch {tmp_path}/PWNED_path\n")
    fake_ls.chmod(0o755)
    monkeypatch.setenv("PATH", ".:" + os.environ["PATH"])
    attempt("PATH", "./ls planted, '.' first on PATH", repo, "ls")
    return rows


def misc_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Row]:
    rows: list[Row] = []
    key = f"sk-{uuid.uuid4().hex}"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    h = shell_harness(tmp_path / "misc")

    async def call(tool: str, args: dict[str, Any]) -> ToolResult:
        return await invoke(h.tool_env(), tool, args)

    r = run(h, "cat /proc/self/environ")
    rows.append(Row("secrets", "run_command cat /proc/self/environ (its own env)", key not in r.text, r.text[:80]))
    asyncio.run(call("write_file", {"path": "leak.txt", "content": f"the key is {key}"}))
    leak = (h.root / "leak.txt").read_text()
    rows.append(Row("secrets", "write_file with the API key in it", key not in leak, leak))
    (h.root / "evil.txt").write_text("a" * 40 + "!")
    r = asyncio.run(call("search_files", {"pattern": "(a|aa)+$"}))
    rows.append(Row("redos", "search_files '(a|aa)+$' on 'a'*40+'!'", not r.ok and "gave up" in r.text, r.text[:80]))
    # Hard links: a link inside the project to kiro's state file and to a file outside.
    state = h.root / ".state" / "autonomous_loop_t1.json"
    state.parent.mkdir(exist_ok=True)
    state.write_text('{"status": "running"}')
    os.link(state, h.root / "state_link.json")
    r = asyncio.run(call("write_file", {"path": "state_link.json", "content": '{"status": "completed"}'}))
    rows.append(Row("hard link", "write_file through a hard link to .state/", state.read_text() ==
                    '{"status": "running"}', r.text[:80]))
    r = asyncio.run(call("read_file", {"path": "state_link.json"}))
    rows.append(Row("hard link", "read_file through a hard link to .state/", not r.ok and "running" not in r.text,
                    r.text[:80]))
    r = asyncio.run(call("edit_file", {"path": "state_link.json", "old": "running", "new": "completed"}))
    rows.append(Row("hard link", "edit_file through a hard link to .state/", state.read_text() ==
                    '{"status": "running"}', r.text[:80]))
    outside = tmp_path / "outside.txt"
    outside.write_text(SECRET)
    os.link(outside, h.root / "out_link.txt")
    r = asyncio.run(call("write_file", {"path": "out_link.txt", "content": "pwned"}))
    rows.append(Row("hard link", "write_file through a hard link to a file outside", outside.read_text() == SECRET,
                    r.text[:80]))
    r = asyncio.run(call("write_file", {"path": ".git", "content": "gitdir: c\n"}))
    rows.append(Row("git", "write_file .git (a gitfile) at the project root", not (h.root / ".git").exists(),
                    r.text[:80]))
    return rows


def file_rows(tmp_path: Path) -> list[Row]:
    """The file-tool escapes of tests/test_tools_confinement.py, in the same world."""
    from tests.test_tools_confinement import world as make_world

    h, outside = make_world.__wrapped__(tmp_path / "files")  # type: ignore[attr-defined]
    rows = []
    for tool, args in FILE_ESCAPES:
        args = {k: v.replace("{outside}", str(outside)) if isinstance(v, str) else v for k, v in args.items()}
        before = (snapshot(outside), snapshot(h.root))

        async def go(tool: str = tool, args: dict[str, Any] = args) -> ToolResult:
            return await invoke(h.tool_env(), tool, args)

        result = asyncio.run(go())
        held = not result.ok and SECRET not in result.text and (snapshot(outside), snapshot(h.root)) == before
        rows.append(Row("file tools", f"{tool} {args.get('path', '')!r}"[:70], held, result.text[:80]))
    return rows


def test_escapes_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    own = config_rows() + git_rows(tmp_path, monkeypatch) + misc_rows(tmp_path, monkeypatch)
    monkeypatch.undo()
    own += proc_rows(tmp_path)
    rows = own + file_rows(tmp_path)
    print_table("kiro vs a hostile agent", rows)
    assert len(own) >= 40
    escaped = [r for r in rows if not r.held]
    assert escaped == []
