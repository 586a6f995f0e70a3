"""The file tools: read_file, write_file, edit_file, list_files, search_files (SPEC §5).

Every path goes through `Confinement` (see `kiro.executors.tools.paths`); every output is bounded and says
when it was cut. Tree walks run in a worker thread with a time limit, so a huge folder cannot
freeze the event loop that also watches for stop hooks.
"""

from __future__ import annotations

import asyncio
import fnmatch
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import regex as re
from pydantic import Field

from kiro.executors.tools.base import Args, Tool, ToolEnv, ToolResult
from kiro.executors.tools.errors import ToolError
from kiro.fs.walk import walk

READ_LIMIT = 100_000  # bytes of a file read_file returns at once
EDIT_LIMIT = 4_000_000  # bytes of a file edit_file will load
WRITE_LIMIT = 2_000_000  # characters write_file accepts
LIST_LIMIT = 1000  # entries list_files returns
SEARCH_MATCH_LIMIT = 200
SEARCH_FILE_BYTES = 2_000_000  # larger files are skipped by search_files
SEARCH_SECONDS = 10.0
MATCH_SECONDS = 1.0  # the longest one regex may run on one line; a pathological pattern is given up on
LINE_CLIP = 300
# Folders that searches skip unless asked for by name: tool caches and dependency trees.
NOISE_DIRS = frozenset({"__pycache__", "node_modules", ".venv", "venv", ".mypy_cache", ".pytest_cache",
                        ".ruff_cache", ".tox", ".hypothesis"})


def _looks_binary(data: bytes) -> bool:
    return b"\x00" in data[:8192]


# -- read_file ------------------------------------------------------------------------------


class ReadFileArgs(Args):
    path: str = Field(description="file path, relative to the project directory")
    start_line: int = Field(1, ge=1, description="first line to return (for reading a long file in parts)")


async def read_file(args: ReadFileArgs, env: ToolEnv) -> ToolResult:
    real = env.confinement.resolve(args.path)
    name = env.confinement.display(real)
    scan = READ_LIMIT if args.start_line == 1 else EDIT_LIMIT
    data, size = await asyncio.to_thread(env.confinement.read_bytes, real, scan + 1)
    if _looks_binary(data):
        raise ToolError(f"{name!r} looks binary ({size} bytes); read_file shows text only")
    if size == 0:
        return ToolResult(f"({name} is empty)")
    lines = data.decode("utf-8", errors="replace").splitlines(keepends=True)
    if args.start_line > 1 and len(data) > scan:
        lines = lines[:-1]  # possibly a torn line at the end of what was scanned
    if args.start_line > len(lines):
        raise ToolError(f"{name!r} has only {len(lines)} lines (scanned) and start_line is {args.start_line}")
    out: list[str] = []
    used = 0
    last = args.start_line - 1
    for i in range(args.start_line - 1, len(lines)):
        line = lines[i]
        if used + len(line) > READ_LIMIT and out:
            break
        out.append(line)
        used += len(line)
        last = i + 1
    text = "".join(out)
    more = last < len(lines) or len(data) > scan
    if more:
        text += (f"\n[truncated: showing lines {args.start_line}-{last} of {name} ({size} bytes); "
                 f"call read_file with start_line={last + 1} to read on]")
    return ToolResult(text)


# -- write_file -----------------------------------------------------------------------------


class WriteFileArgs(Args):
    path: str = Field(description="file path, relative to the project directory; folders are created")
    content: str = Field(max_length=WRITE_LIMIT, description="the complete new content of the file")


async def write_file(args: WriteFileArgs, env: ToolEnv) -> ToolResult:
    real = env.confinement.resolve(args.path, write=True)
    content = env.redact(args.content)
    created = await asyncio.to_thread(env.confinement.write_bytes, real, content.encode("utf-8"))
    verb = "created" if created else "replaced"
    return ToolResult(f"{verb} {env.confinement.display(real)} ({len(content)} characters)")


# -- edit_file ------------------------------------------------------------------------------


class EditFileArgs(Args):
    path: str = Field(description="file path, relative to the project directory")
    old: str = Field(min_length=1, description="the exact text to replace; must occur exactly once")
    new: str = Field(max_length=WRITE_LIMIT, description="the replacement text")


