"""What kiro's one spawn path costs a step, alone: N runs of `true` through `run_process` (as a shell step
calls it: a timeout, the loop's cancel event) in one fresh interpreter, the trees taking turns.

    python bench/run_process_cost.py [--runs 300] [--rounds 3] [--previous-tree DIR]

Prints, per run: the calling (event loop) thread's CPU (`time.thread_time`), and the whole process's CPU
(user+sys of kiro's process, its threads included; the children's own CPU apart). Thread CPU is the figure
a loaded machine moves least; say the load anyway. Asserts every run's exit status and output.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

INNER = """
import asyncio, json, resource, sys, time
from pathlib import Path
from kiro.processes.spawn import run_process

async def main(n):
    cancel = asyncio.Event()
    await run_process(["true"], cwd=Path("."), timeout=60, cancel=cancel)  # the reaper started, the caches warm
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.thread_time()
    for _ in range(n):
        result = await run_process(["sh", "-c", "echo ok"], cwd=Path("."), timeout=60, cancel=cancel)
        assert (result.returncode, result.output) == (0, "ok\\n"), result
    t1, r1 = time.thread_time(), resource.getrusage(resource.RUSAGE_SELF)
    own = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    print(json.dumps({"thread": (t1 - t0) / n * 1e3, "process": own / n * 1e3}))

asyncio.run(main(int(sys.argv[1])))
"""


def one(tree: Path, runs: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree.resolve()))
    out = subprocess.run([sys.executable, "-c", INNER, str(runs)], env=env, capture_output=True, text=True,
                         check=True, timeout=600)
    return dict(json.loads(out.stdout.splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--previous-tree", type=Path)
    args = ap.parse_args()
    trees = [HERE] + ([args.previous_tree] if args.previous_tree else [])
    got: dict[Path, list[dict[str, float]]] = {t: [] for t in trees}
    loads = []
    for _ in range(args.rounds):
        for tree in trees:
            loads.append(os.getloadavg()[0])
            got[tree].append(one(tree, args.runs))
    print(f"python {sys.version.split()[0]}, load average {min(loads):.2f}-{max(loads):.2f}; {args.runs} runs of "
          f"`sh -c 'echo ok'` through run_process, ms of CPU per run, each round")
    for tree in trees:
        thread = " ".join(f"{r['thread']:.3f}" for r in got[tree])
        process = " ".join(f"{r['process']:.3f}" for r in got[tree])
        print(f"  {str(tree):24s} thread {thread}   process {process}")


if __name__ == "__main__":
    main()
