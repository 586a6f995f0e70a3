"""Where a step's CPU goes, unboxed (issue #41): the event loop thread's CPU time (user and kernel,
`time.thread_time`) per step in each part of the loop, from one `kiro loop start` on N steps of `true`
(`sandbox: off`, as bench/whole_run.py makes it). Thread CPU, not wall: a loaded machine stretches it
far less (say the load anyway). The table of docs/guides/step-cost.md comes from here.

    python bench/step_cost.py [--steps 200] [--tree DIR]

The run is made in a fresh interpreter (`--inner`), which wraps the functions below in a timer before
calling kiro's CLI in-process. Times are inclusive (a part holds its own sub-parts, indented); a
wrapper costs ~1-2 us a call, so parts called many times per step read a little high. What no part
holds (the event loop's own turns, the features' loop, asyncio's tasks) is the rest of `Loop.run`.
The run is checked: exit 0, the task file in Done/ with every box checked.
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent

# (depth in the table, module, attribute path): inclusive parts, a sub-part under its part
PARTS: list[tuple[int, str, str]] = [
    (0, "kiro.core.engine", "Loop.run"),
    (1, "kiro.core.engine", "Loop._iterate"),
    (2, "kiro.processes.spawn", "run_process"),
    (3, "kiro.processes.spawn", "_start"),
    (4, "kiro.processes.spawn", "_check_program"),
    (4, "subprocess", "Popen.__init__"),
    (5, "subprocess", "Popen._execute_child"),
    (4, "kiro.processes.spawn", "Process.__init__"),
    (4, "kiro.processes.groups", "register"),
    (4, "kiro.processes.groups", "_Reaper.send"),  # both lines: register's and Child.release's
    (3, "kiro.processes.spawn", "Watchdog.watch"),
    (3, "kiro.processes.spawn", "Child.release"),
    (2, "kiro.core.engine", "Loop.save"),
    (3, "kiro.store.statestore", "LiveJournal.prepare"),
    (4, "kiro.store.statestore", "LiveJournal._diff"),
    (3, "kiro.store.statestore", "LiveJournal.drain"),
    (4, "kiro.store.statestore", "LiveJournal._sync_first"),
    (4, "kiro.store.statestore", "LiveJournal._append"),
    (5, "kiro.store.statestore", "LiveJournal._summary"),
    (6, "kiro.store.journal", "SummaryWriter.write"),
    (3, "kiro.store.statestore", "LiveJournal.backup_now"),
    (2, "kiro.core.engine", "Loop.emit"),
    (3, "kiro.store.events", "Event.to_record"),  # emit's and the listeners'
    (3, "kiro.views.console", "EventPrinter.__call__"),
    (3, "kiro.store.events", "EventLog.append_record"),
    (3, "kiro.core.evidence", "Evidence._on_event"),
    (4, "kiro.core.evidence", "Evidence._receipt"),
    (3, "kiro.core.listeners", "ReportWriter.__call__"),
    (2, "kiro.core.features", "SealedTaskFiles.check_step"),
    (2, "kiro.store.tasks", "set_marker"),
    (2, "kiro.store.tasks", "mark_done"),
    (3, "kiro.store.tasks", "_edit_boxes"),  # both boxes: set_marker's and mark_done's
    (2, "kiro.executors.base", "ExecutorBase.build_prompts"),
    (1, "kiro.core.features", "SealedTaskFiles.before_step"),
    (2, "kiro.executors.control", "TaskFiles.take"),
    (2, "kiro.store.approval", "step_began"),
    (1, "kiro.core.engine", "Loop._read_task"),
    (1, "kiro.store.tasks", "load"),  # every caller's, the loop's read among them
    (1, "kiro.core.engine", "Loop.interrupt_check"),
    (0, "os", "fdatasync"),
    (0, "os", "fsync"),
]


def make_task(n: int) -> str:
    lines = ["---", "title: bench", "executor: shell", "---"]
    for i in range(1, n + 1):
        lines += [f"- [ ] {i}. Step {i}", "  ```sh", "  true", "  ```"]
    return "\n".join(lines) + "\n"


def inner(out: Path) -> None:
    """In the child: wrap the parts, run `kiro loop start` in-process, write what each part used."""
    spent: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()

    def timed(name: str, fn: Any) -> Any:
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def awrapper(*a: Any, **k: Any) -> Any:
                began = time.thread_time_ns()
                try:
                    return await fn(*a, **k)
                finally:
                    spent[name] += time.thread_time_ns() - began
                    calls[name] += 1
            return awrapper

        @functools.wraps(fn)
        def wrapper(*a: Any, **k: Any) -> Any:
            began = time.thread_time_ns()
            try:
                return fn(*a, **k)
            finally:
                spent[name] += time.thread_time_ns() - began
                calls[name] += 1
        return wrapper

    import kiro.cli  # what the command imports anyway, before the parts are looked up

    for _depth, module, path in PARTS:
        owner: Any = importlib.import_module(module)
        *outer, last = path.split(".")
        try:
            for name in outer:
                owner = getattr(owner, name)
            setattr(owner, last, timed(path, getattr(owner, last)))
        except AttributeError:  # a part an older tree (--tree) does not have: not in its table
            continue
    shell = importlib.import_module("kiro.executors.shell")  # it imported run_process by name
    shell.run_process = importlib.import_module("kiro.processes.spawn").run_process
    sys.argv = ["kiro", "loop", "start", "--task", "Specs/bench/tasks.md"]
    code = 0
    try:
        kiro.cli.main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    out.write_text(json.dumps({"code": code, "main": time.thread_time_ns(), "spent": spent, "calls": calls}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--tree", type=Path, default=HERE, help="the kiro tree to measure (default: this one)")
    ap.add_argument("--inner", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner is not None:
        inner(args.inner)
        return
    with tempfile.TemporaryDirectory(prefix="kiro-stepcost-", dir=os.environ.get("BENCH_TMP")) as tmp:
        root = Path(tmp)
        for name in ("Specs/bench", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
            (root / name).mkdir(parents=True, exist_ok=True)
        (root / "config/autonomous_loop.yaml").write_text("autonomous_loop:\n  max_iterations: 100000\nsandbox: off\n")
        (root / "Specs/bench/tasks.md").write_text(make_task(args.steps))
        out = root / "cost.json"
        env = dict(os.environ, PYTHONPATH=str(args.tree.resolve()))
        env.pop("KIRO_RAISE_ERRORS", None)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--inner", str(out)], cwd=root, env=env,
                           capture_output=True, text=True, timeout=3600)
        assert r.returncode == 0 and out.is_file(), (r.returncode, r.stdout[-1000:], r.stderr[-1000:])
        got = json.loads(out.read_text())
        assert got["code"] == 0, got["code"]
        text = (root / "Done/bench/tasks.md").read_text()
        assert text.count("- [x]") == args.steps and "- [ ]" not in text, "a box is left unchecked"
    n = args.steps
    print(f"{args.tree}: python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d %H:%M')}, load average "
          f"{os.getloadavg()[0]:.2f}; {n} steps of `true`, unboxed; event loop thread CPU "
          f"{got['main'] / 1e6:.0f} ms in all")
    print(f"{'ms/step':>8} {'calls/step':>10}  part (inclusive)")
    for depth, _module, path in PARTS:
        if got["calls"].get(path):
            print(f"{got['spent'][path] / 1e6 / n:8.3f} {got['calls'][path] / n:10.2f}  {'  ' * depth}{path}")


if __name__ == "__main__":
    main()
