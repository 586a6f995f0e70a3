"""Crash safety extends to git (SPEC §9 with P-1): SIGKILL at random points around checkpoint commits."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.crashgit import run, run_merges


@pytest.mark.slow
@pytest.mark.timeout(900)  # 50 kills and a 120-step loop: ~100 s, ~260 s at load 50 (pytest-timeout's 300 s is close)
def test_sigkill_around_commits_never_reruns_a_step_nor_leaves_half_a_commit(tmp_path: Path) -> None:
    rep = run(tmp_path / "vault", steps=120, kills=50, seed=20261122)
    ev = rep.events
    print(f"{rep.kills} kills ({rep.group_kills} with git's process group), {rep.runs} runs, {rep.seconds:.1f} s; "
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
