"""Crash safety extends to git (SPEC §9 with P-1): SIGKILL at random points around checkpoint commits."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.conftest import Workspace
from tests.crashgit import run, run_merges, task_text
from tests.gitutil import init_repo


@pytest.mark.slow
@pytest.mark.timeout(900)  # 50 kills, ~60 s at load 12 (pytest-timeout's 300 s is close at load 50)
def test_sigkill_around_commits_never_reruns_a_step_nor_leaves_half_a_commit(tmp_path: Path) -> None:
    """50 kills, each mid-task: the task grows between runs to keep steps ahead of the kills (tests/crashgit.py),
    so what runs unkilled after the last one is a few steps, not most of a fixed 120-step plan."""
    rep = run(tmp_path / "vault", steps=20, kills=50, seed=20261122)
    ev = rep.events
    print(f"{rep.kills} kills ({rep.group_kills} with git's process group), {rep.runs} runs, {rep.steps} steps, "
          f"{rep.seconds:.1f} s; "
          f"aimed: {dict(rep.modes)}; recovered: {ev['step_recovered']} steps, {ev['checkpoint_recovered']} commits "
          f"found by trailers, {ev['git_lock_cleared']} stale git locks cleared")
    assert rep.problems == []
    assert rep.kills >= 50


@pytest.mark.slow
def test_sigkill_around_auto_merges_finishes_each_merge_once(tmp_path: Path) -> None:
    """Kills aimed at main's index lock, its branch ref, and random points (a kill during
    `git worktree add` once made a loop commit its half-checked-out tree as deletions)."""
    rep = run_merges(tmp_path / "vault", loops=8, seed=7)
    ev = rep.events
    print(f"{rep.kills} kills around merges ({rep.group_kills} with git's process group), {rep.runs} runs, "
          f"{rep.seconds:.1f} s; aimed: {dict(rep.modes)}; merges resumed after a torn checkout: "
          f"{ev['merge_resumed']}, stale git locks cleared: {ev['git_lock_cleared']}")
    assert rep.problems == []
    # each loop is aimed at twice, but a loop that finishes before its aimed moment is not killed (on a busy
    # machine about half the aims land): the floor only makes sure the merges were really interrupted
    assert rep.kills >= 3


def test_a_kill_inside_a_checkpoint_leaves_no_private_index_nor_its_lock(ws: Workspace) -> None:
    """A checkpoint is built in a private index, `.git/kiro-commit-<pid>-<thread>.index`, which git locks while
    it writes it: a SIGKILL there leaves both behind (the kill test above once found the lock at its end).
    The next run removes them when their pid is gone, and keeps those of a live kiro."""
    init_repo(ws.root)
    dead = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # a pid no process can have
    live = os.getpid()
    left = [ws.root / ".git" / f"kiro-commit-{pid}-1.index{end}" for pid in (dead, live) for end in ("", ".lock")]
    for p in left:
        p.write_bytes(b"DIRC")
        os.utime(p, (time.time() - 60, time.time() - 60))  # older than a git that is only starting
    ws.task(task_text(1).replace('"$CRASH_SIDE_LOG"', "/dev/null"))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "ix")
    assert r.returncode == 0, r.stdout + r.stderr
    assert [p.exists() for p in left] == [False, False, True, True], [p.name for p in left if p.exists()]
    cleared = [e["path"] for e in ws.events("ix") if e["event"] == "git_lock_cleared"]
    assert cleared == [str(left[1])], cleared
