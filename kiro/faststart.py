"""`kiro loop start` and `kiro loop resume` without Typer (issue #12: a run's fixed start-up).

Building the Typer app and reading the command line through it costs ~50 ms per run on this
machine, a seventh of a one-step run. A plain start or resume command line (the options of
`kiro loop start -h` / `resume -h`, each spelled as there, with a value that needs no judgement) is
read here and handed to the same code the Typer command calls (kiro.launch). Anything else (help,
an option this module does not know, a value Typer would have to judge: empty, starting with `-`,
a number not written as plain digits) returns None before anything is done, and Typer reads the
command line and says what it always says. KIRO_NO_FAST_START=1 always leaves it to Typer
(tests/test_faststart.py runs the same command lines both ways and compares).
"""

from __future__ import annotations

import os
from pathlib import Path

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from typing import Any


class Fallback(Exception):
    """Typer reads this command line."""


_COMMON = {
    "--workspace": ("workspace_path", Path), "-w": ("workspace_path", Path), "--config": ("config", Path),
    "--max-iterations": ("max_iterations", int), "--failure-threshold": ("failure_threshold", int),
    "--timeout": ("timeout", float), "--executor": ("executor", str), "--model": ("model", str),
    "--agent": ("agent", str), "--task-id": ("task_id", str),
    "--detach": ("detached", bool), "--quiet": ("quiet", bool), "-q": ("quiet", bool),
    "--verbose": ("verbose", bool), "-v": ("verbose", bool),
}
OPTIONS: dict[str, dict[str, tuple[str, type]]] = {
    "start": {**_COMMON, "--task": ("task", list), "-t": ("task", list)},
    "resume": {**_COMMON, "--task": ("task", str), "--reset-failures": ("reset_failures", bool),
               "--all": ("all_loops", bool)},
}


def run(argv: list[str]) -> int | None:
    """Run `kiro loop start|resume ...` and return its exit code, or None (nothing done) for Typer."""
    if len(argv) < 2 or argv[0] != "loop" or argv[1] not in OPTIONS or os.environ.get("KIRO_NO_FAST_START"):
        return None
    try:
        options = parse(argv[1], argv[2:])
    except Fallback:
        return None
    import gc

    enabled = gc.isenabled()
    gc.disable()  # importing the engine makes ~200k objects that live as long as the run, and no garbage
    try:
        from kiro import launch, runner  # noqa: F401 - imported here to be left out of every collection
    finally:
        gc.freeze()  # what the imports made: never walked by a collection again
        if enabled:
            gc.enable()
    return launch.guarded_run(launch.start if argv[1] == "start" else launch.resume, **options)


def parse(command: str, args: list[str]) -> dict[str, Any]:
    """The options of `kiro loop <command>`, as Typer would pass them; anything unusual is a Fallback."""
    known = OPTIONS[command]
    options: dict[str, Any] = {}
    i = 0
    while i < len(args):
        name, eq, value = args[i].partition("=") if args[i].startswith("--") else (args[i], "", "")
        if name not in known:
            raise Fallback  # help, a positional argument, `--`, `-qv`, `-tFILE`, an unknown option: Typer's
        key, kind = known[name]
        if kind is bool:
            if eq:
                raise Fallback
            options[key] = True
        else:
            if not eq:
                if i + 1 >= len(args):
                    raise Fallback
                i += 1
                value = args[i]
            if kind is list:
                options.setdefault(key, []).append(_value(value, str))
            else:
                options[key] = _value(value, kind)  # given twice, the last one counts, as in Typer
        i += 1
    if command == "start" and not options.get("task"):
        raise Fallback  # Typer says that --task is missing
    return options


def _value(text: str, kind: type) -> Any:
    if not text or text.startswith("-") or text != text.strip():
        raise Fallback
    if kind is int:
        if not (text.isascii() and text.isdigit()):
            raise Fallback
        return int(text)
    if kind is float:
        whole, _dot, part = text.partition(".")
        if not ((whole + part).isascii() and (whole + part).isdigit()):
            raise Fallback
        return float(text)
    return kind(text)
