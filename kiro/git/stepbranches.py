"""Worktrees and branches of steps run side by side (`parallel: N`, kiro.core.parallel), beside the loop's git.

Each attempt gets `.kiro/worktrees/<task_id>.step-<slug>` on branch `kiro/<task_id>.step-<slug>`, made from the
loop's current commit by the loop's own worktree code (`LoopGit.open`, which also mends a worktree a kill left
half added). A finished attempt's work is one commit on its branch (made even when nothing changed: the commit
is how a resumed loop knows the attempt finished). In plan order its work is then brought into the loop's tree:
git merges the branch with the loop's HEAD as objects (`merge-tree`), and exactly the files that merge changes
are written into the work tree, uncommitted; the loop's git checkpoint then commits them as the step's own
commit, as it does for a step run in place. Doing it again gives the same files, so a kill halfway through is
healed by doing it again. All functions block: call them on a worker thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiro.git.checkpoints import (
    LoopGit,
    _repo_lock,
    clear_stale_locks,
    commit_files,
    pathspec,
    scan,
    step_id_written,
    step_message,
    trailers,
)
from kiro.git.gitcli import Git, GitError
from kiro.store.events import Event

SUFFIX = ".step-"


def attempt_name(task_id: str, step_id: str) -> str:
    """`<task_id>.step-<slug>`: the worktree's folder under .kiro/worktrees and, after `kiro/`, the branch's
    name. The slug keeps a readable part of the step id and a hash of all of it (ids are free text)."""
    readable = re.sub(r"[^A-Za-z0-9_-]+", "-", step_id)[:24].strip("-")
    digest = hashlib.sha1(step_id.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{task_id}{SUFFIX}{readable + '-' if readable else ''}{digest}"


@dataclass
class Opened:
    branch: str
    worktree: Path
    project_dir: Path  # the step's project directory inside its worktree: where its attempt runs
    base: str
    events: list[Event] = field(default_factory=list)


def open_attempt(ws: Any, top: Path, project_dir: Path, task_id: str, step_id: str) -> Opened:
    """A fresh worktree and branch for an attempt at `step_id`, made from `top`'s HEAD (what a person or an
    earlier attempt left under that name is removed first)."""
    from kiro.store.state import GitInfo

    name = attempt_name(task_id, step_id)
    remove(ws, top, task_id, name)
    info = GitInfo(checkpoints=True, isolation="worktree")
    lg = LoopGit(ws, info, name, project_dir, top)
    events = lg.open(resumed=False)
    assert info.branch is not None and info.worktree is not None and info.base_commit is not None
    return Opened(info.branch, Path(info.worktree), lg.project_dir, info.base_commit, events)


def commit_attempt(top: Path, opened_tree: Path, project_rel: str, excludes: list[str], task_id: str,
                   step_id: str, title: str, iteration: int, redact: Any = None) -> str:
    """Commit what the attempt changed in its worktree (kiro's folders and the task file's copy left out) on
    its branch; the commit's trailers name the loop and the step. Returns the commit."""
    git = Git(opened_tree)
    changed = scan(git, pathspec(project_rel, excludes)).changed  # its own worktree: all of it is the step's
    msg = step_message(task_id, step_id, title, iteration, redact) + "Kiro-Side-By-Side: yes\n"
    sha = commit_files(git, sorted(changed), msg, allow_empty=True)
    assert sha is not None
    return sha


