"""A tree walk without recursion: `os.walk` recurses once per level (Python 3.11), so a 1,500-deep
tree made by the agent or a test fixture ended `list_files` with RecursionError."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

WALK_MAX_DEPTH = 256  # levels below the starting folder that a walk descends


def walk(top: Path | str, max_depth: int = WALK_MAX_DEPTH) -> Iterator[tuple[str, list[str], list[str]]]:
    """`os.walk(top, followlinks=False)`, top-down and in the same order, but with an explicit stack
    and at most `max_depth` levels deep. As with os.walk, the caller may prune `dirs` in place;
    symlinks to folders are listed in `dirs` but not followed; unreadable folders are skipped."""
    stack: list[tuple[str, int]] = [(os.fspath(top), 0)]
    while stack:
        folder, depth = stack.pop()
        dirs: list[str] = []
        files: list[str] = []
        try:
            with os.scandir(folder) as it:
                for entry in it:
                    try:
                        is_dir = entry.is_dir()
                    except OSError:
                        is_dir = False
                    (dirs if is_dir else files).append(entry.name)
        except OSError:
            continue
        yield folder, dirs, files
        if depth >= max_depth:
            continue
        for name in reversed(dirs):
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                stack.append((path, depth + 1))
