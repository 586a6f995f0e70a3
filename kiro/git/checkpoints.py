"""Git checkpoints, rollback and isolated worktrees (SPEC §9), beside the engine.

kiro drives the real `git` program through kiro.git.gitcli alone (no GIT_* variable, config, hook or helper
program of the machine; never a look into another repository).

A checkpoint holds the files its step changed, and no other (see `LoopGit._ours`): not a person's
uncommitted work, not another loop's in the same work tree.

Crash safety. The engine calls `step_completed` after the step's box is checked and before the
state records the step. A kill in between leaves the state's current step `in_progress` with its
box checked, which the engine's reconcile treats as "the step succeeded, its checkpoint may be
pending": it calls `step_completed(recovering=True)`, which first looks for a commit already made
for that step (trailers `Kiro-Task-Id`, `Kiro-Step-Id`, `Kiro-Iteration`) and only commits when
none exists. Git itself writes objects before it moves a ref, so a kill leaves either no commit or
a whole one; what a kill can leave behind is a lock file (`index.lock`, `HEAD.lock`, a ref's
`.lock`), which is removed only when no live process holds it (see `clear_stale_locks`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiro import timeutil
from kiro.errors import KiroError, UserError
from kiro.fs.atomic import atomic_write
from kiro.fs.locks import process_exists
from kiro.git.gitcli import Git, GitError, git_env, toplevel
from kiro.store import events as ev
from kiro.store.workspace import locate_task

LOCK_WAIT_SECONDS = 30.0
LOCK_MIN_AGE = 1.0  # a lock younger than this may belong to a git that is only starting

# Folders of the workspace kiro owns or a person steers loops with; never in a checkpoint. Of `.kiro/`, only the
# loops' worktrees are kiro's: a Kiro spec's files (`.kiro/specs/`, `.kiro/steering/`) are the project's, and a
# checkpoint carries the boxes kiro checked in a spec's tasks.md.
_KIRO_NAMES = ("Specs", "Done", "Needs_Action", "Pending_Approval", "Approved", "Rejected", "Logs", ".hooks",
               ".kiro/worktrees",
               "Dashboard.md")

_lock = threading.Lock()
_repo_locks: dict[str, threading.Lock] = {}


def _repo_lock(common_dir: str) -> threading.Lock:
    """One lock per repository for this process: parallel loops in one process take turns at the
    shared files (refs, the main tree's index) instead of failing on git's own lock files."""
    with _lock:
        return _repo_locks.setdefault(common_dir, threading.Lock())




# -- commit messages and trailers ------------------------------------------------------------


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def step_message(task_id: str, step_id: str, title: str, iteration: int,
                 redact: Callable[[str], str] | None = None) -> str:
    """A step's commit message; `redact` (the run's redactor): a secret in a step's title or text
    reaches no commit."""
    sid = _one_line(step_id)
    head = f"kiro({task_id}): {sid}"
    t = _one_line(title)
    if t and t != sid:
        head += f" {t}"
    msg = (f"{_one_line(head, 250)}\n\nKiro-Task-Id: {task_id}\nKiro-Step-Id: {sid}\n"
           f"Kiro-Iteration: {iteration}\n")
    return redact(msg) if redact is not None else msg


def step_id_written(task_id: str, step_id: str, redact: Callable[[str], str] | None = None) -> str:
    """The `Kiro-Step-Id` trailer `step_message` writes for this step (after `redact`): what a look for
    the commit of a step compares."""
    return trailers(step_message(task_id, step_id, "", 0, redact)).get("Kiro-Step-Id", "")


def trailers(body: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in body.splitlines():
        m = re.match(r"^(Kiro-[A-Za-z-]+):\s?(.*)$", line)
        if m:
            found[m.group(1)] = m.group(2).strip()
    return found


@dataclass
class Commit:
    sha: str
    trailers: dict[str, str]
    subject: str


def log(git: Git, rev_range: str, *, grep: str | None = None, limit: int | None = None) -> list[Commit]:
    args = ["log", "--format=%H%x1f%B%x1e"]
    if grep:
        args += ["-F", f"--grep={grep}"]
    if limit:
        args.append(f"-n{limit}")
    proc = git.run(*args, rev_range, "--", check=False)
    if proc.returncode != 0:
        return []
    commits = []
    for rec in proc.stdout.split("\x1e"):
        rec = rec.strip("\n")
        if not rec:
            continue
        sha, _, body = rec.partition("\x1f")
        commits.append(Commit(sha.strip(), trailers(body), body.split("\n", 1)[0]))
    return commits


# -- stale locks -------------------------------------------------------------------------------


def _holders(lock: Path, roots: Sequence[Path]) -> bool:
    """Is a live process (not this one) holding `lock` open, or a git process working in one of
    `roots`? Linux /proc; elsewhere only the lock's age decides."""
    proc_dir = Path("/proc")
    if not proc_dir.is_dir():
        return False
    me = os.getpid()
    target = str(lock)
    prefixes = [str(r) for r in roots]
    for entry in os.scandir(proc_dir):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        base = entry.path
        try:
            comm = Path(base, "comm").read_text().strip()
        except OSError:
            continue
        if comm.startswith("git"):
            try:
                cwd = os.readlink(os.path.join(base, "cwd"))
            except OSError:
                cwd = ""
            if cwd and any(cwd == p or cwd.startswith(p + os.sep) for p in prefixes):
                return True
        try:
            fds = os.listdir(os.path.join(base, "fd"))
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                if os.readlink(os.path.join(base, "fd", fd)) == target:
                    return True
    return False


def clear_stale_locks(locks: Sequence[Path], roots: Sequence[Path], *, wait: float = LOCK_WAIT_SECONDS) -> list[str]:
    """Remove git lock files whose owner is dead (a kill mid-commit leaves them behind); wait for
    a live owner to finish. Returns the locks removed; GitError when a live owner keeps one past
    `wait`."""
    removed: list[str] = []
    deadline = time.monotonic() + wait
    for lock in locks:
        while True:
            try:
                age = time.time() - lock.stat().st_mtime
            except FileNotFoundError:
                break
            if _holders(lock, roots):
                if time.monotonic() > deadline:
                    raise GitError(f"{lock} is held by a running git for more than {wait:g} s; try again later")
                time.sleep(0.05)
                continue
            if age < LOCK_MIN_AGE and time.monotonic() < deadline:
                time.sleep(LOCK_MIN_AGE - age + 0.01)
                continue
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()
                removed.append(str(lock))
            break
    return removed


