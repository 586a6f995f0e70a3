"""Real git repositories for tests: the git CLI, without the machine's global or system config."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update({"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0",
                "LC_ALL": "C"})
    return env


def git(cwd: Path, *args: str, check: bool = True, input: str | None = None) -> str:
    """Run git as a person would (their own name), return stdout."""
    proc = subprocess.run(["git", "-c", "user.name=Pat Person", "-c", "user.email=pat@example.com",
                           "-c", "init.defaultBranch=main", *args], cwd=cwd, env=git_env(), capture_output=True,
                          text=True, input=input)
    if check and proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr}")
    return proc.stdout


def init_repo(root: Path) -> str:
    """A repository at `root` with one commit by a person; returns its hash."""
    git(root, "init", "-q", "-b", "main")
    (root / "README.md").write_text("# project\n")
    git(root, "add", "README.md")
    git(root, "commit", "-q", "-m", "initial commit")
    return git(root, "rev-parse", "HEAD").strip()


def trailers(root: Path, rev: str) -> dict[str, str]:
    body = git(root, "log", "-1", "--format=%B", rev)
    out = {}
    for line in body.splitlines():
        if line.startswith("Kiro-") and ":" in line:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def files_in(root: Path, rev: str) -> set[str]:
    return set(git(root, "ls-tree", "-r", "--name-only", rev).split())


def changed_in(root: Path, rev: str) -> set[str]:
    return set(git(root, "show", "--format=", "--name-only", rev).split())


def fsck_problems(root: Path) -> list[str]:
    proc = subprocess.run(["git", "fsck", "--full", "--no-progress"], cwd=root, env=git_env(), capture_output=True,
                          text=True)
    lines = (proc.stdout + proc.stderr).splitlines()
    bad = [ln for ln in lines if not ln.startswith(("dangling ", "notice:", "Checking"))]
    if proc.returncode != 0:
        bad.append(f"git fsck exit {proc.returncode}")
    return bad