async def edit_file(args: EditFileArgs, env: ToolEnv) -> ToolResult:
    real = env.confinement.resolve(args.path, write=True)
    name = env.confinement.display(real)
    data, size = await asyncio.to_thread(env.confinement.read_bytes, real, EDIT_LIMIT + 1)
    if size > EDIT_LIMIT:
        raise ToolError(f"{name!r} is too large to edit ({size} bytes); write it whole with write_file")
    if _looks_binary(data):
        raise ToolError(f"{name!r} looks binary; edit_file edits text only")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"{name!r} is not UTF-8 text; edit_file edits UTF-8 text only") from None
    count = text.count(args.old)
    if count == 0:
        hint = ""
        first = args.old.strip().splitlines()[0].strip() if args.old.strip() else ""
        if first and first in text:
            hint = " (its first line occurs, so check the whitespace and the lines after it)"
        raise ToolError(f"the old text was not found in {name!r}{hint}; it must match exactly, "
                        f"whitespace included; read_file shows the current text")
    if count > 1:
        raise ToolError(f"the old text occurs {count} times in {name!r}; include more surrounding lines "
                        f"so that it occurs exactly once")
    updated = text.replace(args.old, env.redact(args.new), 1)
    await asyncio.to_thread(env.confinement.write_bytes, real, updated.encode("utf-8"))
    return ToolResult(f"edited {name}: replaced 1 occurrence ({len(args.old)} -> {len(args.new)} characters)")


# -- list_files -----------------------------------------------------------------------------


class ListFilesArgs(Args):
    path: str = Field(".", description="folder, relative to the project directory")
    pattern: str | None = Field(
        None, description="glob such as '*.py' or 'src/*.md'; with a pattern the listing is recursive "
                          "(a pattern without '/' matches file names, one with '/' the relative path)")


def _list(env: ToolEnv, real: Path, pattern: str | None, deadline: float) -> tuple[list[str], bool]:
    conf = env.confinement
    entries: list[str] = []
    if pattern is None:
        with os.scandir(real) as it:
            items = sorted(it, key=lambda e: e.name)
        for entry in items:
            path = real / entry.name
            if conf.is_hidden(path):
                continue
            if entry.is_symlink():
                entries.append(conf.display(path) + "@")
            elif entry.is_dir(follow_symlinks=False):
                entries.append(conf.display(path) + "/")
            else:
                entries.append(conf.display(path))
            if len(entries) >= LIST_LIMIT:
                return entries, True
        return entries, False
    for folder, dirs, files in walk(real):
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if not conf.is_hidden(here / d))
        for name in sorted(files + dirs):
            path = here / name
            rel = path.relative_to(real).as_posix()
            target = rel if "/" in pattern else name
            if fnmatch.fnmatchcase(target, pattern):
                entries.append(conf.display(path) + ("/" if name in dirs else ""))
                if len(entries) >= LIST_LIMIT:
                    return entries, True
        if time.monotonic() > deadline:
            return entries, True
    return entries, False


async def list_files(args: ListFilesArgs, env: ToolEnv) -> ToolResult:
    real = env.confinement.resolve(args.path)
    name = env.confinement.display(real)
    if not real.exists():
        raise ToolError(f"{name!r} does not exist")
    if not real.is_dir():
        raise ToolError(f"{name!r} is a file, not a folder; use read_file")
    entries, cut = await asyncio.to_thread(_list, env, real, args.pattern, time.monotonic() + SEARCH_SECONDS)
    if not entries:
        return ToolResult(f"no entries in {name}" + (f" matching {args.pattern!r}" if args.pattern else ""))
    text = "\n".join(entries)
    if cut:
        text += f"\n[truncated: first {len(entries)} entries shown; narrow it with path or pattern]"
    return ToolResult(text)


# -- search_files ---------------------------------------------------------------------------


class SearchFilesArgs(Args):
    pattern: str = Field(min_length=1, max_length=1000,
                         description="Python regular expression (or plain text) to find")
    path: str = Field(".", description="folder or file to search, relative to the project directory")


class _TooSlow(Exception):
    pass


@dataclass
class _Progress:
    """Shared between the search thread and the tool: when the current match began, and whether
    the tool has given up on the search (the thread then stops at its next line)."""

    match_started: float | None = None
    abandoned: bool = False


