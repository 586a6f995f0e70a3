"""Kiro's own files around a task file, read as Kiro's IDE lays them out: a spec folder
(`.kiro/specs/<feature>/` with `requirements.md`, `design.md`, `tasks.md`) and the project's steering
files (`.kiro/steering/*.md`, each with an optional `inclusion:` frontmatter). kiro only reads them: what
a step's prompt says of them is `context()` (kiro.executors.prompts puts it in every step prompt).

Steering inclusion, as Kiro applies it: `always` (the default, also for a file without frontmatter) is
named on every step; `fileMatch` with `fileMatchPattern` (one glob or a list) is named when the step's
text mentions a file the pattern matches (kiro has no open editor files to go by: the step's title and
details are what it knows of the files the step touches); `manual` is named never (a person adds it
with `#name` in Kiro's chat); `auto` is named with its `description`, for the agent to decide.
"""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path
from typing import Any, NamedTuple

from kiro.fs import safeio
from kiro.store import frontmatter

SPEC_DOCS = ("requirements.md", "design.md")
DOC_MAX_BYTES = 2 * 1024 * 1024  # a requirements.md larger than this is named, not read
QUOTE_MAX = 400  # a criterion longer than this is named by id only ("when short")
QUOTES_MAX = 2000  # all quotes of one step together


class Spec(NamedTuple):  # (a NamedTuple, as kiro.store.tasks' TaskCounts)
    project: Path  # the folder holding `.kiro/`
    folder: Path  # `.kiro/specs/<feature>`

    @property
    def name(self) -> str:
        return self.folder.name

    def rel(self, path: Path) -> str:
        return path.relative_to(self.project).as_posix()


def spec_of(task_path: Path | str) -> Spec | None:
    """The Kiro spec a task file belongs to: `<project>/.kiro/specs/<feature>/tasks.md`. By the path as
    given (asked on every step prompt): kiro's task paths are real paths already (Workspace.resolve_task),
    so a task reached through a symlinked folder names the spec it points into."""
    text = os.fspath(task_path)
    if ".kiro" not in text or "specs" not in text:  # most task files: no Path made and taken apart (~35 K instructions)
        return None
    path = Path(text)
    parts = path.parts
    if len(parts) < 5 or parts[-4:-2] != (".kiro", "specs") or path.name.lower() != "tasks.md":
        return None
    return Spec(project=path.parents[3], folder=path.parent)


def in_spec_folder(task_path: Path | str) -> bool:
    return spec_of(task_path) is not None


def specs_folder(project: Path) -> Path:
    return project / ".kiro" / "specs"


def spec_names(project: Path) -> list[str]:
    """The features of the project's spec folders that have a tasks.md, sorted."""
    folder = specs_folder(project)
    try:
        names = sorted(entry.name for entry in os.scandir(folder) if entry.is_dir())
    except OSError:
        return []
    return [n for n in names if (folder / n / "tasks.md").is_file()]


def find_spec(project: Path, name: str) -> Path | None:
    """`.kiro/specs/<name>/tasks.md` of the project, if there is one (a plain folder name only)."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        return None
    path = specs_folder(project) / name / "tasks.md"
    return path if path.is_file() else None


def _read(path: Path) -> str | None:
    try:
        return safeio.read_bytes(path, limit=DOC_MAX_BYTES).decode("utf-8-sig", errors="replace")
    except (OSError, safeio.UnreadableFile):
        return None


# -- steering --------------------------------------------------------------------------------

class Steering(NamedTuple):
    path: Path
    inclusion: str  # always | fileMatch | manual | auto
    patterns: tuple[str, ...] = ()
    description: str = ""


def _patterns(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(p.strip() for p in value.split(",") if p.strip())
    if isinstance(value, list):
        return tuple(str(p).strip() for p in value if str(p).strip())
    return ()


def steering(project: Path) -> list[Steering]:
    """The project's `.kiro/steering/*.md`, in name order, with how Kiro includes each."""
    folder = project / ".kiro" / "steering"
    try:
        paths = sorted(Path(e.path) for e in os.scandir(folder) if e.name.endswith(".md") and e.is_file())
    except OSError:
        return []
    out = []
    for path in paths:
        text = _read(path)
        try:
            data = frontmatter.read(text).data if text else {}
        except frontmatter.FrontmatterError:
            data = {}
        inclusion = str(data.get("inclusion") or "always").strip()
        lowered = inclusion.lower()
        inclusion = {"filematch": "fileMatch", "manual": "manual", "auto": "auto"}.get(lowered, "always")
        description = data.get("description")
        out.append(Steering(path, inclusion, _patterns(data.get("fileMatchPattern")),
                            description if isinstance(description, str) else ""))
    return out


# The patterns are text, compiled by `re` where first used (and kept in its cache), not at import.
_PATHISH = r"`([^`\s]+)`|([\w@.\-]*[\w\-]/[\w@./\-*]+|[\w@\-]+\.[A-Za-z][\w]{0,7})\b"


def mentioned_files(text: str) -> list[str]:
    """Path-like words of a step's text: backticked names, words with a `/`, names with an extension."""
    out: list[str] = []
    for m in re.finditer(_PATHISH, text):
        word = (m.group(1) or m.group(2) or "").strip(".,;:()[]\"'").lstrip("./")
        if word and word not in out and not re.fullmatch(r"[\d.]+", word):
            out.append(word)
    return out


