"""Git checkpoints, rollback and isolated worktrees (SPEC §9), beside the engine.

kiro drives the real `git` program. Every call gets a hardened environment: no system or global
config, no prompts, no pager, no editor, no inherited GIT_DIR/GIT_INDEX_FILE; kiro's own commits
run with hooks off, no signing and kiro's identity given by `-c`, so nothing of the person's global
setup (or an agent's) runs or signs in their name.

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
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from kiro import timeutil
from kiro.errors import KiroError, UserError
from kiro.store.workspace import locate_task

KIRO_NAME = "kiro"
KIRO_EMAIL = "kiro@localhost"
GIT_TIMEOUT = 300.0
LOCK_WAIT_SECONDS = 30.0
LOCK_MIN_AGE = 1.0  # a lock younger than this may belong to a git that is only starting

# Environment variables that would point git somewhere else or make it run programs.
_DROP_ENV = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES",
             "GIT_COMMON_DIR", "GIT_NAMESPACE", "GIT_CEILING_DIRECTORIES", "GIT_CONFIG", "GIT_CONFIG_PARAMETERS",
             "GIT_CONFIG_COUNT", "GIT_EXEC_PATH", "GIT_SSH", "GIT_SSH_COMMAND", "GIT_ASKPASS", "SSH_ASKPASS",
             "GIT_EXTERNAL_DIFF", "GIT_PAGER", "GIT_EDITOR", "GIT_SEQUENCE_EDITOR", "GIT_TRACE", "GIT_QUARANTINE_PATH",
             "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_AUTHOR_DATE", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL",
             "GIT_COMMITTER_DATE", "EMAIL")

# `-c` settings for every git kiro runs, and for the commits kiro makes.
_SAFE = ("-c", "core.fsmonitor=false", "-c", "core.pager=cat", "-c", "core.editor=true", "-c", "gc.auto=0",
         "-c", "maintenance.auto=false", "-c", "advice.detachedHead=false", "-c", "color.ui=false",
         "-c", "core.hooksPath=/dev/null", "-c", "core.sshCommand=ssh", "-c", "core.askPass=",
         "-c", "credential.helper=", "-c", "diff.external=", "-c", "core.gitProxy=")
# A program the repository's own config names for a driver: an agent can write .git/config and
# .gitattributes, so each one found is switched off for kiro's git (an empty command runs nothing;
# a merge driver becomes `false`, a conflict for a person).
_DRIVER = re.compile(r"^(filter|diff|merge)\.(.+)\.(clean|smudge|process|command|textconv|driver)$")
_OFF = {"clean": "", "smudge": "", "process": "", "command": "", "textconv": "", "driver": "false"}
_COMMIT = ("-c", "commit.gpgSign=false", "-c", "tag.gpgSign=false",
           "-c", f"user.name={KIRO_NAME}", "-c", f"user.email={KIRO_EMAIL}", "-c", "merge.ff=false",
           "-c", "merge.autoStash=false", "-c", "rerere.enabled=false")

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


class GitError(KiroError):
    """git could not do what kiro asked (exit 1 at the CLI; a failed checkpoint in a loop)."""


_excludes_file: list[str] = []


def _person_excludes() -> list[str]:
    """`-c core.excludesFile=...` with the person's own global ignore file, read once: kiro runs git
    without global config, but a file the person ignores everywhere (an editor's folder, a `.env`)
    must stay out of kiro's commits too. Reading a value runs nothing."""
    with _lock:
        if not _excludes_file:
            env = {k: v for k, v in os.environ.items() if k not in _DROP_ENV}
            env["GIT_CONFIG_NOSYSTEM"] = "1"
            try:
                proc = subprocess.run(["git", "config", "--global", "--path", "--get", "core.excludesFile"],
                                      env=env, capture_output=True, text=True, timeout=30, cwd="/")
                path = proc.stdout.strip() if proc.returncode == 0 else ""
            except (OSError, subprocess.TimeoutExpired):
                path = ""
            _excludes_file.append(path)
        path = _excludes_file[0]
    return ["-c", f"core.excludesFile={path}"] if path else []


def git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DROP_ENV and not k.startswith("GIT_TRACE")}
    env.update({
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_OPTIONAL_LOCKS": "0",
        "GIT_EDITOR": "true",
        "GIT_PAGER": "cat",
        "GIT_MERGE_AUTOEDIT": "no",
        "LC_ALL": "C",
        "LANG": "C",
    })
    return env


