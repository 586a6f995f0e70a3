"""What a shell step's events cost kiro's process, in instructions (callgrind; issue #41, session 33).

    python bench/event_cost.py [--iterations 200 700] [--previous-tree DIR]

An iteration of a shell step emits three events (`iteration_started`, `step_started`, `step_completed`). Here
they are built and handed to `Loop.emit` as a loop does, with the listeners that cost something: the event
log (`Logs/<task>.jsonl`, a temporary file) and the console's `EventPrinter` (plain text, as without a
terminal; stdout is /dev/null), beside six listeners that do nothing (the loop's others look at a step's event
and return). The process runs under valgrind's callgrind (PYTHONHASHSEED=0) twice, with few and with many
iterations; the difference of the counts over the difference of the iterations is one iteration's
instructions, start-up cancelled out. Unlike bench/iteration_instructions.py, no timer runs here: the count
does not move with the machine's load. With --previous-tree DIR the same is measured with that tree's kiro.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent.parent


def inner(n: int) -> None:
    from kiro.core.engine import Loop
    from kiro.store import events as ev
    from kiro.store.redact import Redactor
    from kiro.views.console import EventPrinter

    tmp = Path(tempfile.mkdtemp())
    redact = Redactor.from_environment(None)
    log = ev.EventLog(tmp / "task.jsonl", redact)
    printer = EventPrinter()
    printer.plain = True
    loop = SimpleNamespace(settings=SimpleNamespace(log_every_iteration=True), redact=redact, log=log,
                           state=SimpleNamespace(task_id="task_20261130_045148", iteration=0), _finishing=False,
                           listeners=[log, printer, *(lambda e: None for _ in range(6))])

    def one(i: int) -> None:
        loop.state.iteration = i
        Loop.emit(loop, ev.IterationStarted(step_id=str(i)))
        Loop.emit(loop, ev.StepStarted(step_id=str(i), description=f"Step {i}", attempt=1))
        Loop.emit(loop, ev.StepCompleted(step_id=str(i), description=f"Step {i}", duration_seconds=0.047,
                                         attempt=1, checked=[str(i)]))

    for i in range(50 + n):  # the first 50: validators and serializers built, as early in a run
        one(i)
    log.close()
    lines = (tmp / "task.jsonl").read_text().splitlines()
    assert len(lines) == 3 * (50 + n), len(lines)


def count(tree: Path, n: int) -> int:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=str(tree), PYTHONHASHSEED="0")
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "kiro")], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out", sys.executable,
                              str(Path(__file__).resolve()), "--inner", str(n)],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=True)
    found = re.search(r"Collected : (\d+)", out.stderr)
    assert found, out.stderr[-2000:]
    return int(found.group(1))


def per_iteration(tree: Path, few: int, many: int) -> float:
    return (count(tree, many) - count(tree, few)) / (many - few)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, nargs=2, default=(200, 700), metavar=("FEW", "MANY"))
    ap.add_argument("--previous-tree", type=Path)
    ap.add_argument("--inner", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner is not None:
        inner(args.inner)
        return
    few, many = args.iterations
    mine = per_iteration(HERE, few, many)
    print(f"instructions per iteration's three events (emit, the log, the terminal's line): {mine / 1e3:.0f} K")
    if args.previous_tree:
        old = per_iteration(args.previous_tree.resolve(), few, many)
        print(f"  {args.previous_tree}: {old / 1e3:.0f} K; this tree {mine / old:.2f}x, "
              f"{(old - mine) / 1e3:.0f} K less")


if __name__ == "__main__":
    main()
