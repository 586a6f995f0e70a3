"""How kiro runs the git CLI (SPEC §9, §15): every call built by `command` and `git_env` alone: none of the `GIT_*`
variables kiro inherited, no system or global config, no prompt, pager, editor, hook, fsmonitor or helper
program, no protocol but for the person's remotes, and never a look into another repository (a nested `.git`
a step made, a submodule): git would read its config there and run its filters. So kiro stages files by name
(`update-index`) and commits with `write-tree` / `commit-tree` / `update-ref`, never `git add` or `commit`;
the one config it reads, the project's own repository's, has each driver it defines switched off. kiro's
commits carry kiro's identity, given by `-c`, and no signature.

Light to import (no event model): what a first start needs to keep kiro's folders out of git
(kiro.git.ignore) is here; checkpoints, rollback and worktrees are in kiro.git.checkpoints.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiro.errors import KiroError

KIRO_NAME = "kiro"
KIRO_EMAIL = "kiro@localhost"
GIT_TIMEOUT = 300.0

# `-c` settings for every git kiro runs: nothing a repository's config or a work tree names is run (hooks,
# fsmonitor, an external diff, a pager or editor, an ssh or proxy command, a credential helper, an alternate
# refs command, a signature check), no repository is found by walking into an implicit bare repository, and
# nothing recurses into another repository (a submodule or a nested repository a step made: its own config
# would be read there, its filters and fsmonitor run). Remote protocols are closed except for the commands
# that talk to a remote the person configured (`_REMOTE`).
_SAFE = ("-c", "core.fsmonitor=false", "-c", "core.pager=cat", "-c", "core.editor=true", "-c", "gc.auto=0",
         "-c", "maintenance.auto=false", "-c", "advice.detachedHead=false", "-c", "color.ui=false",
         "-c", "core.hooksPath=/dev/null", "-c", "core.sshCommand=ssh", "-c", "core.askPass=",
         "-c", "credential.helper=", "-c", "diff.external=", "-c", "core.gitProxy=",
         "-c", "core.alternateRefsCommand=", "-c", "core.attributesFile=/dev/null", "-c", "log.showSignature=false",
         "-c", "safe.bareRepository=explicit", "-c", "submodule.recurse=false", "-c", "status.submoduleSummary=false",
         "-c", "diff.ignoreSubmodules=all", "-c", "fetch.recurseSubmodules=false", "-c", "push.recurseSubmodules=no",
         "-c", "core.untrackedCache=false", "-c", "protocol.ext.allow=never")
_CLOSED = ("-c", "protocol.allow=never")
_OPEN = ("-c", "protocol.file.allow=always")  # a remote the person set is a path as often as a URL
_REMOTE = frozenset({"clone", "fetch", "push", "ls-remote"})
# Commands that look at a work tree's files through git's diff machinery: with a gitlink in the index (a
# submodule, or a nested repository recorded as one) git runs `git status` inside it, with its config, unless
# told on the command line (a `.gitmodules` entry `ignore = none` beats any config kiro could give).
_LOOKS = frozenset({"status", "diff", "diff-files", "diff-index"})
# Porcelain that stages or commits from the work tree: each walks into nested repositories (their filters run)
# and none takes `--ignore-submodules`. kiro stages named files with `update-index` and commits with
# `write-tree` / `commit-tree` / `update-ref` (`commit_files`).
_NEVER = frozenset({"add", "commit", "stash", "submodule", "pull", "am", "rebase", "cherry-pick"})
# A program the repository's own config names for a driver: attributes in the work tree (which a step writes)
# may name any of them, so each one the config kiro's git reads defines is switched off for kiro's git (an
# empty command runs nothing; a merge driver becomes `false`, a conflict for a person). That config is the
# top repository's alone: kiro's git never reads another repository's (`_LOOKS`, `_NEVER`, `scan`).
_DRIVER = r"^(filter|diff|merge)\.(.+)\.(clean|smudge|process|command|textconv|driver)$"  # compiled when first used
_OFF = {"clean": "", "smudge": "", "process": "", "command": "", "textconv": "", "driver": "false"}
_COMMIT = ("-c", "commit.gpgSign=false", "-c", "tag.gpgSign=false",
           "-c", f"user.name={KIRO_NAME}", "-c", f"user.email={KIRO_EMAIL}", "-c", "merge.ff=false",
           "-c", "merge.autoStash=false", "-c", "rerere.enabled=false")

_lock = threading.Lock()


class GitError(KiroError):
    """git could not do what kiro asked (exit 1 at the CLI; a failed checkpoint in a loop)."""


_excludes_file: list[str] = []


def _person_excludes() -> list[str]:
    """`-c core.excludesFile=...` with the person's own global ignore file, read once: kiro runs git
    without global config, but a file the person ignores everywhere (an editor's folder, a `.env`)
    must stay out of kiro's commits too. Reading a value runs nothing."""
    with _lock:
        if not _excludes_file:
            env = git_env()
            env.pop("GIT_CONFIG_GLOBAL")  # the person's own, for this one value
            try:
                proc = subprocess.run(command(("config", "--global", "--path", "--get", "core.excludesFile")),
                                      env=env, capture_output=True, text=True, timeout=30, cwd="/")
                path = proc.stdout.strip() if proc.returncode == 0 else ""
            except (OSError, subprocess.TimeoutExpired):
                path = ""
            _excludes_file.append(path)
        path = _excludes_file[0]
    return ["-c", f"core.excludesFile={path}"] if path else []


def git_env() -> dict[str, str]:
    """The environment of every git kiro runs: none of the `GIT_*` variables kiro was started with (each
    one points git elsewhere, makes it run a program or changes what a pathspec means), no system or
    global config, no prompt, no lazy fetch, no protocol a URL alone asks for."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") and k != "EMAIL"}
    env.update({
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_ATTR_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_OPTIONAL_LOCKS": "0",
        "GIT_NO_LAZY_FETCH": "1",
        "GIT_PROTOCOL_FROM_USER": "0",
        "GIT_EDITOR": "true",
        "GIT_PAGER": "cat",
        "GIT_MERGE_AUTOEDIT": "no",
        "LC_ALL": "C",
        "LANG": "C",
    })
    return env


def command(args: Sequence[str], *, extra: Sequence[str] = (), commit: bool = False) -> list[str]:
    """The command line of every git kiro runs (with `git_env()`): kiro's safe settings, `extra` (settings
    that switch off the repository's drivers, the person's ignore file) and `args`, where a command that looks
    at work-tree files through diffs never looks into another repository. Refuses the porcelain that would
    (`_NEVER`): a programming error, never a step's doing."""
    args = list(args)
    i = 0
    while i < len(args) and args[i] == "-c":  # a caller's own `-c name=value` before the command
        i += 2
    sub = args[i] if i < len(args) else ""
    if sub in _NEVER:
        raise GitError(f"kiro's git does not run `git {sub}` (it would read nested repositories); "
                       f"use update-index / commit_files")
    if sub in _LOOKS:
        args.insert(i + 1, "--ignore-submodules=all")
    return ["git", *_SAFE, *(_OPEN if sub in _REMOTE else _CLOSED), *extra, *(_COMMIT if commit else ()), *args]