# -- one loop ----------------------------------------------------------------------------------


@dataclass
class Result:
    """What a git action did: the commit (if any), why not, and events for the engine to emit."""

    commit: str | None = None
    note: str | None = None
    events: list[ev.Event] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    problem: str | None = None  # a merge that needs a person


def kiro_paths(ws: Any, top: Path) -> list[str]:
    """The workspace's own folders, relative to the repository's top, that lie inside it."""
    root = Path(ws.root).resolve()
    candidates = [root / name for name in _KIRO_NAMES]
    candidates += [Path(ws.state_dir).resolve(), root / ".state", root / "config" / "autonomous_loop.yaml"]
    out: list[str] = []
    for p in candidates:
        try:
            rel = p.resolve().relative_to(top)
        except ValueError:
            continue
        s = rel.as_posix()
        if s in ("", ".") or s in out:
            continue
        out.append(s)
    return out


def pathspec(project_rel: str, excludes: Sequence[str]) -> list[str]:
    spec = [f":(top,literal){project_rel}" if project_rel not in ("", ".") else ":/"]
    spec += [f":(top,exclude,literal){e}" for e in excludes]
    return spec


Fingerprint = tuple[int, int, int, int, int] | None  # inode, size, mtime, ctime, mode; None: no file there


def _fingerprint(path: Path) -> Fingerprint:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)


@dataclass
class Scan:
    """The project's files that differ from HEAD (staged or not, untracked too), each with its fingerprint;
    and the folders that hold another repository (a nested `.git`, a submodule): never recorded, never
    looked into."""

    changed: dict[str, Fingerprint] = field(default_factory=dict)
    nested: list[str] = field(default_factory=list)


def scan(git: Git, spec: Sequence[str]) -> Scan:
    """What `git status` says differs in `spec`, paths from the top of `git`'s work tree. git lists a
    nested repository as its folder (`sub/`) and never descends into it (`--ignore-submodules=all`, by
    `command`); a path that is a folder here is one too (a gitlink)."""
    out = git.run("status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames", "--", *spec).stdout
    found = Scan()
    for rec in out.split("\0"):
        if len(rec) < 4:
            continue
        path = rec[3:]
        full = git.cwd / path
        if path.endswith("/") or (full.is_dir() and not full.is_symlink()):
            found.nested.append(path.rstrip("/"))
            continue
        found.changed[path] = _fingerprint(full)
    return found


def commit_files(git: Git, paths: Sequence[str], message: str, *, allow_empty: bool = False) -> str | None:
    """Commit exactly `paths` (from the top of `git`'s work tree; each as it is in the work tree now, or
    removed when gone) on top of HEAD, and nothing else: built in a private index (`update-index`, no
    porcelain: nothing recurses into another repository), committed with `commit-tree`, HEAD moved only
    if it did not move meanwhile; then the work tree's own index takes those paths as committed (the rest
    of it, what a person staged, stays). Returns the commit, or None when it would change nothing."""
    lines = git.run("rev-parse", "--absolute-git-dir", "HEAD", "HEAD^{tree}", check=False).stdout.split()
    gitdir = Path(lines[0]) if lines else Path(git.out("rev-parse", "--absolute-git-dir"))
    head, head_tree = (lines[1], lines[2]) if len(lines) == 3 else (None, None)  # None: no commit yet
    tmp = gitdir / f"kiro-commit-{os.getpid()}-{threading.get_ident()}.index"
    private = Git(git.cwd, {**git.env, "GIT_INDEX_FILE": str(tmp)})
    try:
        private.run("read-tree", *((head,) if head else ("--empty",)))
        if paths:
            private.run("update-index", "--add", "--remove", "-z", "--stdin", input="\0".join(paths) + "\0")
        tree = private.out("write-tree")
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    if not allow_empty and head is not None and tree == head_tree:
        return None
    sha = git.run("commit-tree", tree, *(("-p", head) if head else ()), "-F", "-", commit=True,
                  input=message).stdout.strip()
    git.run("update-ref", "-m", "kiro: checkpoint", "HEAD", sha, head or "0" * 40)
    if paths:  # the index follows HEAD for these paths (no work-tree read: `reset -q` refreshes nothing)
        git.run("reset", "-q", sha, "--pathspec-from-file=-", "--pathspec-file-nul",
                input="\0".join(f":(top,literal){p}" for p in paths) + "\0")
    return sha


def commit_index(git: Git, message: str, parents: Sequence[str]) -> str:
    """Commit the work tree's index as it is (a revert or a merge staged it) on `parents`, and move HEAD
    there (only from `parents[0]`). No porcelain: nothing runs, nothing looks into another repository."""
    tree = git.out("write-tree")
    sha = git.run("commit-tree", tree, *(a for p in parents for a in ("-p", p)), "-F", "-", commit=True,
                  input=message).stdout.strip()
    git.run("update-ref", "-m", "kiro: commit", "HEAD", sha, parents[0])
    return sha


def msg_of_merge(task_id: str, branch: str) -> str:
    return f"kiro({task_id}): merge {branch}\n\nKiro-Task-Id: {task_id}\nKiro-Merge: {branch}\n"


MARGIN_NS = 50_000_000  # a file's ctime comes from a coarse clock: up to a tick before the time kiro read
WINDOW_KEEP_NS = 12 * 3600 * 10**9  # another loop's attempts older than this can no longer overlap a step
WINDOW_KEEP = 1000  # nor more than this many of them


def _orphaned(pid: str) -> bool:
    """Whether a file named after process `pid` (a git kiro ran) outlived it: no such process is running."""
    return not (pid.isdigit() and Path("/proc", pid).exists())