def finished_commit(top: Path, branch: str, base: str | None, task_id: str, step_id: str,
                    redact: Any = None) -> str | None:
    """The commit an attempt at `step_id` finished with on `branch`, if it got that far."""
    git = Git(top)
    proc = git.run("log", "-1", "--format=%H%x1f%B", f"refs/heads/{branch}", "--", check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        return None
    sha, _, body = proc.stdout.partition("\x1f")
    sha = sha.strip()
    t = trailers(body)
    if sha == base or t.get("Kiro-Task-Id") != task_id or t.get("Kiro-Side-By-Side") != "yes":
        return None
    return sha if t.get("Kiro-Step-Id") == step_id_written(task_id, step_id, redact) else None


def leftovers(ws: Any, top: Path, task_id: str) -> list[str]:
    """The attempt names (`<task_id>.step-...`) that have a branch or a worktree folder."""
    names = set()
    out = Git(top).run("for-each-ref", "--format=%(refname:short)", f"refs/heads/kiro/{task_id}{SUFFIX}*",
                       check=False).stdout
    names |= {line.strip()[len("kiro/"):] for line in out.splitlines() if line.strip().startswith("kiro/")}
    folder = Path(ws.root).resolve() / ".kiro" / "worktrees"
    with contextlib.suppress(OSError):
        names |= {p.name for p in folder.iterdir() if p.name.startswith(f"{task_id}{SUFFIX}")}
    return sorted(names)


def branch_tip(top: Path, name: str) -> tuple[str | None, dict[str, str]]:
    """The tip of attempt `name`'s branch and its trailers (None: no branch)."""
    proc = Git(top).run("log", "-1", "--format=%H%x1f%B", f"refs/heads/kiro/{name}", "--", check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        return None, {}
    sha, _, body = proc.stdout.partition("\x1f")
    return sha.strip(), trailers(body)


def remove(ws: Any, top: Path, task_id: str, name: str) -> bool:
    """Remove attempt `name`'s worktree and branch (only ever kiro's own: `.kiro/worktrees/<task_id>.step-*`).
    True when something was there."""
    if not name.startswith(f"{task_id}{SUFFIX}") or "/" in name or name in (".", ".."):
        return False
    main = Git(top)
    wt = Path(ws.root).resolve() / ".kiro" / "worktrees" / name
    common = str((top / main.out("rev-parse", "--git-common-dir")).resolve())
    found = False
    with _repo_lock(common):
        if wt.exists():
            found = True
            main.run("worktree", "remove", "--force", "--force", str(wt), check=False)
            if wt.exists():
                shutil.rmtree(wt, ignore_errors=True)
        main.run("worktree", "prune", check=False)
        if main.ok("rev-parse", "--verify", "-q", f"refs/heads/kiro/{name}"):
            found = True
            # a kill while git moved or deleted the branch (its commit, `worktree add -b`, this `branch -D`)
            # leaves the ref's lock behind, and git then refuses to delete the branch (a live git's: it stays)
            with contextlib.suppress(GitError):
                clear_stale_locks([Path(common) / "refs" / "heads" / "kiro" / f"{name}.lock",
                                   Path(common) / "packed-refs.lock"], [top, wt])
            main.run("branch", "-q", "-D", f"kiro/{name}", check=False)
    return found


@dataclass
class Brought:
    files: list[str] = field(default_factory=list)  # what the step changed, now in the loop's tree
    conflicts: list[str] = field(default_factory=list)  # why it could not be brought in: the files


def bring_in(top: Path, commit: str, project_rel: str, excludes: list[str], *, again: bool) -> Brought:
    """Write into `top`'s work tree what merging `commit` (an attempt's work) with HEAD changes, uncommitted.
    Conflicts: the files git cannot merge, or that hold changes of someone else's (a person's edit not yet
    committed) which the merge would overwrite. `again`: a kill may have fallen while this same commit was
    being brought in, so a file that holds the beginning of what the merge gives it is its own, half
    written: it is written again."""
    main = Git(top)
    head = main.out("rev-parse", "HEAD")
    planned = main.run("merge-tree", "--write-tree", "--name-only", "--no-messages", head, commit, check=False)
    lines = [ln for ln in planned.stdout.splitlines() if ln.strip()]
    if planned.returncode not in (0, 1) or not lines:
        raise GitError(f"`git merge-tree` failed in {top}: {(planned.stderr.strip().splitlines() or ['?'])[-1]}")
    if planned.returncode == 1:
        return Brought(conflicts=sorted(dict.fromkeys(lines[1:])))
    tree = lines[0]
    spec = pathspec(project_rel, excludes)
    changed = main.run("diff", "--name-only", "-z", "--no-renames", head, tree, "--", *spec).stdout
    paths = [p for p in changed.split("\0") if p]
    if not paths:
        return Brought()
    merged = _blobs(main, "ls-tree", "-r", "-z", tree, paths)
    theirs = _blobs(main, "ls-tree", "-r", "-z", head, paths)
    present = [p for p in paths if (top / p).is_file() or (top / p).is_symlink()]
    hashes = main.run("hash-object", "--no-filters", "--stdin-paths", input="\n".join(present) + "\n",
                      check=False).stdout.split() if present else []
    on_disk = dict(zip(present, hashes, strict=False))
    # a file git was writing for this same merge when a kill came (`again`) is missing, or holds the beginning
    # of the merge's content: git removes a file and writes it anew, in place
    touched = [p for p in paths if on_disk.get(p) not in (theirs.get(p), merged.get(p))
               and not (again and (p not in on_disk or LoopGit._torn(main, p, merged.get(p))))]
    if touched:
        return Brought(conflicts=touched)
    written = [p for p in paths if p in merged]
    if written:
        main.run("restore", f"--source={tree}", "--worktree", "--pathspec-from-file=-", "--pathspec-file-nul",
                 input="\0".join(f":(top,literal){p}" for p in written) + "\0")
    for p in paths:
        if p not in merged:  # the step removed it
            with contextlib.suppress(FileNotFoundError):
                (top / p).unlink()
    return Brought(files=paths)


def take_back(top: Path, commit: str, project_rel: str, excludes: list[str]) -> list[str]:
    """Undo what `bring_in` wrote for `commit` when the step then failed (verify said no): each file that still
    holds what the merge gave it goes back to HEAD's; a file changed since (by a person, or by verify) stays.
    Returns the files put back."""
    main = Git(top)
    head = main.out("rev-parse", "HEAD")
    planned = main.run("merge-tree", "--write-tree", "--name-only", "--no-messages", head, commit, check=False)
    lines = [ln for ln in planned.stdout.splitlines() if ln.strip()]
    if planned.returncode != 0 or not lines:
        return []  # HEAD moved on, or it never merged: nothing of it was written
    tree = lines[0]
    changed = main.run("diff", "--name-only", "-z", "--no-renames", head, tree, "--",
                       *pathspec(project_rel, excludes)).stdout
    paths = [p for p in changed.split("\0") if p]
    if not paths:
        return []
    merged = _blobs(main, "ls-tree", "-r", "-z", tree, paths)
    theirs = _blobs(main, "ls-tree", "-r", "-z", head, paths)
    present = [p for p in paths if (top / p).is_file()]
    hashes = main.run("hash-object", "--no-filters", "--stdin-paths", input="\n".join(present) + "\n",
                      check=False).stdout.split() if present else []
    on_disk = dict(zip(present, hashes, strict=False))
    ours = [p for p in paths if on_disk.get(p) == merged.get(p)]
    back = [p for p in ours if p in theirs]
    if back:
        main.run("restore", "--source=HEAD", "--worktree", "--pathspec-from-file=-", "--pathspec-file-nul",
                 input="\0".join(f":(top,literal){p}" for p in back) + "\0")
    for p in ours:
        if p not in theirs:  # the step made it
            with contextlib.suppress(FileNotFoundError):
                (top / p).unlink()
    return ours


def _blobs(main: Git, *args: Any) -> dict[str, str]:
    *cmd, paths = args
    out: dict[str, str] = {}
    for rec in main.run(*cmd, "--", *paths, check=False).stdout.split("\0"):
        meta, _, path = rec.partition("\t")
        if path:
            out[path] = meta.split()[2]
    return out