def _search(env: ToolEnv, real: Path, pattern: re.Pattern[str], deadline: float,
            progress: _Progress) -> tuple[list[str], str | None]:
    """Runs in a worker thread. The `regex` module releases the GIL while it matches and stops a
    match after MATCH_SECONDS (`timeout=`), so a catastrophic pattern neither blocks the event
    loop nor runs on for ever."""
    conf = env.confinement
    matches: list[str] = []
    size_out = 0

    def scan(path: Path) -> bool:
        nonlocal size_out
        try:
            target = conf.resolve(str(path))  # a symlinked file pointing out is skipped here
            data, size = conf.read_bytes(target, SEARCH_FILE_BYTES + 1)
        except (ToolError, OSError):
            return True
        if size > SEARCH_FILE_BYTES or _looks_binary(data):
            return True
        for no, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if progress.abandoned:
                return False
            progress.match_started = time.monotonic()
            try:
                # regex checks its clock only now and then: a timeout of t ends after about 4 t
                found = pattern.search(line, timeout=MATCH_SECONDS / 4, concurrent=True)
            except TimeoutError:
                raise _TooSlow(f"{conf.display(path)}:{no}") from None
            finally:
                progress.match_started = None
            if found:
                shown = line if len(line) <= LINE_CLIP else line[:LINE_CLIP] + "…"
                entry = f"{conf.display(path)}:{no}: {shown}"
                matches.append(entry)
                size_out += len(entry)
                if len(matches) >= SEARCH_MATCH_LIMIT or size_out > 100_000:
                    return False
        return True

    if real.is_file():
        scan(real)
        return matches, ("match limit" if len(matches) >= SEARCH_MATCH_LIMIT else None)
    for folder, dirs, files in walk(real):
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if d not in NOISE_DIRS and not conf.is_hidden(here / d))
        for name in sorted(files):
            if not scan(here / name):
                return matches, "match limit"
            if time.monotonic() > deadline:
                return matches, f"time limit ({SEARCH_SECONDS:g} s)"
    return matches, None


def _too_slow(pattern: str, where: str) -> ToolError:
    return ToolError(f"search_files gave up: the pattern {pattern!r} ran for more than {MATCH_SECONDS:g} s on one "
                     f"line ({where}); it backtracks catastrophically (nested repeats such as '(a+)+'). "
                     f"Use a simpler pattern or plain text")


async def search_files(args: SearchFilesArgs, env: ToolEnv) -> ToolResult:
    real = env.confinement.resolve(args.path)
    name = env.confinement.display(real)
    if not real.exists():
        raise ToolError(f"{name!r} does not exist")
    note = ""
    try:
        pattern = re.compile(args.pattern)
    except (re.error, RecursionError, OverflowError, ValueError) as exc:
        pattern = re.compile(re.escape(args.pattern))
        note = f"(not a valid regular expression: {exc}; searched for the literal text)\n"
    progress = _Progress()
    work = asyncio.ensure_future(asyncio.to_thread(_search, env, real, pattern,
                                                   time.monotonic() + SEARCH_SECONDS, progress))
    work.add_done_callback(lambda f: f.cancelled() or f.exception())  # an abandoned search's end is not news
    try:
        # Watch the thread: a match running past MATCH_SECONDS ends the tool call at once, even
        # before the regex engine notices its own timeout (it checks the clock only now and then).
        while not work.done():
            await asyncio.wait({work}, timeout=0.05)
            started = progress.match_started
            if not work.done() and started is not None and time.monotonic() - started > MATCH_SECONDS:
                progress.abandoned = True
                raise _too_slow(args.pattern, "a line still being matched")
        matches, cut = work.result()
    except _TooSlow as exc:
        raise _too_slow(args.pattern, str(exc)) from None
    finally:
        progress.abandoned = progress.abandoned or not work.done()
    if not matches:
        return ToolResult(note + f"no matches for {args.pattern!r} in {name}")
    text = note + "\n".join(matches)
    if cut:
        text += f"\n[truncated at {len(matches)} matches ({cut}); narrow the pattern or the path]"
    return ToolResult(text)


TOOLS: tuple[Tool[Any], ...] = (
    Tool("read_file", "Read a text file of the project (bounded; long files in parts with start_line).",
         ReadFileArgs, read_file),
    Tool("write_file", "Create a file or replace its whole content. Folders are created as needed.",
         WriteFileArgs, write_file),
    Tool("edit_file", "Replace one exact occurrence of `old` with `new` in a file.", EditFileArgs, edit_file),
    Tool("list_files", "List the files and folders under a folder (folders end in '/').",
         ListFilesArgs, list_files),
    Tool("search_files", "Find the lines matching a regular expression in the files under a folder.",
         SearchFilesArgs, search_files),
)
