"""A run's fixed start-up + shutdown: `kiro loop start` on a one-step shell task (`true`), beside
`python -c pass`, in one run.

    python bench/startup.py [--runs 10]

Prints, as medians over fresh processes:
- the whole command's wall time, and what is left after `python -c pass` and the step itself;
- the import of what the command loads (the Typer app, the loop commands, the engine) alone;
- a floor for comparison: importing only the standard library pieces and PyYAML that any run of
  kiro's engine needs whatever its CLI and models are made of (asyncio, subprocess, json, yaml);
- the run itself in a process that has imported everything: prepare_start + run_loops, minus the
  step's own duration (from its `step_completed` event): the fixed cost of a run.
Each run is checked: exit 0, the step done, the task moved to Done/.

    python bench/startup.py --instructions [--previous-tree DIR]

This machine's speed moves by a third from minute to minute, more than most changes to the start-up
make. With --instructions the same runs are counted in instructions instead (valgrind's callgrind,
Debian's `valgrind` package; PYTHONHASHSEED=0): the same count, to a fraction of a percent, run after
run. Printed: `python -c pass`, the floor's imports, `kiro loop start` and, with --previous-tree (a
checkout of an older kiro, e.g. `git worktree add /tmp/old <commit>`), that tree's
`kiro loop start`, run the same way (with this venv's packages).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
TASK = "---\ntitle: One step\nexecutor: shell\n---\n- [ ] 1. Quick\n  ```sh\n  true\n  ```\n"

FLOOR = "import asyncio, asyncio.subprocess, subprocess, json, yaml, threading, queue, fcntl, hashlib"
IN_PROCESS = """
import asyncio, json, sys, time
from pathlib import Path
from kiro.cli import launch  # what `kiro loop start` imports, all of it, before the clock starts
from kiro.core.runner import prepare_start, run_loops
from kiro.store.workspace import Workspace
root = Path(sys.argv[1])
t0 = time.perf_counter()
run = prepare_start(Workspace.find(root), "Specs/a/tasks.md", task_id="t1", config_file=None, overrides={})
outcomes = asyncio.run(run_loops([run], []))
t1 = time.perf_counter()
assert outcomes[0].exit_code == 0, outcomes
print(json.dumps({"run": t1 - t0}))
"""


def timed(argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
          ) -> tuple[float, float, str, str, int]:
    """Wall seconds, CPU seconds (user+sys of the process and its children, from wait4), stdout, stderr,
    exit code of one fresh process. CPU is the steadier figure on a busy machine."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=err, env=env or ENV)
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        return (wall, usage.ru_utime + usage.ru_stime, out.read().decode(), err.read().decode(),
                os.waitstatus_to_exitcode(status))


