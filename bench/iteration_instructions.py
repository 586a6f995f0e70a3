"""What one loop iteration costs in instructions: a figure this machine's moods do not move.

    python bench/iteration_instructions.py [--steps 20 120] [--done N] [--previous-tree DIR]

bench/loop_overhead.py times iterations; on this machine their time moves by a third from minute to
minute, more than most changes to the loop make. Here `kiro loop start` runs a task of shell steps
(`true`) under valgrind's callgrind (Debian's `valgrind` package; PYTHONHASHSEED=0), once with few steps
and once with more, durability on; the difference of the two counts divided by the difference of the
steps is what an iteration costs kiro's process in instructions: reading the task file, the box edits,
the state saves and events, and spawning the step (the `true` itself runs in a child, not counted).
Start-up and shutdown cancel out. The count repeats to a fraction of a percent run after run.
With --done N the task file begins with N steps already checked (a long task well under way: at
--done 4900 the file is as big as bench/loop_overhead.py's 5,000 steps), so the figure shows what
an iteration's cost grows with the size of the task file.

With --previous-tree DIR (a checkout of an older kiro, e.g. `git worktree add /tmp/old <commit>`) the
same runs are made with that tree, and the ratio is printed. Each run is checked: every box checked.

With --sandbox off the config says `sandbox: off`: the figure leaves out the step box (bwrap's command line,
its control folders, pasta for its network), which is on by default where bwrap is usable since the sandbox
landed (523f972, 2026-11-27); a tree older than that has no box, so only `--sandbox off` compares like with
like.

Work kiro does on a wall-clock timer comes ~50x more often per step under callgrind (its runs are that much
slower), and as often as the machine's load makes a run slow: the state file's snapshot (once a second,
O(history)) and the change hub's watchfiles thread (it takes the GIL every 5 ms). They moved the figure by
±0.6 M an iteration from run to run (docs/guides/step-cost.md, "Session 33: the save"), more than most cuts.
So both trees run with those clocks held still (`HOLD`, set before `kiro` runs; a tree without one of them
skips it): the figure weighs the loop's own work, ~0.55 M an iteration lower, and moves less with the load,
not to nothing (docs/guides/step-cost.md "Session 34: tidy": take turns between trees and repeat).
--live-timers runs kiro as it is.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
HERE = Path(__file__).resolve().parent.parent
# `python -c HOLD loop start ...`: kiro as `python -m kiro` runs it, its wall-clock timers held still first: the
# state file's snapshot every SNAPSHOT_SECONDS (an hour: never within a bench run), the watchfiles thread's
# wake-up every STEP_MS (a second). Set in both trees alike, where the tree has them.
HOLD = """
import runpy, sys
for module, name, value in (("kiro.store.journal", "SNAPSHOT_SECONDS", 3600.0), ("kiro.core.watch", "STEP_MS", 1000)):
    try:
        held = __import__(module, fromlist=["_"])
    except ImportError:
        continue
    if hasattr(held, name):
        setattr(held, name, value)
sys.argv[0] = "kiro"
runpy.run_module("kiro", run_name="__main__", alter_sys=True)
"""


def task(n: int, done: int = 0) -> str:
    lines = ["---", "title: bench", "executor: shell", "---"]
    for i in range(1, done + 1):
        lines += [f"- [x] d{i}. Done {i}", "  ```sh", "  true", "  ```"]
    for i in range(1, n + 1):
        lines += [f"- [ ] {i}. Step {i}", "  ```sh", "  true", "  ```"]
    return "\n".join(lines) + "\n"


def count(tree: Path, steps: int, done: int = 0, sandbox: str | None = None, held: bool = True,
          network: str | None = None) -> int:
    """Instructions of one `kiro loop start` of `steps` steps, with `tree`'s kiro (`sandbox`: the config's
    `sandbox:`, None for the default; left out for a tree from before the box, which would refuse the key;
    `held`: its timers held still, `HOLD`; `network`: the config's `sandbox_network:`, None for the default)."""
    if not (tree / "kiro/processes/sandbox.py").exists():
        sandbox = None
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ws"
        for name in ("Specs/a", "config"):
            (root / name).mkdir(parents=True)
        (root / "config/autonomous_loop.yaml").write_text("autonomous_loop:\n  max_iterations: 100000\n"
                                                          + (f"sandbox: {sandbox}\n" if sandbox else "")
                                                          + (f"sandbox_network: {network}\n" if network else ""))
        (root / "Specs/a/tasks.md").write_text(task(steps, done))
        kiro = ["-c", HOLD] if held else ["-m", "kiro"]
        r = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out", sys.executable,
                            *kiro, "loop", "start", "--task", "Specs/a/tasks.md", "-q"], cwd=root,
                           env={**ENV, "PYTHONHASHSEED": "0", "PYTHONPATH": str(tree)}, capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stdout + r.stderr[-2000:]
        pre = done
        done_text = (root / "Done/a/tasks.md").read_text()
        assert done_text.count("- [x]") == steps + pre, "not every step was done"
        for line in r.stderr.splitlines():
            if "Collected :" in line:
                return int(line.rsplit(":", 1)[1])
    raise AssertionError("no count from callgrind")


def per_iteration(tree: Path, few: int, many: int, done: int, sandbox: str | None,
                  held: bool = True, network: str | None = None) -> tuple[float, int, int]:
    count(tree, 1, sandbox=sandbox, held=held, network=network)  # byte-code caches written, not counted
    a, b = count(tree, few, done, sandbox, held, network), count(tree, many, done, sandbox, held, network)
    return (b - a) / (many - few), a, b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, nargs=2, default=(20, 120), metavar=("FEW", "MANY"))
    ap.add_argument("--done", type=int, default=0, metavar="N", help="steps already checked at the top of the task")
    ap.add_argument("--previous-tree", type=Path)
    ap.add_argument("--sandbox", choices=("off", "bwrap"), help="the config's `sandbox:` (default: kiro's default)")
    ap.add_argument("--network", choices=("on", "off", "host"),
                    help="the config's `sandbox_network:` for a boxed run (default: kiro's default)")
    ap.add_argument("--live-timers", action="store_true",
                    help="run kiro's wall-clock timers as they are (the figure then moves with the load)")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("this bench needs valgrind (apt-get install valgrind)")
    few, many = args.steps
    trees = [("this tree", HERE)]
    if args.previous_tree is not None:
        trees.append((str(args.previous_tree), args.previous_tree.resolve()))
    held = not args.live_timers
    results = {label: per_iteration(tree, few, many, args.done, args.sandbox, held, args.network)
               for label, tree in trees}
    print(f"instructions per loop iteration, shell steps running `true` (callgrind, kiro's process; "
          f"runs of {few} and {many} steps{f', after {args.done} steps already done' if args.done else ''}; "
          f"sandbox: {args.sandbox or 'default'}{f', network {args.network}' if args.network else ''}; "
          f"timers {'held' if held else 'live'}):")
    mine = results["this tree"][0]
    for label, (each, a, b) in results.items():
        ratio = f"; {each / mine:.2f}x this tree" if label != "this tree" else ""
        print(f"  {label}: {each / 1e6:.2f}M per iteration ({few} steps {a / 1e6:.0f}M, {many} steps "
              f"{b / 1e6:.0f}M){ratio}")


if __name__ == "__main__":
    main()