def _matches(word: str, pattern: str) -> bool:
    pattern = pattern.lstrip("./")
    candidates = {pattern, pattern.replace("**/", ""), pattern.replace("/**", "")}
    base = word.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(word, p) or ("/" not in p and fnmatch.fnmatchcase(base, p)) for p in candidates)


def included(steer: Steering, step_text: str) -> str | None:
    """Why the step's prompt names this steering file ("" for always), or None when it does not."""
    if steer.inclusion == "always":
        return ""
    if steer.inclusion == "auto":
        return f"auto: {steer.description}" if steer.description else "auto"
    if steer.inclusion == "fileMatch":
        for word in mentioned_files(step_text):
            for pattern in steer.patterns:
                if _matches(word, pattern):
                    return f"fileMatch `{pattern}`: the step mentions `{word}`"
    return None


# -- requirements ------------------------------------------------------------------------------

_HEADING = r"^#{2,5}\s+(?:\*\*)?(?:[^\d\n#]{0,24}?)\s*(\d+)(?=[\s.:)*]|$)(.*)$"
_ITEM = r"^\s{0,3}(\d+)[.)]\s+(.+)$"
_CITED = r"(?i)_?\s*Requirements?\s*:?\s*(.+?)_?\s*$"


def cited_ids(details: list[str]) -> list[str]:
    """The requirement ids a step cites in its `_Requirements: 1.1, 2.1_` lines."""
    ids: list[str] = []
    for line in details:
        text = line.strip().lstrip("-*").strip()
        if not re.match(r"_?\s*Requirements?\b", text, re.I):
            continue
        m = re.match(_CITED, text)
        for found in re.findall(r"\d+(?:\.\d+)*", m.group(1) if m else ""):
            if found not in ids:
                ids.append(found)
    return ids


def criteria(text: str) -> dict[str, str]:
    """`{"1": "Requirement 1: Title", "1.1": "WHEN ... SHALL ...", ...}` from a requirements.md as
    Kiro writes it (`### Requirement N` headings, numbered acceptance criteria under each)."""
    out: dict[str, str] = {}
    current: str | None = None
    in_code = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        h = re.match(_HEADING, line)
        if h is not None:
            current = h.group(1)
            out.setdefault(current, line.lstrip("#").strip().strip("*").strip())
            continue
        if current is None:
            continue
        item = re.match(_ITEM, line)
        if item is not None:
            out.setdefault(f"{current}.{item.group(1)}", " ".join(item.group(2).split()))
    return out


def _quotes(spec: Spec, ids: list[str]) -> list[str]:
    text = _read(spec.folder / "requirements.md") if ids else None
    if not text:
        return []
    found = criteria(text)
    lines: list[str] = []
    used = 0
    skipped: list[str] = []
    for rid in ids:
        quote = found.get(rid)
        if quote is None or len(quote) > QUOTE_MAX or used + len(quote) > QUOTES_MAX:
            skipped.append(rid)
            continue
        head = found.get(rid.split(".")[0]) if "." in rid else None
        lines.append(f"- {rid}{f' ({head})' if head else ''}: {quote}")
        used += len(quote)
    if skipped and lines:
        lines.append(f"- not quoted here (long, or not found as numbered criteria): {', '.join(skipped)}")
    return lines


def cited_requirements(task_path: Path | str | None, details: list[str]) -> list[str]:
    """The requirements a step cites (`_Requirements: 1.2_`), each a line quoted from its spec's requirements.md
    ("- 1.2 (Requirement 1: ...): WHEN ... SHALL ..."); the ids alone when they are not found there; [] when
    the step cites none or its task file is in no spec."""
    spec = spec_of(task_path) if task_path is not None else None
    ids = cited_ids(details)
    if spec is None or not ids:
        return []
    return _quotes(spec, ids) or [f"- {rid} (not found as a numbered criterion in requirements.md)" for rid in ids]


def context(task_path: Path | str | None, step_text: str, details: list[str]) -> str | None:
    """The step prompt's section on the spec the task file belongs to, or None outside a spec."""
    spec = spec_of(task_path) if task_path is not None else None
    if spec is None:
        return None
    ids = cited_ids(details)
    out = [f"## Kiro spec `{spec.name}`"]
    docs = [(doc, spec.folder / doc) for doc in SPEC_DOCS if (spec.folder / doc).is_file()]
    if docs:
        out.append("This step is part of a Kiro spec. Read these before you start, and keep to them:")
    cites = f" (this step cites {', '.join(ids)})" if ids else ""
    for doc, path in docs:
        what = f"the requirements{cites}" if doc == "requirements.md" else "the design"
        out.append(f"- `{spec.rel(path)}`: {what}")
    quotes = _quotes(spec, ids)
    if quotes:
        out += ["", "The requirements this step cites, quoted from requirements.md:", *quotes]
    elif ids:
        out += ["", f"Requirements this step cites: {', '.join(ids)}"]
    named = []
    whole = "\n".join([step_text, *details])
    for steer in steering(spec.project):
        why = included(steer, whole)
        if why is not None:
            named.append(f"- `{spec.rel(steer.path)}`" + (f" ({why})" if why else ""))
    if named:
        out += ["", "The project's steering files (Kiro's standing rules for this project; follow them):", *named]
    return "\n".join(out) + "\n\n"