def fresh(base: Path, n: int) -> Path:
    root = base / f"ws{n}"
    for name in ("Specs/a", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
        (root / name).mkdir(parents=True)
    (root / "Specs" / "a" / "tasks.md").write_text(TASK)
    return root


def step_seconds(root: Path, tid: str) -> float:
    for line in (root / "Logs" / f"{tid}.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e.get("event") == "step_completed":
            return float(e["duration_seconds"])
    raise AssertionError("no step_completed event")


def check(root: Path) -> None:
    assert (root / "Done" / "a" / "tasks.md").read_text().count("[x]") == 1, "the step is not done"


def instructions(argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> int:
    """Instructions one fresh process runs (callgrind's "Collected"), its children not counted."""
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out", *argv], cwd=cwd,
                           env={**(env or ENV), "PYTHONHASHSEED": "0"}, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    for line in r.stderr.splitlines():
        if "Collected :" in line:
            return int(line.rsplit(":", 1)[1])
    raise AssertionError(f"no count from callgrind: {r.stderr[-500:]}")


def count_instructions(previous: Path | None) -> None:
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    py = sys.executable
    start = [py, "-m", "kiro", "loop", "start", "--task", "Specs/a/tasks.md", "--task-id", "t1", "-q"]
    here = str(Path(__file__).resolve().parent.parent)
    cases: list[tuple[str, list[str], dict[str, str], bool]] = [
        ("python -c pass", [py, "-c", "pass"], {}, False),
        ("the floor: " + FLOOR.removeprefix("import "), [py, "-c", FLOOR], {}, False),
        ("kiro loop start", start, {"PYTHONPATH": here}, True),
    ]
    if previous is not None:
        cases.append((f"kiro loop start of {previous}", start, {"PYTHONPATH": str(previous.resolve())}, True))
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        counts: dict[str, int] = {}
        for n, (label, argv, extra, is_start) in enumerate(cases):
            for attempt in range(2):  # the first run of a tree may write its byte-code caches: not counted
                root = fresh(base, 2 * n + attempt) if is_start else None
                counts[label] = instructions(argv, cwd=root, env={**ENV, **extra})
                if root is not None:
                    check(root)
                    shutil.rmtree(root)
    floor = counts["python -c pass"]
    mine = counts["kiro loop start"]
    print("instructions (callgrind; one fresh process each, its children not counted):")
    for label, count in counts.items():
        ratio = f"; {count / mine:.2f}x kiro loop start" if label.startswith("kiro") and count != mine else ""
        beyond = f", {(count - floor) / 1e6:.0f}M beyond python -c pass" if count != floor else ""
        print(f"  {label}: {count / 1e6:.0f}M{beyond}{ratio}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--instructions", action="store_true", help="count instructions with valgrind instead")
    ap.add_argument("--previous-tree", type=Path,
                    help="an older checkout: its `kiro loop start` and fixed run cost, timed beside (taking turns)")
    args = ap.parse_args()
    if args.instructions:
        count_instructions(args.previous_tree)
        return
    runs = args.runs
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        whole, rest, imports, inproc, passes = [], [], [], [], []
        cpu_whole, cpu_imports, cpu_passes, floors, cpu_floors = [], [], [], [], []
        old_whole: list[float] = []
        old_inproc: list[float] = []
        old_env = {**ENV, "PYTHONPATH": str(args.previous_tree.resolve())} if args.previous_tree else None
        for i in range(runs + 1):  # the first round warms the byte-code caches
            p, pc, _o, _e, _c = timed([py, "-c", "pass"])
            root = fresh(base, 4 * i)
            start = [py, "-m", "kiro", "loop", "start", "--task", "Specs/a/tasks.md", "--task-id", "t1", "-q"]
            w, wc, out, err, code = timed(start, cwd=root)
            assert code == 0, out + err
            check(root)
            imp, ic, _o, err, code = timed([py, "-c", "import kiro.cli, kiro.cli.loop, kiro.cli.launch, "
                                                      "kiro.core.runner, kiro.core.engine"])
            assert code == 0, err
            fl, flc, _o, err, code = timed([py, "-c", FLOOR])
            assert code == 0, err
            root2 = fresh(base, 4 * i + 1)
            r2 = subprocess.run([py, "-c", IN_PROCESS, str(root2)], capture_output=True, text=True, env=ENV)
            assert r2.returncode == 0, r2.stderr
            check(root2)
            fixed = json.loads(r2.stdout)["run"] - step_seconds(root2, "t1")
            if old_env is not None:  # the same two, with the older tree's kiro, in the same minute
                root4 = fresh(base, 4 * i + 3)
                ow, _owc, out, err, code = timed(start, cwd=root4, env=old_env)
                assert code == 0, out + err
                check(root4)
                shutil.rmtree(root4)
                root4 = fresh(base, 4 * i + 3)
                r4 = subprocess.run([py, "-c", IN_PROCESS, str(root4)], capture_output=True, text=True, env=old_env,
                                    cwd="/")
                assert r4.returncode == 0, r4.stderr
                check(root4)
                if i:
                    old_whole.append(ow)
                    old_inproc.append(json.loads(r4.stdout)["run"] - step_seconds(root4, "t1"))
                shutil.rmtree(root4)
            if i:
                passes.append(p)
                whole.append(w)
                rest.append(w - p - step_seconds(root, "t1"))
                imports.append(imp - p)
                inproc.append(fixed)
                cpu_passes.append(pc)
                cpu_whole.append(wc)
                cpu_imports.append(ic - pc)
                floors.append(fl - p)
                cpu_floors.append(flc - pc)
            for r in (root, root2):
                shutil.rmtree(r)
        med = statistics.median
        load = os.getloadavg()
        print(f"kiro loop start, one `true` step: {med(whole) * 1000:.0f} ms wall; "
              f"python -c pass {med(passes) * 1000:.0f} ms; "
              f"left after python and the step: {med(rest) * 1000:.0f} ms "
              f"(medians of {runs}, load {load[0]:.2f})")
        print(f"  CPU (user+sys, step included): kiro loop start {med(cpu_whole) * 1000:.0f} ms; "
              f"python -c pass {med(cpu_passes) * 1000:.0f} ms; "
              f"difference {(med(cpu_whole) - med(cpu_passes)) * 1000:.0f} ms")
        print(f"  of which importing the CLI and the engine: {med(imports) * 1000:.0f} ms "
              f"wall, {med(cpu_imports) * 1000:.0f} ms CPU")
        print(f"  the floor, importing only asyncio, subprocess, json and yaml (what the engine needs whatever "
              f"its CLI and models): {med(floors) * 1000:.0f} ms wall, {med(cpu_floors) * 1000:.0f} ms CPU "
              f"beyond python -c pass")
        print(f"  a run's fixed start-up + shutdown (prepare_start + run_loops - the step), imports done: "
              f"{med(inproc) * 1000:.1f} ms (min {min(inproc) * 1000:.1f} ms)")
        if old_env is not None:
            print(f"  {args.previous_tree}, taking turns: kiro loop start {med(old_whole) * 1000:.0f} ms wall "
                  f"(ratio {med(old_whole) / med(whole):.2f}); its fixed start-up + shutdown "
                  f"{med(old_inproc) * 1000:.1f} ms (min {min(old_inproc) * 1000:.1f} ms; ratio "
                  f"{med(old_inproc) / med(inproc):.2f})")


if __name__ == "__main__":
    main()