class LoopGit:
    """Checkpoints (and the worktree, with isolation) of one loop. Built by `attach`; all methods
    are blocking, for a worker thread."""

    def __init__(self, ws: Any, info: Any, task_id: str, project_dir: Path, top: Path) -> None:
        self.ws = ws
        self.info = info  # the state's GitInfo: this object keeps it current, the engine saves it
        self.task_id = task_id
        self.main_top = top
        self.project_rel = "" if project_dir.resolve() == top else project_dir.resolve().relative_to(top).as_posix()
        self.excludes = kiro_paths(ws, top)
        self.spec = pathspec(self.project_rel, self.excludes)
        self.tree = Path(info.worktree) if info.worktree else top
        self.git = Git(self.tree)
        self._locks: list[Path] = []
        self._common = ""
        self.redact: Callable[[str], str] | None = None  # the run's redactor (Engine._open_git): commit messages
        # the step under way (see `attempt_started`): the changed files when it began, its attempts' times,
        # the loop's own task file and the files kiro itself wrote for it (a step run side by side)
        self._before: dict[str, Fingerprint] | None = None
        self._attempts: list[list[int | None]] = []
        self._own: str | None = None
        self._step: str | None = None

    # -- setup -------------------------------------------------------------------------------

    @property
    def project_dir(self) -> Path:
        return self.tree / self.project_rel if self.project_rel else self.tree

    def _paths(self) -> None:
        git = self.git
        branch_ref = f"refs/heads/{self.info.branch}.lock" if self.info.branch else "HEAD.lock"
        lines = git.out("rev-parse", "--git-common-dir", "--git-path", "index.lock", "--git-path", "HEAD.lock",
                        "--git-path", branch_ref).splitlines()
        self._common = str((self.tree / lines[0]).resolve())
        self._locks = [(self.tree / p).resolve() for p in lines[1:]]

    def _clear_locks(self, events: list[ev.Event], extra: Sequence[Path] = ()) -> None:
        roots = [self.tree, self.main_top, Path(self._common)]
        temp = []  # `git commit -- <paths>` builds its commit in next-index-<pid>.lock; a kill leaves it behind
        for folder in {p.parent for p in [*self._locks[:1], *extra[:1]]}:
            temp += [p for p in folder.glob("next-index-*.lock") if _orphaned(p.name[len("next-index-"):-len(".lock")])]
            # commit_files' private index kiro-commit-<pid>-<thread>.index, and its .lock while git writes it
            for p in folder.glob("kiro-commit-*.index*"):
                if not _orphaned(p.name.split("-")[2]):
                    continue
                if p.name.endswith(".index.lock"):
                    temp.append(p)
                elif p.name.endswith(".index"):  # not a lock: only left behind
                    with contextlib.suppress(FileNotFoundError):
                        p.unlink()
        for path in clear_stale_locks([*self._locks, *extra, *temp], roots):
            events.append(ev.GitLockCleared(path=path))

    def open(self, resumed: bool) -> list[ev.Event]:
        """Ready the loop's work tree: record where commits go; with isolation, create (or find
        again) `.kiro/worktrees/<task_id>` on branch `kiro/<task_id>`."""
        events: list[ev.Event] = []
        info = self.info
        main = Git(self.main_top)
        head = main.run("rev-parse", "--verify", "-q", "HEAD", check=False).stdout.strip() or None
        branch = main.run("symbolic-ref", "-q", "--short", "HEAD", check=False).stdout.strip() or None
        if info.toplevel is None:
            info.toplevel = str(self.main_top)
            info.project_rel = self.project_rel
            info.base_commit = head
            info.base_branch = branch
            info.branch = branch
        if info.isolation == "worktree":
            if head is None and info.worktree is None:
                raise UserError(f"isolation: worktree needs a commit to branch from; {self.main_top} has none yet "
                                f"(make a first commit, or set isolation: none)")
            wt = Path(self.ws.root).resolve() / ".kiro" / "worktrees" / self.task_id
            name = f"kiro/{self.task_id}"
            info.branch = name
            self.tree = wt
            self.git = Git(wt)
            if self._half_added(wt):
                events.append(ev.WorktreeRecreated(path=self.ws.relative(wt), branch=name))
            if not (wt / ".git").exists() or not Git(wt).ok("rev-parse", "--verify", "-q", "HEAD"):
                common = str((self.main_top / main.out("rev-parse", "--git-common-dir")).resolve())
                with _repo_lock(common):
                    # a kill during `worktree add -b` can leave the new branch's ref lock behind
                    for path in clear_stale_locks([Path(common) / "refs" / "heads" / f"{name}.lock",
                                                   Path(common) / "packed-refs.lock"], [self.main_top, wt]):
                        events.append(ev.GitLockCleared(path=path))
                    main.run("worktree", "prune", check=False)
                    if wt.exists() and not any(wt.iterdir()):
                        wt.rmdir()
                    elif wt.exists():
                        if info.worktree is not None and (wt / ".git").exists():
                            raise GitError(f"the loop's worktree {wt} is broken (its HEAD cannot be read); repair "
                                           f"it with `git worktree repair`, or move it away, then resume")
                        import shutil  # a worktree a kill left half-made: nothing of the agent's is in it yet

                        shutil.rmtree(wt)
                        main.run("worktree", "prune", check=False)
                    wt.parent.mkdir(parents=True, exist_ok=True)
                    if main.ok("rev-parse", "--verify", "-q", f"refs/heads/{name}"):
                        main.run("worktree", "add", "-q", str(wt), name)
                    else:
                        main.run("worktree", "add", "-q", "-b", name, str(wt), info.base_commit or "HEAD")
                events.append(ev.WorktreeCreated(path=self.ws.relative(wt), branch=name))
            info.worktree = str(wt)
        self._paths()
        self._clear_locks(events)
        return events

    def _half_added(self, wt: Path) -> bool:
        """A kill during `git worktree add` leaves a work tree whose HEAD reads but whose checkout
        stopped part-way (a step committed there would record the missing files as deleted, and
        the merge would delete them from main), or only git's record of a worktree that has no
        HEAD or no folder yet (a later add is refused: "missing but locked worktree"). git marks a
        worktree being added as locked with the reason "initializing" until its checkout is done;
        such a one, once no git works in it, is removed for `open` to add it again. Nothing of the
        agent's is in it: no step runs before the add finished."""
        main = Git(self.main_top)
        common = (self.main_top / main.out("rev-parse", "--git-common-dir")).resolve()
        admins: set[Path] = set()
        dotgit = wt / ".git"
        with contextlib.suppress(OSError):
            text = dotgit.read_text(errors="replace") if dotgit.is_file() else ""
            if text.startswith("gitdir:"):
                admins.add((wt / text.split(":", 1)[1].strip()).resolve())
        with contextlib.suppress(OSError):
            for entry in (common / "worktrees").iterdir():
                with contextlib.suppress(OSError):
                    if Path((entry / "gitdir").read_text(errors="replace").strip()).resolve() == dotgit.resolve():
                        admins.add(entry.resolve())
        torn = []
        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        for admin in admins:
            locked = admin / "locked"
            while True:
                try:
                    reason = locked.read_text(errors="replace").strip()
                except OSError:
                    break  # not locked (or the add just finished)
                if reason != "initializing":
                    break  # a person's own `git worktree lock`: theirs to undo
                if not _holders(locked, [wt, admin]):
                    torn.append(locked)
                    break
                if time.monotonic() > deadline:
                    raise GitError(f"a git has been adding the loop's worktree {wt} for more than "
                                   f"{LOCK_WAIT_SECONDS:g} s; try again later")
                time.sleep(0.05)
        if not torn:
            return False
        import shutil

        for locked in torn:
            locked.unlink(missing_ok=True)
        shutil.rmtree(wt, ignore_errors=True)
        main.run("worktree", "prune", check=False)
        return True

    # -- checkpoints -------------------------------------------------------------------------

    def find(self, step_id: str, iteration: int) -> str | None:
        """The commit already made for this step in this iteration (a kill fell after the commit
        and before the state recorded it)."""
        since = self.info.base_commit
        rng = f"{since}..HEAD" if since else "HEAD"
        written = step_id_written(self.task_id, step_id, self.redact)
        for c in log(self.git, rng, grep=f"Kiro-Task-Id: {self.task_id}", limit=500):
            t = c.trailers
            if (t.get("Kiro-Task-Id") == self.task_id and t.get("Kiro-Step-Id") == written
                    and t.get("Kiro-Iteration") == str(iteration)):
                return c.sha
        return None

    # -- which files a step changed ------------------------------------------------------------
    #
    # Loops may share a work tree (`watch` runs several; so do two terminals), and a person works in it too.
    # A step's checkpoint holds what that step changed, and only that: the files whose state differs from
    # the one they had when the step began (`_before`), changed while one of its attempts ran (their
    # ctime, which no program can set back, within an attempt's time) and not while another loop's attempt
    # ran in the same work tree (`_others`, from `<git common dir>/kiro/steps/`, read-only in the box).
    # A file that already held uncommitted changes when the step began is a person's (or another loop's):
    # never committed by kiro. A file two loops' steps may both have changed is left for a person, and the
    # event says so: kiro cannot tell which of them wrote it.

    def _steps_dir(self) -> Path:
        return Path(self._common) / "kiro" / "steps"

    def attempt_started(self, step_id: str, task_file: Path | None = None) -> None:
        """An attempt at `step_id` begins (the step's first: its files are noted as they are now)."""
        if self._step != step_id and self._before is not None:
            self._retire()  # the last step ended without a checkpoint (it failed, or the loop moved on)
        now = time.time_ns()
        if task_file is not None:
            with contextlib.suppress(ValueError, OSError):
                self._own = task_file.resolve().relative_to(self.tree.resolve()).as_posix()
        if self._attempts and self._attempts[-1][1] is None:
            self._attempts[-1][1] = now  # an attempt that never reported its end
        if self._before is None:
            rec = self._record()
            if (rec.get("step") == step_id and not process_exists(int(rec.get("pid") or 0))
                    and rec.get("pid") != os.getpid()):
                self._recover(step_id)  # a kill cut this step short: what it wrote then is the step's still
                for a in self._attempts:
                    a[1] = a[1] or now
        if self._before is None:
            try:
                self._before = scan(self.git, self.spec).changed
            except GitError:
                return
            self._step = step_id
        self._attempts.append([now, None])
        self._publish()

    def attempt_ended(self) -> None:
        if self._attempts and self._attempts[-1][1] is None:
            self._attempts[-1][1] = time.time_ns()
            self._publish()

    def _record(self) -> dict[str, Any]:
        try:
            rec = json.loads((self._steps_dir() / f"{self.task_id}.json").read_text())
            return rec if isinstance(rec, dict) else {}
        except (OSError, ValueError):
            return {}

    def _publish(self, past: Sequence[list[int | None]] = ()) -> None:
        """This loop's step, for the other loops of this work tree to read (and for itself after a restart)."""
        if not self._common:
            return
        keep = time.time_ns() - WINDOW_KEEP_NS
        old = [w for w in self._record().get("past", []) if isinstance(w, list) and len(w) == 2 and (w[1] or 0) > keep]
        record = {"pid": os.getpid(), "tree": str(self.tree.resolve()), "own": self._own, "step": self._step,
                  "before": self._before, "attempts": self._attempts, "past": [*old, *past][-WINDOW_KEEP:]}
        with contextlib.suppress(OSError):
            self._steps_dir().mkdir(parents=True, exist_ok=True)
            atomic_write(self._steps_dir() / f"{self.task_id}.json", json.dumps(record).encode())

    def _retire(self) -> None:
        """The step is over: its attempts stay (as past) for the loops whose steps overlapped it."""
        now = time.time_ns()
        done = [[s, e or now] for s, e in self._attempts]
        self._before, self._attempts, self._step = None, [], None
        self._publish(done)

    def _recover(self, step_id: str) -> None:
        """After a restart: the step's files and attempts as the run that was killed noted them."""
        rec = self._record()
        if self._before is None and rec.get("step") == step_id and isinstance(rec.get("before"), dict):
            self._before = {k: tuple(v) if v else None for k, v in rec["before"].items()}
            self._attempts = [[int(s), int(e) if e else None] for s, e in rec.get("attempts", [])]
            self._step = step_id
            self._own = rec.get("own") or self._own

    def _others(self) -> tuple[list[tuple[str, int, int]], set[str]]:
        """The other loops' attempts in this work tree (task id, start, end) and their task files."""
        spans: list[tuple[str, int, int]] = []
        files: set[str] = set()
        now = time.time_ns()
        me = str(self.tree.resolve())
        with contextlib.suppress(OSError):
            for path in self._steps_dir().glob("*.json"):
                if path.stem == self.task_id:
                    continue
                try:
                    rec = json.loads(path.read_text())
                    if rec.get("tree") != me:
                        continue
                    alive = process_exists(int(rec.get("pid", 0)))
                    stamp = path.stat().st_mtime_ns
                    if rec.get("own"):
                        files.add(str(rec["own"]))
                    for start, end in [*rec.get("past", []), *rec.get("attempts", [])]:
                        # an attempt still open: running until now, or, its loop dead, until it last wrote
                        spans.append((path.stem, int(start), int(end) if end else (now if alive else stamp)))
                except (OSError, ValueError, TypeError):
                    continue
        return spans, files

    def _changed_at(self, path: str) -> int:
        """When `path` last changed: its ctime, or for a file removed, its nearest folder's."""
        full = self.tree / path
        while True:
            try:
                return os.lstat(full).st_ctime_ns
            except OSError:
                if full == self.tree or full.parent == full:
                    return 0
                full = full.parent

    def _ours(self, now: Scan) -> tuple[list[str], dict[str, list[str]]]:
        """The step's files, and the files left out, by why."""
        before = self._before
        left: dict[str, list[str]] = {}
        if now.nested:
            left["another repository (never recorded nor looked into by kiro)"] = now.nested
        ours: list[str] = []
        spans, others_files = self._others()
        end = time.time_ns()
        mine = [(s or 0, e or end) for s, e in self._attempts]
        for path, fp in now.changed.items():
            if before is not None and path in before and before[path] == fp:
                continue  # as it was when the step began: not the step's
            if path == self._own:  # the loop's task file: the box kiro checked
                if before is not None and path in before:
                    left.setdefault("held uncommitted changes before the step", []).append(path)
                else:
                    ours.append(path)
                continue
            if before is None:
                left.setdefault("changed while kiro did not watch (a restart)", []).append(path)
                continue
            if path in before:
                left.setdefault("held uncommitted changes before the step", []).append(path)
                continue
            if path in others_files:
                left.setdefault("another loop's task file", []).append(path)
                continue
            at = self._changed_at(path)
            during = any(s - MARGIN_NS <= at <= e + MARGIN_NS for s, e in mine)
            also = sorted({t for t, s, e in spans if s - MARGIN_NS <= at <= e + MARGIN_NS})
            if during and not also:
                ours.append(path)
            elif during:
                left.setdefault(f"changed while a step of loop {', '.join(also)} also ran", []).append(path)
            else:
                left.setdefault("changed while no attempt of this step ran (a person's edit?)", []).append(path)
        return sorted(ours), left

    def step_completed(self, step_id: str, title: str, iteration: int, *, recovering: bool = False) -> Result:
        """Commit the files the step changed (see above); no commit when it changed none."""
        res = Result()
        try:
            # one commit at a time per index: loops sharing a work tree take turns, worktrees do not wait
            with _repo_lock(str(self._locks[0].parent)):
                self._clear_locks(res.events)
                if recovering:
                    found = self.find(step_id, iteration)
                    if found:
                        res.commit = found
                        res.events.append(ev.CheckpointRecovered(step_id=step_id, commit=found))
                        # a kill may have come before the index took the commit's files: it takes them now
                        paths = [p for p in self.git.run("diff-tree", "--no-commit-id", "--name-only", "-r", "-z",
                                                         "--root", found).stdout.split("\0") if p]
                        if paths:
                            self.git.run("reset", "-q", "HEAD", "--pathspec-from-file=-", "--pathspec-file-nul",
                                         input="\0".join(f":(top,literal){p}" for p in paths) + "\0", check=False)
                        return res
                if recovering:
                    self._recover(step_id)
                ours, left = self._ours(scan(self.git, self.spec))
                for why, paths in left.items():
                    res.events.append(ev.CheckpointLeftOut(step_id=step_id, files=paths, reason=why))
                msg = step_message(self.task_id, step_id, title, iteration, self.redact)
                commit = self._retry(lambda: commit_files(self.git, ours, msg)) if ours else None
                if commit is None:
                    res.note = "no changes"
                    res.events.append(ev.CheckpointSkipped(step_id=step_id, reason="no_changes"))
                    return res
                res.commit = commit
                res.files = ours
                res.events.append(ev.CheckpointCreated(step_id=step_id, commit=res.commit))
        except GitError as exc:
            res.commit = None
            res.note = f"failed: {exc}"
            res.events.append(ev.CheckpointFailed(step_id=step_id, error=str(exc)))
        finally:
            self._retire()
        return res

    def _retry(self, action: Callable[[], Any], attempts: int = 5) -> Any:
        """git fails at once when another git holds a lock; wait for it and try again."""
        for n in range(attempts):
            try:
                return action()
            except GitError as exc:
                if (".lock" not in str(exc) and "update-ref" not in str(exc)) or n == attempts - 1:
                    raise
                events: list[ev.Event] = []
                self._clear_locks(events)
                time.sleep(0.1 * (n + 1))
        return None

    def dirty(self) -> list[str]:
        """Changes in the project's files (kiro's folders left out), staged or not, untracked too; a nested
        repository by its folder."""
        found = scan(self.git, self.spec)
        return [*found.changed, *found.nested]

    # -- the end of a loop -------------------------------------------------------------------

    def finish(self) -> Result:
        """On completion, with isolation: leave the branch (manual) or merge it back (auto)."""
        res = Result()
        info = self.info
        if info.isolation != "worktree" or info.branch is None:
            return res
        if info.merge == "manual":
            info.merge_status = "left"
            res.events.append(ev.BranchLeft(branch=info.branch, worktree=self.ws.relative(self.tree)))
            return res
        main = Git(self.main_top)
        with _repo_lock(self._common):
            main_locks = [Path(self.main_top / p).resolve() for p in main.out(
                "rev-parse", "--git-path", "index.lock", "--git-path", "HEAD.lock").splitlines()]
            if info.base_branch:
                main_locks.append(Path(self._common) / "refs" / "heads" / f"{info.base_branch}.lock")
            self._clear_locks(res.events, main_locks)
            tip = main.out("rev-parse", f"refs/heads/{info.branch}")
            if main.ok("merge-base", "--is-ancestor", tip, "HEAD"):
                return self._merged(res, main, tip)
            current = main.run("symbolic-ref", "-q", "--short", "HEAD", check=False).stdout.strip() or None
            if info.base_branch and current != info.base_branch:
                res.problem = (f"the main work tree is on {current or 'a detached HEAD'!s}, not {info.base_branch}; "
                               f"check out {info.base_branch} and resume, or merge {info.branch} yourself")
                return res
            if (Path(self._common) / "MERGE_HEAD").exists() or main.ok("rev-parse", "-q", "--verify", "MERGE_HEAD"):
                unmerged = self._unmerged(main)
                if unmerged:
                    return self._conflict(res, unmerged)
                # a merge stopped before its commit (a kill) with nothing unresolved: conclude it
                merging = main.out("rev-parse", "MERGE_HEAD")
                commit_index(main, msg_of_merge(self.task_id, info.branch), [main.out("rev-parse", "HEAD"), merging])
                main.run("merge", "--quit", check=False)
                return self._merged(res, main, tip)
            return self._merge(res, main, tip)

    def _merge(self, res: Result, main: Git, tip: str, again: bool = True) -> Result:
        """Merge without a window for a kill to leave half a merge: the merged tree and its commit
        are made as objects first (`merge-tree`, `commit-tree`), then the main tree moves to that
        commit by a fast-forward. A kill mid-checkout is healed on the next try (`_heal`)."""
        info = self.info
        assert info.branch is not None
        info.merge_status = "merging"
        msg = msg_of_merge(self.task_id, info.branch)
        head = main.out("rev-parse", "HEAD")
        planned = main.run("merge-tree", "--write-tree", "--no-messages", head, tip, check=False)
        if planned.returncode == 0:
            tree = planned.stdout.split()[0]
            commit = main.run("commit-tree", tree, "-p", head, "-p", tip, "-F", "-", commit=True, input=msg).stdout
            self._heal(main, head, tree, res)
            for n in range(5):  # another process's git may hold the main tree's lock for a moment
                proc = main.run("merge", "--ff-only", "-q", commit.strip(), check=False, commit=True)
                if proc.returncode == 0 or ".lock" not in proc.stderr:
                    break
                self._clear_locks(res.events, [Path(self._common) / "index.lock"])
                time.sleep(0.1 * (n + 1))
            if proc.returncode == 0:
                return self._merged(res, main, tip)
            if again and main.out("rev-parse", "HEAD") != head:  # a person committed meanwhile: once more
                return self._merge(res, main, tip, again=False)
        else:  # conflicts: a real merge, left in the main tree for a person to resolve
            proc = main.run("merge", "--no-ff", "--no-edit", "-q", "-m", msg, info.branch, check=False, commit=True)
            if proc.returncode == 0:
                return self._merged(res, main, tip)
            unmerged = self._unmerged(main)
            if unmerged:
                return self._conflict(res, unmerged)
        text = proc.stderr + proc.stdout
        files = [ln.strip() for ln in text.splitlines() if ln.startswith("\t")]
        res.files = files
        info.merge_status = "conflict"
        info.conflict_files = files
        first = (text.strip().splitlines() or ["git merge failed"])[0]
        res.problem = (f"could not merge {info.branch} into {info.base_branch or 'HEAD'}: {first}"
                       + (f" ({', '.join(files[:5])})" if files else ""))
        res.events.append(ev.MergeFailed(branch=info.branch, files=files, error=first))
        return res

    def _heal(self, main: Git, head: str, tree: str, res: Result,
              event: type[ev.MergeResumed | ev.RollbackResumed] = ev.MergeResumed) -> None:
        """A kill while git moved the main tree to the merge can leave files already as the merge
        has them while the index and HEAD are not: put exactly those back (their content is the
        merge's, so nothing is lost) so that the fast-forward can run again. A person's own change
        differs from the merge's content and is left alone (the merge then refuses, naming it)."""
        paths = [p for p in main.run("diff", "--name-only", "-z", "--no-renames", head, tree,
                                     check=False).stdout.split("\0") if p]
        if not paths:
            return

        def blobs(*args: str) -> dict[str, str]:
            out: dict[str, str] = {}
            for rec in main.run(*args, "--", *paths, check=False).stdout.split("\0"):
                meta, _, path = rec.partition("\t")
                if path:
                    out[path] = meta.split()[2] if args[0] == "ls-tree" else meta.split()[1]
            return out

        in_head = blobs("ls-tree", "-r", "-z", head)
        in_merge = blobs("ls-tree", "-r", "-z", tree)
        in_index = blobs("ls-files", "-s", "-z")
        present = [p for p in paths if (main.cwd / p).is_file()]
        hashes = main.run("hash-object", "--no-filters", "--stdin-paths", input="\n".join(present) + "\n",
                          check=False).stdout.split() if present else []
        on_disk = dict(zip(present, hashes, strict=False))
        healed = []
        for path in paths:
            if in_index.get(path) != in_head.get(path):
                continue  # the index moved already (or a person staged something): git decides
            now, merged = on_disk.get(path), in_merge.get(path)
            gone = now is None and path in in_head  # removed before being written again
            if now == merged or (now is None and merged is None) or gone or self._torn(main, path, merged):
                if now == in_head.get(path):
                    continue
                if path in in_head:
                    main.run("checkout", "-q", head, "--", path)
                else:
                    (main.cwd / path).unlink()
                healed.append(path)
        if healed:
            res.events.append(event(branch=self.info.branch, files=healed))

    @staticmethod
    def _torn(main: Git, path: str, merged: str | None) -> bool:
        """A file git was writing when it was killed: a strict beginning of the content it was
        writing (git writes a checked-out file in place, not by rename)."""
        file = main.cwd / path
        if merged is None or not file.is_file() or file.is_symlink():
            return False
        try:
            size = file.stat().st_size
            if size > 64 * 1024 * 1024:
                return False
            have = file.read_bytes()
        except OSError:
            return False
        want = main.raw("cat-file", "blob", merged)
        return len(have) < len(want) and want.startswith(have)

    def _unmerged(self, main: Git) -> list[str]:
        out = main.run("diff", "--name-only", "--diff-filter=U", "-z", check=False).stdout
        return [f for f in out.split("\0") if f]

    def _conflict(self, res: Result, files: list[str]) -> Result:
        info = self.info
        info.merge_status = "conflict"
        info.conflict_files = files
        res.files = files
        res.problem = (f"merging {info.branch} into {info.base_branch or 'HEAD'} conflicts in "
                       f"{', '.join(files[:10])}{' ...' if len(files) > 10 else ''}")
        res.events.append(ev.MergeConflict(branch=info.branch, into=info.base_branch, files=files))
        return res

    def _merged(self, res: Result, main: Git, tip: str) -> Result:
        info = self.info
        info.merge_status = "merged"
        info.conflict_files = []
        info.merge_commit = main.out("rev-parse", "HEAD")
        res.commit = info.merge_commit
        res.events.append(ev.MergeCompleted(branch=info.branch, into=info.base_branch, commit=info.merge_commit))
        # the branch stays (for `git log`); its work tree goes when it has nothing kiro did not commit
        wt = Path(info.worktree).resolve() if info.worktree else None
        expected = (Path(self.ws.root).resolve() / ".kiro" / "worktrees" / self.task_id)
        if wt is None or wt != expected or wt == self.main_top.resolve():
            return res  # only ever kiro's own worktree folder
        self.tree = wt
        try:
            leftover = self.dirty() if self.tree.is_dir() else []
        except GitError:  # half removed by a kill (its .git file gone): remove the rest
            leftover = [] if not (self.tree / ".git").exists() else ["?"]
        if not leftover:
            proc = main.run("worktree", "remove", "--force", "--force", str(self.tree), check=False)
            if proc.returncode != 0 and self.tree.exists():
                import shutil

                shutil.rmtree(self.tree, ignore_errors=True)
            main.run("worktree", "prune", check=False)
            if not self.tree.exists():
                info.worktree = None
                self.tree = self.main_top
                self.git = main
                res.events.append(ev.WorktreeRemoved(branch=info.branch))
        return res


