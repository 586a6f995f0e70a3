"""The cyclic garbage collector's pace while loops are started and run (issue #12).

CPython's collector runs a young collection every 700 net allocations and, every so often, a full
one that walks every object the process holds. While kiro runs loops, nearly all of its heap lives
as long as the run: the imported modules, pydantic's schemas, the config, and each loop's state,
executor and parsed task file. With 500 loops in one process (bench/many_loops.py on tmpfs, a 13 s
run) the collector ran ~1,000 times for 1.2-1.7 s, its 7 full collections ~1 s of that, and those
freed 73 objects in all. Preparing 1,000 loops in one batch start, its two full collections took
110 ms of a 1.2 s start. So, inside `long_lived()` (`run_loops`, a batch start, the watch supervisor):

- what exists on entry is frozen (`gc.freeze`: left out of every later collection, still freed by
  reference counting as ever);
- a young collection waits for YOUNG_THRESHOLD allocations instead of 700, and the older
  collections, which count young ones, come as many times less often (the older thresholds are
  kept). The same run: ~380 collections, 2 of them full, 0.5-0.6 s in the collector; the start:
  none full, 31 ms. At 10,000, 1,000 loops x 2 steps (bench/many_loops.py, 2026-11-29) still spent
  0.5-0.8 ms of CPU per model call in 185 young and middle collections; at 100,000, 0.3 ms in 92,
  for a peak ~10 MB higher (docs/guides/many-loops.md).

Cycles are still collected, later. On the way out both are put back as they were. Nested use is
counted: only the outermost entry and exit change anything.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import threading
from collections.abc import Callable, Iterator
from functools import wraps
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

YOUNG_THRESHOLD = 100_000

_lock = threading.Lock()
_depth = 0
_saved: tuple[tuple[int, int, int], bool] | None = None  # (thresholds, froze) of the outermost entry


@contextlib.contextmanager
def long_lived() -> Iterator[None]:
    global _depth, _saved
    with _lock:
        _depth += 1
        if _depth == 1:
            thresholds = gc.get_threshold()
            froze = gc.get_freeze_count() == 0  # someone else's freeze is theirs to undo
            if froze:
                gc.freeze()
            gc.set_threshold(max(thresholds[0], YOUNG_THRESHOLD), thresholds[1], thresholds[2])
            _saved = (thresholds, froze)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved is not None:
                (young, middle, old), froze = _saved
                _saved = None
                gc.set_threshold(young, middle, old)
                if froze:
                    gc.unfreeze()


def settled() -> None:
    """Inside `long_lived`, whose entry froze the heap: what was made since lives as long as the run too (the
    loops made ready: kiro's engine and features imported, the config, the state and the events' validators
    built), and is frozen with the rest before the loops run. Elsewhere, nothing."""
    with _lock:
        if _depth and _saved is not None and _saved[1]:
            gc.freeze()


def preparing(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn` makes loops ready and runs them (`kiro loop start`, `resume`): all of it `long_lived`. Making a loop
    ready imports most of kiro (the runner, the engine, its features) and builds the config's, the state's and
    the events' validators: ~50 young and 4 middle collections of a one-step `kiro loop start` walked it and
    freed ~500 objects (issue #41). `run_loops` freezes what was made (`settled`) before the loops run. A call
    with `detach=True` runs no loop here (`kiro serve` starts loops so, in its own long-lived process): the
    collector is left as it is."""

    @wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        if kwargs.get("detach"):
            return fn(*args, **kwargs)
        with long_lived():
            return fn(*args, **kwargs)

    return wrapper


_collecting: bool | None = None  # inside `starting_up`: whether the collector was on when it began


@contextlib.contextmanager
def starting_up() -> Iterator[None]:
    """A command's start-up: no cyclic collection from here until `started()` (the command's body begins) or
    the way out. The start-up imports Typer, pydantic and kiro's modules and builds the parameters' and the
    config's validators; the collector would walk all of it again and again and free nothing (about 13 M
    instructions of `kiro loop status`'s 808 M, issue #41). What was made meanwhile goes to the oldest
    generation uncollected, as if it had survived the young collections; reference counting frees as ever,
    and the next full collection still sees it. A collector that was off on the way in stays off."""
    global _collecting
    if _collecting is not None:  # nested: the outer one decides
        yield
        return
    _collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        started()


def started() -> None:
    """The start-up is over (`starting_up`): the collector back as it was. Outside one, nothing."""
    global _collecting
    if _collecting is None:
        return
    if gc.get_freeze_count() == 0:  # (someone else's freeze is theirs to undo)
        gc.freeze()
        gc.unfreeze()
    if _collecting:
        gc.enable()
    _collecting = None


_exit_left_alone = False


def left_alone_at_exit() -> None:
    """At the interpreter's end (after the atexit handlers registered later, which run first), what the process
    holds is frozen: the collections the interpreter runs as it ends (one full collection, then three more while
    it tears the modules down) walk every object a command made, Typer's, pydantic's and the config's, to free
    nothing a person sees: about 53 M instructions of `kiro loop status`'s 791 M (issue #41). What is not in a
    reference cycle is still freed as the modules are torn down; a cycle left at the end stays for the system to
    take back with the process.
    Python does not promise that `__del__` runs for what exists at exit, and kiro leans on no such `__del__`: it
    closes its files, ends its children and removes its temporary files itself, in its atexit handlers
    (kiro.fs.writer, kiro.processes.sandbox) at the latest. Once a process; a later call, nothing."""
    global _exit_left_alone
    if not _exit_left_alone:
        _exit_left_alone = True
        atexit.register(gc.freeze)
