"""A start that is refused creates nothing (issue #31 item 2): `kiro loop start` refused for any reason (bad
flags, bad config, a task file that is not there or not runnable, no executor, a loop already there, one bad
task of a batch, a refused `--detach`) says one line, exits 1, and leaves the project byte for byte as it was:
no `Specs/`, `.state/`, `Logs/` or lock file made, no task file touched. Each refusal is tried in a project
that never ran kiro, and the ones that need a loop already there in a project that has one."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.conftest import Workspace

PLAN = "- [ ] 1. Build\n  ```sh\n  echo built >> built.log\n  ```\n- [ ] 2. Ship\n  ```sh\n  echo shipped\n  ```\n"
NO_COMMAND = "- [ ] 1. A step for an agent, with no command\n"


def snapshot(root: Path) -> dict[str, tuple[str, bytes | str, int]]:
    """Every entry under `root`: its kind, bytes (or link target) and mode. Of `.git/`, only the ignore file kiro
    writes to (`info/exclude`): git itself refreshes its index when asked for the status."""
    found: dict[str, tuple[str, bytes | str, int]] = {}
    for top, dirs, files in os.walk(root):
        if Path(top) == root / ".git":
            dirs[:] = ["info"] if "info" in dirs else []
            files = []
        for name in [*dirs, *files]:
            p = Path(top) / name
            st = os.lstat(p)
            rel = p.relative_to(root).as_posix()
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("link", os.readlink(p), st.st_mode)
            elif stat.S_ISDIR(st.st_mode):
                found[rel] = ("dir", b"", st.st_mode)
            else:
                found[rel] = ("file", p.read_bytes(), st.st_mode)
    return found


def project(tmp_path: Path, config: str | None = None) -> Workspace:
    root = tmp_path / "project"
    (root / ".kiro/specs/auth").mkdir(parents=True)
    (root / ".kiro/specs/auth/tasks.md").write_text(NO_COMMAND)
    (root / "plan.md").write_text(PLAN)
    (root / "nocmd.md").write_text(NO_COMMAND)
    if config is not None:
        (root / "config").mkdir()
        (root / "config/autonomous_loop.yaml").write_text(config)
    return Workspace(root)


FRESH = {  # refusal: (config file, task file text for plan.md or None, arguments)
    "unknown spec": (None, None, ["--spec", "nope"]),
    "missing task file": (None, None, ["--task", "missing.md"]),
    "nothing named": (None, None, []),
    "a folder as the task": (None, None, ["--task", ".kiro"]),
    "no executor for the step": (None, None, ["--spec", "auth"]),
    "bad --executor": (None, None, ["--task", "plan.md", "--executor", "bogus"]),
    "bad --agent": (None, None, ["--task", "plan.md", "--agent", "bogus"]),
    "bad --max-iterations": (None, None, ["--task", "plan.md", "--max-iterations", "0"]),
    "bad --task-id": (None, None, ["--task", "plan.md", "--task-id", "../x"]),
    "bad --step": (None, None, ["--task", "plan.md", "--step", "9"]),
    "bad --sandbox": (None, None, ["--task", "plan.md", "--sandbox", "box"]),
    "sandbox asked for, bwrap not there": (None, None, ["--task", "plan.md", "--sandbox", "bwrap"]),
    "config: unknown key": ("max_iterationz: 3\n", None, ["--task", "plan.md"]),
    "config: project_dir missing": ("project_dir: nope\n", None, ["--task", "plan.md"]),
    "config: sandbox path missing": ("sandbox_paths: {rw: [/nonexistent/kiro]}\n", None, ["--task", "plan.md"]),
    "config: checkpoints without git": ("checkpoints: git\n", None, ["--task", "plan.md"]),
    "config: temporal without git": ("backend: {kind: temporal, address: '127.0.0.1:1'}\n", None,
                                     ["--task", "plan.md"]),
    "frontmatter: bad schedule": (None, "---\nschedule: bogus\n---\n" + PLAN, ["--task", "plan.md"]),
    "frontmatter: bad kiro_task_id": (None, "---\nkiro_task_id: ../x\n---\n" + PLAN, ["--task", "plan.md"]),
    # refused once the executor is being made (the start guard was taken): left .state/.start.lock before
    "openai without an API key": (None, None, ["--task", "plan.md", "--executor", "openai"]),
    "command without an agent": (None, None, ["--task", "plan.md", "--executor", "command"]),
    "agent CLI not installed": (None, None, ["--task", "plan.md", "--agent", "claude", "--sandbox", "off"]),
    # a batch whose second task is refused: made the first task's loop before
    "batch with one bad task": (None, None, ["--task", "plan.md", "--task", "nocmd.md"]),
    "batch, bad task first": (None, None, ["--task", "nocmd.md", "--task", "plan.md"]),
    # --detach: the background start is refused: left Logs/<id>.out before
    "--detach refused": (None, None, ["--task", "plan.md", "--executor", "openai", "--detach"]),
}

WITH_A_LOOP = {  # refusals in a project where a loop already ran (and stopped at its cap)
    "already an unfinished loop": ["--task", "plan.md"],
    "task id taken": ["--task", "nocmd.md", "--task-id", "first", "--executor", "shell"],
    "--detach, task id taken": ["--task", "nocmd.md", "--task-id", "first", "--detach"],
    "openai without an API key": ["--task", "nocmd.md", "--executor", "openai"],
    "batch with one bad task": ["--task", "nocmd.md", "--task", "plan.md"],
}


ENV = {"sandbox asked for, bwrap not there": {"PATH": "/nonexistent"},  # kiro runs as sys.executable
       "agent CLI not installed": {"PATH": "/nonexistent"}}


def refused(ws: Workspace, args: list[str], what: str) -> None:
    before = snapshot(ws.root)
    r = ws.kiro("loop", "start", *args, env=ws.env(**ENV.get(what, {})))
    print(f"{what}: exit {r.returncode}: {r.stderr.strip()}")
    assert r.returncode == 1, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    after = snapshot(ws.root)
    assert after == before, {k: after.get(k, "(gone)") for k in set(after) ^ set(before) | {
        k for k in after if k in before and after[k] != before[k]}}


@pytest.mark.parametrize("what", list(FRESH))
def test_a_refused_start_in_a_new_project_creates_nothing(tmp_path: Path, what: str) -> None:
    config, plan, args = FRESH[what]
    ws = project(tmp_path, config)
    if plan is not None:
        (ws.root / "plan.md").write_text(plan)
    refused(ws, args, what)


@pytest.mark.parametrize("what", list(WITH_A_LOOP))
def test_a_refused_start_beside_a_loop_changes_nothing(tmp_path: Path, what: str) -> None:
    ws = project(tmp_path)
    r = ws.kiro("loop", "start", "--task", "plan.md", "--task-id", "first", "--max-iterations", "1")
    assert r.returncode == 4, r.stdout + r.stderr
    refused(ws, WITH_A_LOOP[what], what)


IN_GIT = {  # refusals in a git repository, where a first start writes kiro's block into .git/info/exclude
    "batch with one bad task": ["--task", "plan.md", "--task", "nocmd.md"],
    "openai without an API key": ["--task", "plan.md", "--executor", "openai"],
    "no executor for the step": ["--spec", "auth"],
}


@pytest.mark.parametrize("what", list(IN_GIT))
def test_a_refused_start_in_a_git_repository_adds_nothing_to_git_either(tmp_path: Path, what: str) -> None:
    from tests.gitutil import init_repo

    ws = project(tmp_path)
    init_repo(ws.root)
    refused(ws, IN_GIT[what], what)
    r = ws.kiro("loop", "start", "--task", "plan.md")  # a start that is not refused writes the block
    assert r.returncode == 0 and "kept kiro's own folders out of git commits" in r.stdout + r.stderr, r.stderr