@dataclass
class Git:
    """The git CLI run in one work tree."""

    cwd: Path
    env: dict[str, str] = field(default_factory=git_env)

    def run(self, *args: str, check: bool = True, commit: bool = False, input: str | None = None,
            timeout: float = GIT_TIMEOUT) -> subprocess.CompletedProcess[str]:
        argv = ["git", *_SAFE, *self.drivers_off(), *_person_excludes(), *(_COMMIT if commit else ()), *args]
        try:
            proc = subprocess.run(argv, cwd=self.cwd, env=self.env, capture_output=True, text=True, input=input,
                                  timeout=timeout, errors="replace")
        except FileNotFoundError:
            raise GitError("git is not installed (needed for checkpoints: git); install it or set "
                           "checkpoints: off") from None
        except subprocess.TimeoutExpired:
            raise GitError(f"`git {args[0]}` in {self.cwd} took more than {timeout:g} s") from None
        if check and proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            last = detail[-1] if detail else f"exit {proc.returncode}"
            raise GitError(f"`git {' '.join(args[:2])}` failed in {self.cwd}: {last}")
        return proc

    def drivers_off(self) -> list[str]:
        """`-c` overrides that switch off every filter, diff and merge driver the repository's config
        (with what it includes) names. Listing the config's names runs no program."""
        try:
            proc = subprocess.run(["git", "config", "--null", "--name-only", "--list"], cwd=self.cwd,
                                  env=self.env, capture_output=True, timeout=GIT_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired):
            return []
        off: list[str] = []
        for name in proc.stdout.decode("utf-8", "replace").split("\0"):
            m = _DRIVER.match(name.strip())
            if m is not None:
                off += ["-c", f"{m.group(1)}.{m.group(2)}.{m.group(3)}={_OFF[m.group(3)]}"]
                if m.group(1) == "filter":
                    off += ["-c", f"filter.{m.group(2)}.required=false"]
        return off

    def out(self, *args: str) -> str:
        return self.run(*args).stdout.strip()

    def ok(self, *args: str) -> bool:
        return self.run(*args, check=False).returncode == 0


TOPLEVEL_FRESH_SECONDS = 2.0
_toplevels: dict[Path, tuple[float, tuple[Any, ...], Path | None]] = {}


def _git_signature(path: Path) -> tuple[Any, ...]:
    """What git's answer depends on that can change under a running kiro: which folders from `path`'s
    physical folder up (git starts from there) hold a `.git` (a folder or a gitfile), and the variables
    that point git elsewhere."""
    real = Path(os.path.realpath(path))
    marks = tuple(os.path.lexists(os.path.join(p, ".git")) for p in (real, *real.parents))
    return marks, tuple(os.environ.get(v) for v in ("GIT_DIR", "GIT_WORK_TREE", "GIT_CEILING_DIRECTORIES"))


def toplevel(path: Path) -> Path | None:
    """The work tree that holds `path`, or None when it is in none (or git is missing). An answer
    is reused for TOPLEVEL_FRESH_SECONDS while no `.git` appeared or went on the way up (a thousand
    loops of one project started together ask git once, not once each)."""
    if not path.is_dir():
        return None
    now = time.monotonic()
    signature = _git_signature(path)
    seen = _toplevels.get(path)
    if seen is not None and now - seen[0] < TOPLEVEL_FRESH_SECONDS and seen[1] == signature:
        return seen[2]
    # a `.git` on the way up is the only way git finds a work tree when GIT_DIR is not set, and kiro's
    # git runs without it (git_env): with none, asking git (two processes at every start) can only say "none"
    top = _toplevel(path) if any(signature[0]) else None
    if len(_toplevels) > 4096:
        _toplevels.clear()
    _toplevels[path] = (now, signature, top)
    return top