_drivers: dict[Path, tuple[tuple[tuple[str, Any], ...], tuple[str, ...]]] = {}


def _stats(cwd: Path, files: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, Any], ...]:
    out: list[tuple[str, Any]] = []
    for name, _ in files:
        try:
            st = os.stat(cwd / name)
            out.append((name, (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)))
        except OSError:
            out.append((name, None))
    return tuple(out)


@dataclass(eq=False, repr=False)
class Git:
    """The git CLI run in one work tree."""

    cwd: Path
    env: dict[str, str] = field(default_factory=git_env)

    def run(self, *args: str, check: bool = True, commit: bool = False, input: str | None = None,
            timeout: float = GIT_TIMEOUT) -> subprocess.CompletedProcess[str]:
        argv = command(args, extra=[*self.drivers_off(), *_person_excludes()], commit=commit)
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

    def raw(self, *args: str, timeout: float = GIT_TIMEOUT) -> bytes:
        """A command's output as bytes (a blob's content), run as `run` runs it."""
        argv = command(args, extra=[*self.drivers_off(), *_person_excludes()])
        try:
            return subprocess.run(argv, cwd=self.cwd, env=self.env, capture_output=True, timeout=timeout).stdout
        except (OSError, subprocess.TimeoutExpired):
            return b""

    def drivers_off(self) -> list[str]:
        """`-c` overrides that switch off every filter, diff and merge driver the repository's config
        (with what it includes) names. Listing the config's names runs no program. The answer is kept while
        the config files it came from are unchanged, when none of them includes another file (an included
        file may lie in the work tree, where a step writes)."""
        cached = _drivers.get(self.cwd)
        if cached is not None and cached[0] == _stats(self.cwd, cached[0]):
            return list(cached[1])
        try:
            proc = subprocess.run(command(("config", "--null", "--name-only", "--show-origin", "--list")),
                                  cwd=self.cwd, env=self.env, capture_output=True, timeout=GIT_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired):
            return []
        off: list[str] = []
        fields = proc.stdout.decode("utf-8", "replace").split("\0")
        origins: set[str] = set()
        keep = proc.returncode == 0
        for origin, name in zip(fields[0::2], fields[1::2], strict=False):
            if origin.startswith("file:"):
                origins.add(origin[len("file:"):])
            elif origin != "command line:":
                keep = False
            if name.lower().startswith(("include.", "includeif.")):
                keep = False
            m = re.match(_DRIVER, name.strip())
            if m is not None:
                off += ["-c", f"{m.group(1)}.{m.group(2)}.{m.group(3)}={_OFF[m.group(3)]}"]
                if m.group(1) == "filter":
                    off += ["-c", f"filter.{m.group(2)}.required=false"]
        if keep:
            key = tuple((o, None) for o in sorted(origins))
            if len(_drivers) > 256:
                _drivers.clear()
            _drivers[self.cwd] = (_stats(self.cwd, key), tuple(off))
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