def preflight(cfg: Any, project_dir: Path) -> None:
    """Before a loop is created: a git setting that cannot work is the person's mistake (exit 1,
    one line, no state written)."""
    if not cfg.git_demanded:
        return
    if cfg.checkpoints == "off":
        raise UserError("isolation: worktree needs checkpoints: git (the loop's work is kept as commits on its "
                        "branch); set checkpoints: git or isolation: none")
    top = toplevel(project_dir)
    if top is None:
        key = "checkpoints: git" if cfg.checkpoints == "git" else "isolation: worktree"
        raise UserError(f"{key} needs the project directory {project_dir} inside a git work tree "
                        f"(run `git init` there, or set checkpoints: off and isolation: none)")
    if cfg.isolation == "worktree" and not Git(top).ok("rev-parse", "--verify", "-q", "HEAD"):
        raise UserError(f"isolation: worktree needs a commit to branch from; {top} has none yet "
                        f"(make a first commit, or set isolation: none)")


# -- rollback ----------------------------------------------------------------------------------


@dataclass
class Rollback:
    task_id: str
    to_step: str
    checkpoint: str | None
    commit: str | None
    undone: list[str]
    unchecked: list[str]
    method: str


def rollback(ws: Any, store: Any, task_id: str, to_step: str) -> Rollback:
    """`kiro loop rollback`: the project's files back to STEP's checkpoint (as a new commit, so no
    commit of anyone's is lost), the boxes of the steps completed after it unchecked, the rollback
    recorded in the state and the event log. Refuses while the loop runs or when the work tree
    holds changes kiro did not make."""
    from kiro.errors import LockHeld
    from kiro.status import Status
    from kiro.store import tasks

    loaded = store.load(task_id)
    state = loaded.state
    try:
        lock = store.acquire(task_id)
    except LockHeld:
        pid = store.holder_pid(task_id)
        held = f" (pid {pid})" if pid else ""
        if store.holder_role(task_id) == "watch":
            raise UserError(f"loop {task_id!r} is kept by `kiro loop watch`{held}; stop the watch first, then roll "
                            f"back") from None
        raise UserError(f"loop {task_id!r} is running{held}; stop it first with `kiro loop stop --task-id "
                        f"{task_id}`, then roll back") from None
    try:
        loaded = store.load(task_id)
        state = loaded.state
        info = state.git
        if info is None or not info.checkpoints or not info.toplevel:
            raise UserError(f"loop {task_id!r} has no git checkpoints (checkpoints: off, or the project is not in a "
                            f"git work tree); nothing to roll back to")
        redact = _redactor(ws)  # the commit message, the state and the events a rollback writes
        # the state holds step ids as the redactor left them: a step whose text holds a secret is found
        # by its text as the person wrote it too
        to_step = redact.text(to_step)
        idx = next((i for i in range(len(state.completed_steps) - 1, -1, -1)
                    if state.completed_steps[i].step_id == to_step), None)
        if idx is None:
            done = ", ".join(c.step_id for c in state.completed_steps) or "none"
            raise UserError(f"step {to_step!r} is not among the steps loop {task_id!r} completed ({done})")
        later = state.completed_steps[idx + 1:]
        if not later:
            raise UserError(f"step {to_step!r} is the last step loop {task_id!r} completed; nothing to roll back")
        if info.isolation == "worktree" and info.merge_status == "merged":
            raise UserError(f"loop {task_id!r}'s branch {info.branch} is already merged into {info.base_branch}; "
                            f"undo it there with `git revert -m 1 {info.merge_commit}`")
        target = next((c.checkpoint for c in reversed(state.completed_steps[: idx + 1]) if c.checkpoint),
                      info.base_commit)
        cfg_project = Path(info.worktree or info.toplevel)
        if not cfg_project.is_dir():
            raise UserError(f"loop {task_id!r}'s work tree {cfg_project} is gone; nothing to roll back")
        top = Path(info.toplevel)
        lg = LoopGit(ws, info, task_id, top / info.project_rel if info.project_rel else top, top)
        git = lg.git
        lg._paths()
        for name in ("MERGE_HEAD", "REVERT_HEAD", "CHERRY_PICK_HEAD", "rebase-merge", "rebase-apply"):
            if git.ok("rev-parse", "-q", "--verify", name) or Path(cfg_project / git.out(
                    "rev-parse", "--git-path", name)).exists():
                raise UserError(f"{cfg_project} is in the middle of a merge/revert/rebase ({name}); finish or abort "
                                f"it first")
        if target is None:
            raise UserError(f"loop {task_id!r} has no checkpoint at or before step {to_step!r} (no commit existed "
                            f"when it started)")
        if not git.ok("merge-base", "--is-ancestor", target, "HEAD"):
            raise UserError(f"the checkpoint {target[:12]} of step {to_step!r} is not in the history of HEAD in "
                            f"{cfg_project}; check out the loop's branch first")
        events: list[ev.Event] = []
        lg._clear_locks(events)
        head = git.out("rev-parse", "HEAD")
        commits = log(git, f"{target}..HEAD")
        others = [c for c in commits if c.trailers.get("Kiro-Task-Id") != task_id]
        msg = redact.text(f"kiro({task_id}): rollback to {_one_line(to_step)}\n\nKiro-Task-Id: {task_id}\n"
                          f"Kiro-Rollback-To: {_one_line(to_step)}\n")
        tree = None
        if not others:  # the new tree is made first, in a private index; a kill cannot leave half of it
            tree = _restored_tree(lg, head, target)
            healed = Result()
            lg._heal(git, head, tree, healed, ev.RollbackResumed)  # files a killed rollback already moved
            events += healed.events
        # the files the rollback changes must hold nothing kiro did not commit; other files (a person's, another
        # loop's in the same work tree) are not touched and may be as they are
        ours = [c.sha for c in commits if c.trailers.get("Kiro-Task-Id") == task_id]
        touched: set[str] = set()
        for sha in ours:
            touched |= {p for p in git.run("diff-tree", "--no-commit-id", "--name-only", "-r", "-z", "--root", sha,
                                           check=False).stdout.split("\0") if p}
        dirty = [p for p in lg.dirty() if p in touched or any(p.startswith(t + "/") for t in touched)]
        if tree is None and git.run("diff", "--cached", "--quiet", check=False).returncode != 0:
            dirty.append("(changes staged in the index)")  # a revert's commit is made from the index
        if dirty:
            shown = ", ".join(dirty[:3]) + (f" and {len(dirty) - 3} more" if len(dirty) > 3 else "")
            raise UserError(f"the work tree {cfg_project} holds changes kiro did not make in the files the rollback "
                            f"changes ({shown}); commit or stash them first")
        commit = None
        if tree is not None:
            method = "restore"
            if tree != git.out("rev-parse", f"{head}^{{tree}}"):
                commit = git.run("commit-tree", tree, "-p", head, "-F", "-", commit=True, input=msg).stdout.strip()
                proc = git.run("merge", "--ff-only", "-q", commit, check=False, commit=True)
                if proc.returncode != 0:
                    first = (proc.stderr.strip().splitlines() or ["git merge --ff-only failed"])[0]
                    raise UserError(f"could not move {cfg_project} to the rollback commit: {first}")
        else:  # a person's commits came after: undo only kiro's, keep theirs
            method = "revert"
            undo = git.run("revert", "--no-commit", *ours, check=False, commit=True) if ours else None
            if undo is not None and undo.returncode != 0:
                unmerged = lg._unmerged(git)
                git.run("revert", "--abort", check=False)
                git.run("reset", "-q", "--merge", check=False)
                raise UserError(f"{_whose(others)} after step {to_step!r} touch the same lines as this loop's "
                                f"({', '.join(unmerged[:5]) or 'see git revert'}); undo kiro's commits by hand with "
                                f"`git revert` ({', '.join(s[:12] for s in ours[:5])})")
            if git.run("diff", "--cached", "--quiet", "--no-ext-diff", "--", *lg.spec, check=False).returncode != 0:
                commit = commit_index(git, msg, [head])
        # the boxes
        undone = [c.step_id for c in later]
        task_path = ws.absolute(state.task_path)

        _, found = locate_task(ws, task_path, task_id)
        if found is not None and ws.area_of(found) == "Done":
            back = ws.counterpart(found, "Specs")
            back.parent.mkdir(parents=True, exist_ok=True)
            os.replace(found, back)
            found = back
            state.task_path = ws.relative(back)
        unchecked = _uncheck(tasks, found, set(undone)) if found is not None else []
        # the state
        state.completed_steps = state.completed_steps[: idx + 1]
        state.current_step = None
        for sid in undone:
            state.steps.pop(sid, None)
        record = {"at": timeutil.iso(), "to_step": to_step, "checkpoint": target, "commit": commit,
                  "method": method, "undone": undone, "unchecked": unchecked}
        from kiro.store.state import RollbackRecord

        info.rollbacks.append(RollbackRecord.model_validate(record))
        if info.merge_status in ("left", "conflict"):
            info.merge_status = None
        if state.status == Status.COMPLETED:
            state.transition(Status.STOPPED, "rolled_back")
            state.stop_reason = "rolled_back"
        if state.steps_done is not None:
            state.steps_done = max(0, state.steps_done - len(unchecked))
        store.use(redact)
        store.save(state)
        if loaded.archived:
            store.unarchive(task_id)
        log_file = ev.EventLog(ws.event_log(task_id), redact)
        for event in [*events, ev.RolledBack.model_validate(record)]:
            event.task_id, event.iteration = task_id, state.iteration
            log_file(event)
        log_file.close()
        return Rollback(task_id, to_step, target, commit, undone, unchecked, method)
    finally:
        store.release(task_id, lock)