def _toplevel(path: Path) -> Path | None:
    try:
        proc = Git(path).run("rev-parse", "--show-toplevel", check=False, timeout=30)
    except GitError:
        return None
    if proc.returncode != 0 or not proc.stdout.strip():
        return None
    return Path(proc.stdout.strip()).resolve()


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
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
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


def _only_ignored(stderr: str, excludes: Sequence[str]) -> bool:
    """Is `git add`'s complaint only that some of kiro's own (excluded) paths are ignored? Ignored whole,
    a folder is named for the excluded file in it (`config` for config/autonomous_loop.yaml)."""
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    if not lines or lines[0] != "The following paths are ignored by one of your .gitignore files:":
        return False
    ours = {e.rstrip("/") for e in excludes}
    ours |= {parent.as_posix() for e in ours for parent in PurePosixPath(e).parents if parent.name}
    return all(ln.rstrip("/") in ours or ln.startswith("hint:") for ln in lines[1:])


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

    def _clear_locks(self, events: list[tuple[str, dict[str, Any]]], extra: Sequence[Path] = ()) -> None:
        roots = [self.tree, self.main_top, Path(self._common)]
        temp = []  # `git commit -- <paths>` builds its commit in next-index-<pid>.lock; a kill leaves it behind
        for folder in {p.parent for p in [*self._locks[:1], *extra[:1]]}:
            for p in folder.glob("next-index-*.lock"):
                pid = p.name[len("next-index-"):-len(".lock")]
                if not (pid.isdigit() and Path("/proc", pid).exists()):
                    temp.append(p)
        for path in clear_stale_locks([*self._locks, *extra, *temp], roots):
            events.append(("git_lock_cleared", {"path": path}))

    def open(self, resumed: bool) -> list[tuple[str, dict[str, Any]]]:
        """Ready the loop's work tree: record where commits go; with isolation, create (or find
        again) `.kiro/worktrees/<task_id>` on branch `kiro/<task_id>`."""
        events: list[tuple[str, dict[str, Any]]] = []
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
                events.append(("worktree_recreated", {"path": self.ws.relative(wt), "branch": name}))
            if not (wt / ".git").exists() or not Git(wt).ok("rev-parse", "--verify", "-q", "HEAD"):
                common = str((self.main_top / main.out("rev-parse", "--git-common-dir")).resolve())
                with _repo_lock(common):
                    # a kill during `worktree add -b` can leave the new branch's ref lock behind
                    for path in clear_stale_locks([Path(common) / "refs" / "heads" / f"{name}.lock",
                                                   Path(common) / "packed-refs.lock"], [self.main_top, wt]):
                        events.append(("git_lock_cleared", {"path": path}))
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
                events.append(("worktree_created", {"path": self.ws.relative(wt), "branch": name}))
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

    def step_completed(self, step_id: str, title: str, iteration: int, *, recovering: bool = False) -> Result:
        """Commit the project's changes for a completed step; no commit when nothing changed."""
        res = Result()
        try:
            # one commit at a time per index: loops sharing a work tree take turns, worktrees do not wait
            with _repo_lock(str(self._locks[0].parent)):
                self._clear_locks(res.events)
                if recovering:
                    found = self.find(step_id, iteration)
                    if found:
                        res.commit = found
                        res.events.append(("checkpoint_recovered", {"step_id": step_id, "commit": found}))
                        return res
                self._add()
                if self.git.run("diff", "--cached", "--quiet", "--no-ext-diff", "--", *self.spec,
                                check=False).returncode == 0:
                    res.note = "no changes"
                    res.events.append(("checkpoint_skipped", {"step_id": step_id, "reason": "no_changes"}))
                    return res
                msg = step_message(self.task_id, step_id, title, iteration, self.redact)
                self._retry(lambda: self.git.run("commit", "-q", "--no-verify", "-F", "-", "--", *self.spec,
                                                 commit=True, input=msg))
                res.commit = self._head_for(step_id, iteration)
                res.events.append(("checkpoint_created", {"step_id": step_id, "commit": res.commit}))
        except GitError as exc:
            res.commit = None
            res.note = f"failed: {exc}"
            res.events.append(("checkpoint_failed", {"step_id": step_id, "error": str(exc)}))
        return res

    def _add(self) -> None:
        self._retry(self._add_once)

    def _add_once(self) -> None:
        """`git add -A` of the project without kiro's folders. When the person's .gitignore lists one
        of those folders (`.state/`, `Logs/`), git names it as an ignored path and exits 1 although it
        staged everything else: that is no failure."""
        proc = self.git.run("-c", "advice.addIgnoredFile=false", "add", "-A", "--", *self.spec, check=False)
        if proc.returncode == 0 or _only_ignored(proc.stderr, self.excludes):
            return
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise GitError(f"`git add -A` failed in {self.tree}: {detail[-1] if detail else f'exit {proc.returncode}'}")

    def _retry(self, action: Callable[[], Any], attempts: int = 5) -> Any:
        """git fails at once when another git holds a lock; wait for it and try again."""
        for n in range(attempts):
            try:
                return action()
            except GitError as exc:
                if ".lock" not in str(exc) or n == attempts - 1:
                    raise
                events: list[tuple[str, dict[str, Any]]] = []
                self._clear_locks(events)
                time.sleep(0.1 * (n + 1))
        return None

    def _head_for(self, step_id: str, iteration: int) -> str:
        head = self.git.run("log", "-1", "--format=%H%x1f%B", "HEAD").stdout
        sha, _, body = head.partition("\x1f")
        t = trailers(body)
        if t.get("Kiro-Step-Id") == _one_line(step_id) and t.get("Kiro-Iteration") == str(iteration):
            return sha.strip()
        found = self.find(step_id, iteration)  # a person committed right after kiro
        if found is None:
            raise GitError(f"the checkpoint commit of step {step_id} is not in the history of HEAD")
        return found

    def dirty(self) -> list[str]:
        """Changes in the project's files (kiro's folders left out), staged or not, untracked too."""
        out = self.git.run("status", "--porcelain=v1", "-z", "--untracked-files=all", "--", *self.spec).stdout
        files = []
        parts = out.split("\0")
        i = 0
        while i < len(parts):
            rec = parts[i]
            i += 1
            if len(rec) < 4:
                continue
            files.append(rec[3:])
            if rec[0] in "RC":
                i += 1  # the rename's source path follows
        return files

    # -- the end of a loop -------------------------------------------------------------------

    def finish(self) -> Result:
        """On completion, with isolation: leave the branch (manual) or merge it back (auto)."""
        res = Result()
        info = self.info
        if info.isolation != "worktree" or info.branch is None:
            return res
        if info.merge == "manual":
            info.merge_status = "left"
            res.events.append(("branch_left", {"branch": info.branch, "worktree": self.ws.relative(self.tree)}))
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
                main.run("commit", "-q", "--no-verify", "--no-edit", commit=True)
                return self._merged(res, main, tip)
            return self._merge(res, main, tip)

    def _merge(self, res: Result, main: Git, tip: str, again: bool = True) -> Result:
        """Merge without a window for a kill to leave half a merge: the merged tree and its commit
        are made as objects first (`merge-tree`, `commit-tree`), then the main tree moves to that
        commit by a fast-forward. A kill mid-checkout is healed on the next try (`_heal`)."""
        info = self.info
        assert info.branch is not None
        info.merge_status = "merging"
        msg = (f"kiro({self.task_id}): merge {info.branch}\n\nKiro-Task-Id: {self.task_id}\n"
               f"Kiro-Merge: {info.branch}\n")
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
        res.events.append(("merge_failed", {"branch": info.branch, "files": files, "error": first}))
        return res

    def _heal(self, main: Git, head: str, tree: str, res: Result, event: str = "merge_resumed") -> None:
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
            res.events.append((event, {"branch": self.info.branch, "files": healed}))

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
        want = subprocess.run(["git", *_SAFE, "cat-file", "blob", merged], cwd=main.cwd, env=main.env,
                              capture_output=True, timeout=GIT_TIMEOUT).stdout
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
        res.events.append(("merge_conflict", {"branch": info.branch, "into": info.base_branch, "files": files}))
        return res

    def _merged(self, res: Result, main: Git, tip: str) -> Result:
        info = self.info
        info.merge_status = "merged"
        info.conflict_files = []
        info.merge_commit = main.out("rev-parse", "HEAD")
        res.commit = info.merge_commit
        res.events.append(("merge_completed", {"branch": info.branch, "into": info.base_branch,
                                               "commit": info.merge_commit}))
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
                res.events.append(("worktree_removed", {"branch": info.branch}))
        return res


