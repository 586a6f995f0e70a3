"""A loop's overhead per iteration as a person waits for it (issue #41's whole-run method): the wall
time of `kiro loop start` on N steps of `true`, unboxed, minus N spawns of `bash -c true`, divided by N.
kiro's start, its exit and its spawn path all count (bench/loop_overhead.py's in-loop figure leaves
them out).

    python bench/whole_run.py [--steps 200] [--big 5000] [--rounds 3] [--previous-tree ../kiro-previous]

Runs, in a fresh `python -m kiro` each (the tree's kiro first on PYTHONPATH, this venv's packages):

    N steps        an N-step task file (`sandbox: off`), every step run
    BIG steps      a BIG-step task file whose first BIG-N boxes are checked: the last N run

Each run is checked: exit 0 and the task file in Done/ with every box checked. The spawns of `bash -c
true` are timed in this process (subprocess.run, one after the other) beside each run, so both meet
the same minute of a shared machine. With --previous-tree (one or more) the trees take turns, round by round; the
medians are printed side by side with the load average.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def make_task(n: int, done: int = 0) -> str:
    lines = ["---", "title: bench", "executor: shell", "---"]
    for i in range(1, n + 1):
        lines += [f"- [{'x' if i <= done else ' '}] {i}. Step {i}", "  ```sh", "  true", "  ```"]
    return "\n".join(lines) + "\n"


def cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def spawns(n: int) -> tuple[float, float]:
    """Seconds (wall, CPU: this process and its children) for `n` spawns of `bash -c true`, one after the other."""
    began, used = time.perf_counter(), cpu(resource.RUSAGE_SELF) + cpu(resource.RUSAGE_CHILDREN)
    for _ in range(n):
        subprocess.run(["bash", "-c", "true"], check=True)
    return time.perf_counter() - began, cpu(resource.RUSAGE_SELF) + cpu(resource.RUSAGE_CHILDREN) - used


def one_run(tree: Path, steps: int, done: int, settings: str = "sandbox: off\n") -> tuple[float, float]:
    """The wall and CPU time (kiro's and its children's) of `kiro loop start` on the task (checked: exit 0,
    every box checked, in Done/). `settings`: more of the config, unboxed by default (bench/box_whole_run.py
    boxes it)."""
    with tempfile.TemporaryDirectory(prefix="kiro-whole-", dir=os.environ.get("BENCH_TMP")) as tmp:
        root = Path(tmp)
        for name in ("Specs/bench", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
            (root / name).mkdir(parents=True, exist_ok=True)
        (root / "config/autonomous_loop.yaml").write_text(
            "autonomous_loop:\n  max_iterations: 100000\n" + settings)
        (root / "Specs/bench/tasks.md").write_text(make_task(steps, done))
        env = dict(os.environ, PYTHONPATH=str(tree.resolve()))
        env.pop("KIRO_RAISE_ERRORS", None)
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # byte code cached, as a normal install has it (not compiled each run)
        began, used = time.perf_counter(), cpu(resource.RUSAGE_CHILDREN)
        r = subprocess.run([sys.executable, "-m", "kiro", "loop", "start", "--task", "Specs/bench/tasks.md"],
                           cwd=root, env=env, capture_output=True, text=True, timeout=3600)
        wall, spent = time.perf_counter() - began, cpu(resource.RUSAGE_CHILDREN) - used
        assert r.returncode == 0, (tree, r.returncode, r.stdout[-1000:], r.stderr[-1000:])
        final = root / "Done/bench/tasks.md"
        assert final.is_file(), f"{tree}: the task is not in Done/"
        text = final.read_text()
        assert text.count("- [x]") == steps and "- [ ]" not in text, f"{tree}: a box is left unchecked"
        return wall, spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--big", type=int, default=5000, help="0: no big-file run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--previous-tree", type=Path, action="append", default=[],
                    help="another tree to run in turn with this one (repeat it for more)")
    args = ap.parse_args()
    trees = [HERE, *args.previous_tree]
    cases = [(f"{args.steps} steps", args.steps, 0)]
    if args.big:
        cases.append((f"{args.big:,} steps", args.big, args.big - args.steps))
    loads = [os.getloadavg()[0]]
    per: dict[tuple[str, Path], list[float]] = {}
    per_cpu: dict[tuple[str, Path], list[float]] = {}
    walls: dict[tuple[str, Path], list[float]] = {}
    for _ in range(args.rounds):
        for label, steps, done in cases:
            for tree in trees:
                wall, spent = one_run(tree, steps, done)
                floor, floor_cpu = spawns(steps - done)
                per.setdefault((label, tree), []).append((wall - floor) / (steps - done) * 1000)
                per_cpu.setdefault((label, tree), []).append((spent - floor_cpu) / (steps - done) * 1000)
                walls.setdefault((label, tree), []).append(wall)
                loads.append(os.getloadavg()[0])
    print(f"python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d %H:%M')}, load average "
          f"{min(loads):.2f}-{max(loads):.2f}; medians of {args.rounds} rounds, the trees taking turns; "
          f"per iteration = (wall of `kiro loop start` - spawns of `bash -c true`) / steps run, unboxed; "
          f"CPU the same with the CPU time of kiro and its children")
    for label, _steps, _done in cases:
        cells = []
        for tree in trees:
            ms = statistics.median(per[(label, tree)])
            cells.append(f"{tree}: {ms:.2f} ms per iteration, CPU {statistics.median(per_cpu[(label, tree)]):.2f} ms "
                         f"(wall {statistics.median(walls[(label, tree)]):.2f} s; "
                         f"rounds {', '.join(f'{v:.2f}' for v in per[(label, tree)])})")
        print(f"{label:>12}: " + " | ".join(cells))


if __name__ == "__main__":
    main()
