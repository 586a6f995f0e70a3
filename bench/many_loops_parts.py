"""Where the event loop thread's CPU goes when many loops run in one process: bench/many_loops.py, run in this
process with ~40 of kiro's functions (those a step of the openai executor calls, and `Loop.emit` by event kind)
wrapped in a meter of the calling thread's CPU (`time.thread_time_ns`), counted on the main thread only.

    python bench/many_loops_parts.py [--loops 1000] [--steps 10] [many_loops.py's other options]

Prints many_loops.py's report, then each part's CPU and calls per model call, largest first. Figures are
inclusive (a part holds the parts it calls) and only sync functions are metered (an `async def`'s time would
hold the other loops' turns while it waits). A wrapper costs ~1 us a call. A part not found in the tree (renamed,
or an older tree) is named on stderr and skipped; a module that imported a function by name before the wrap keeps
the unwrapped one.
"""

from __future__ import annotations

import collections
import importlib
import runpy
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

PARTS: list[tuple[str, str]] = [
    ("kiro.core.engine", "Loop.emit"), ("kiro.core.engine", "Loop.save"), ("kiro.core.engine", "Loop.interrupt_check"),
    ("kiro.core.engine", "Loop._record_success"), ("kiro.core.engine", "Loop.take_messages"),
    ("kiro.core.engine", "StepContext.redacted"),
    ("kiro.core.listeners", "ReportWriter._final"), ("kiro.core.listeners", "DoneMover._move"),
    ("kiro.core.listeners", "ReportWriter._progress"), ("kiro.core.listeners", "DashboardFeed.saved"),
    ("kiro.core.digest", "DigestFeed.__call__"), ("kiro.core.evidence", "Evidence._on_event"),
    ("kiro.core.review", "Review._on_event"),
    ("kiro.executors.control", "TaskFiles.check"), ("kiro.executors.control", "TaskFiles.take"),
    ("kiro.executors.control", "Look.now"),
    ("kiro.executors.base", "ExecutorBase.build_prompts"), ("kiro.executors.base", "StepResult.redact"),
    ("kiro.executors.prompts", "system_prompt"), ("kiro.executors.prompts", "step_prompt"),
    ("kiro.executors.openai_agent", "_Attempt.__init__"), ("kiro.executors.openai_agent", "_Attempt.record"),
    ("kiro.executors.openai_agent", "_Attempt.count"), ("kiro.executors.openai_agent", "_Attempt.tool_calls"),
    ("kiro.executors.openai_agent", "_Attempt.text_of"), ("kiro.executors.openai_agent", "SharedClient.encode"),
    ("kiro.executors.openai_agent", "_completion"),
    ("kiro.store.tasks", "set_marker"), ("kiro.store.tasks", "mark_done"), ("kiro.store.tasks", "load"),
    ("kiro.store.approval", "step_began"), ("kiro.store.approval", "step_ended"),
    ("kiro.store.events", "Event.stamped"), ("kiro.store.events", "EventLog.append_record"),
    ("kiro.store.redact", "Redactor.record"), ("kiro.store.transcript", "Transcript.write"),
]

spent: collections.Counter[str] = collections.Counter()
calls: collections.Counter[str] = collections.Counter()
MAIN = threading.main_thread()


def metered(key: str, fn: Any) -> Any:
    by_kind = key == "Loop.emit"

    def timed(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not MAIN:
            return fn(*args, **kwargs)
        began = time.thread_time_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            name = f"Loop.emit {type(args[1]).__name__}" if by_kind else key
            spent[name] += time.thread_time_ns() - began
            calls[name] += 1
    return timed


def wrap() -> None:
    for module, path in PARTS:
        try:
            owner: Any = importlib.import_module(module)
            *outer, name = path.split(".")
            for part in outer:
                owner = getattr(owner, part)
            raw = vars(owner)[name] if isinstance(owner, type) else getattr(owner, name)
        except (ImportError, AttributeError, KeyError) as exc:
            print(f"not metered: {module}.{path} ({exc!r})", file=sys.stderr)
            continue
        if isinstance(raw, classmethod | staticmethod):
            setattr(owner, name, type(raw)(metered(path, raw.__func__)))
        else:
            setattr(owner, name, metered(path, raw))


def main() -> None:
    wrap()
    sys.argv = [str(HERE / "many_loops.py"), *sys.argv[1:]]
    answered = 0
    try:
        runpy.run_path(str(HERE / "many_loops.py"), run_name="__main__")
    except SystemExit as exc:
        if exc.code:
            raise
    answered = calls["_Attempt.count"] or 1  # one a model call answered
    print(f"parts of the event loop thread's CPU, per model call ({answered} calls):")
    for name, ns in spent.most_common():
        print(f"  {ns / 1000 / answered:8.1f} us  {calls[name] / answered:5.2f} a call  {name}")


if __name__ == "__main__":
    main()