def _whose(commits: Sequence[Commit]) -> str:
    """Who made the commits that came after a loop's: other loops (their checkpoints' trailers name them),
    a person, or both."""
    loops = sorted({c.trailers["Kiro-Task-Id"] for c in commits if c.trailers.get("Kiro-Task-Id")})
    person = any(not c.trailers.get("Kiro-Task-Id") for c in commits)
    named = f"loop {', '.join(repr(t) for t in loops)}'s checkpoint commits" if loops else ""
    if named and person:
        return f"{named} and a person's commits"
    return named or "a person's commits"


def _restored_tree(lg: LoopGit, head: str, target: str) -> str:
    """HEAD's tree with the project's files as at `target` (kiro's folders as in HEAD)."""
    gitdir = lg._locks[0].parent  # the work tree's own git folder (where its index lives)
    tmp = gitdir / f"kiro-rollback-{os.getpid()}.index"
    g = Git(lg.tree, {**git_env(), "GIT_INDEX_FILE": str(tmp)})
    try:
        g.run("read-tree", head)
        g.run("restore", f"--source={target}", "--staged", "--", *lg.spec)
        return g.out("write-tree")
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _redactor(ws: Any) -> Any:
    """The run's redactor, as a loop has it: the state and events a rollback writes pass through it."""
    from kiro.store.redact import Redactor
    from kiro.store.settings import settings_for

    try:
        return Redactor.for_run(settings_for(ws).config)
    except KiroError:
        return Redactor.from_environment(None)


def _uncheck(tasks: Any, path: Path, step_ids: set[str]) -> list[str]:
    """Uncheck the boxes of these steps, and of each checked parent above them."""
    done: list[str] = []
    errors = 0
    while True:  # one box per write; the file may change under us: set_marker refuses then, read again
        try:
            task = tasks.load(path)
            by_index = {st.index: st for st in task.steps}
            target = None
            for st in task.steps:
                if st.id in step_ids and st.done:
                    target = st
                    break
                if st.done and any(by_index[c].id in step_ids and not by_index[c].done for c in st.children):
                    target = st  # a parent checked because all its children were done
                    break
            if target is None:
                return done
            tasks.set_marker(path, target.key, " ", expected=task)
            done.append(target.id)
        except KiroError:
            errors += 1
            if errors > 20:
                return done
            time.sleep(0.05)