def preflight(cfg: Any, project_dir: Path) -> None:
    """Before a loop is created: a git setting that cannot work is the person's mistake (exit 1,
    one line, no state written)."""
    if cfg.checkpoints != "git" and cfg.isolation != "worktree":
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


def attach(ws: Any, cfg: Any, state: Any, project_dir: Path) -> LoopGit | None:
    """The loop's git side, or None when checkpoints are off. Records the choice in the state the
    first time; a resumed loop keeps the worktree and branch it started with."""
    from kiro.store.state import GitInfo

    info = state.git
    if info is not None and info.toplevel:
        if not info.checkpoints:
            return None
        return LoopGit(ws, info, state.task_id, project_dir, Path(info.toplevel))
    mode = cfg.checkpoints
    if mode == "off":
        if cfg.isolation == "worktree":
            raise UserError("isolation: worktree needs checkpoints: git (the loop's work is kept as commits on its "
                            "branch); set checkpoints: git or isolation: none")
        state.git = GitInfo(checkpoints=False)
        return None
    top = toplevel(project_dir)
    if top is None:
        if mode == "git" or cfg.isolation == "worktree":
            key = "checkpoints: git" if mode == "git" else "isolation: worktree"
            raise UserError(f"{key} needs the project directory {project_dir} inside a git work tree "
                            f"(run `git init` there, or set checkpoints: off and isolation: none)")
        state.git = GitInfo(checkpoints=False)
        return None
    state.git = GitInfo(checkpoints=True, isolation=cfg.isolation, merge=cfg.merge)
    return LoopGit(ws, state.git, state.task_id, project_dir, top)


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
    from kiro.store.events import EventLog, make_event

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
        events: list[tuple[str, dict[str, Any]]] = []
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
            lg._heal(git, head, tree, healed, "rollback_resumed")  # files a killed rollback already moved
            events += healed.events
        dirty = lg.dirty()
        if dirty:
            shown = ", ".join(dirty[:3]) + (f" and {len(dirty) - 3} more" if len(dirty) > 3 else "")
            raise UserError(f"the work tree {cfg_project} holds changes kiro did not make ({shown}); commit or "
                            f"stash them first")
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
            ours = [c.sha for c in commits if c.trailers.get("Kiro-Task-Id") == task_id]
            proc = git.run("revert", "--no-commit", *ours, check=False, commit=True)
            if proc.returncode != 0:
                unmerged = lg._unmerged(git)
                git.run("revert", "--abort", check=False)
                git.run("reset", "-q", "--merge", check=False)
                raise UserError(f"a person's commits after step {to_step!r} touch the same lines as kiro's "
                                f"({', '.join(unmerged[:5]) or 'see git revert'}); undo kiro's commits by hand with "
                                f"`git revert` ({', '.join(s[:12] for s in ours[:5])})")
            if git.run("diff", "--cached", "--quiet", "--no-ext-diff", "--", *lg.spec, check=False).returncode != 0:
                git.run("commit", "-q", "--no-verify", "-F", "-", "--", *lg.spec, commit=True, input=msg)
                commit = git.out("rev-parse", "HEAD")
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
        log_file = EventLog(ws.event_log(task_id), redact)
        for kind, fields in events:
            log_file(make_event(task_id, state.iteration, kind, fields))
        log_file(make_event(task_id, state.iteration, "rolled_back", dict(record)))
        log_file.close()
        return Rollback(task_id, to_step, target, commit, undone, unchecked, method)
    finally:
        store.release(task_id, lock)


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
