"""A step worker's fetch of the loop's branch (kiro.temporal.attempt._fetch_branch). A fetch that failed
for any reason used to read as "the branch is not on the remote yet", so the attempt started from the
loop's base commit. It ran the step on old files, and then its push was refused, so the step ran again
(the five-loop kill test, 1 run in 4 here: two attempts on one worker met on the clone's refs)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kiro.git import gitcli
from kiro.temporal.attempt import _fetch_branch


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    remote, seed, clone = tmp_path / "remote.git", tmp_path / "seed", tmp_path / "clone"
    _git(tmp_path, "init", "-q", "--bare", str(remote))
    _git(tmp_path, "init", "-q", str(seed))
    _git(seed, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "base")
    _git(seed, "push", "-q", str(remote), "HEAD:refs/heads/main", "HEAD:refs/heads/kiro/t1")
    _git(tmp_path, "clone", "-q", str(remote), str(clone))
    return clone


def test_the_branch_on_the_remote_is_fetched_and_a_missing_one_says_so(clone: Path) -> None:
    main = gitcli.Git(clone)
    assert _fetch_branch(main, "kiro/t1", "refs/remotes/origin/kiro/t1") is True
    assert main.ok("rev-parse", "--verify", "-q", "refs/remotes/origin/kiro/t1")
    assert _fetch_branch(main, "kiro/t2", "refs/remotes/origin/kiro/t2") is False  # the loop's first step


def test_a_fetch_that_fails_is_an_error_not_a_start_from_the_base_commit(clone: Path) -> None:
    main = gitcli.Git(clone)
    _git(clone, "remote", "set-url", "origin", str(clone.parent / "gone.git"))  # the remote cannot be read
    with pytest.raises(gitcli.GitError, match="fetch of kiro/t1 failed"):
        _fetch_branch(main, "kiro/t1", "refs/remotes/origin/kiro/t1")
