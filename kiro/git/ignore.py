"""Keeping kiro's own folders out of a person's commits. When the workspace lies in a git work tree,
`kiro init` and a workspace's first start write a block kiro owns into the repository's
`.git/info/exclude`: git's ignore file for this clone, read like a root `.gitignore` but never committed
and shared by the clone's worktrees. So the person's files stay as they are (no `.gitignore` of theirs is
touched), `git status` and `git add -A` leave `.state/`, `Logs/`, `.hooks/`, `Dashboard.md`, `Needs_Action/`
(what the loops ask of a person), `config/` (the workspace's settings) and the loops' worktrees alone,
and kiro's checkpoints (kiro.git.checkpoints) are unaffected: they leave those folders out with pathspecs
already.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiro.fs.atomic import atomic_write
from kiro.git.gitcli import Git, GitError, toplevel

BEGIN = "# >>> kiro: its own folders, kept out of commits (kiro writes this block; edit above or below it)"
END = "# <<< kiro"
OWN = (".state", "Logs", ".hooks", "Dashboard.md", ".kiro/worktrees", "Needs_Action", "config")


def _own_paths(ws: Any, top: Path) -> list[str]:
    root = Path(ws.root).resolve()
    out: list[str] = []
    for p in [*(root / name for name in OWN), Path(ws.state_dir)]:
        try:
            rel = p.resolve().relative_to(top).as_posix()
        except ValueError:
            continue
        entry = f"/{rel}" + ("" if p.name == "Dashboard.md" else "/")
        if rel not in ("", ".") and entry not in out:
            out.append(entry)
    return out


_looked: set[tuple[str, str]] = set()  # (workspace, state folder): looked at by this process already


def keep_out(ws: Any) -> str | None:
    """Write (or bring up to date) kiro's block in `.git/info/exclude`; a line saying so, or None when
    the workspace is in no git work tree or the block is there already. Looked at once per process and
    workspace (a batch start's loops, a watch's first loops ask it each: git is asked once)."""
    key = (str(ws.root), str(ws.state_dir))
    if key in _looked:
        return None
    _looked.add(key)
    top = toplevel(Path(ws.root))
    if top is None:
        return None
    try:
        exclude = Path(Git(top).out("rev-parse", "--path-format=absolute", "--git-path", "info/exclude"))
    except GitError:
        return None
    paths = _own_paths(ws, top)
    block = "\n".join([BEGIN, *paths, END]) + "\n"
    try:
        text = exclude.read_text(encoding="utf-8", errors="surrogateescape")
    except FileNotFoundError:
        text = ""
    except OSError:
        return None
    if block in text:
        return None
    start, end = text.find(BEGIN), text.find(END)
    if start >= 0 and end > start:
        text = text[:start] + text[end + len(END):].lstrip("\n")
    if text and not text.endswith("\n"):
        text += "\n"
    try:
        exclude.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(exclude, (text + block).encode("utf-8", errors="surrogateescape"))
    except OSError:
        return None
    return (f"kept kiro's own folders out of git commits ({', '.join(paths)}): a block kiro owns in "
            f"{exclude} (git's ignore file for this clone; never committed)")
