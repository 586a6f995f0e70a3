"""SPEC §15's look around one step, alone (issue #41): `TaskFiles.take` before the step, a one-byte write to
the loop's own task file (its `[-]`), `.check` after the step, a one-byte write back; the event loop thread's
CPU time per pair (`time.thread_time`), in a workspace with one task file of N steps (`make_task` of
bench/step_cost.py). The figures of docs/guides/step-cost.md's session 28 come from here.

    python bench/step_look.py [--pairs 3000] [--rounds 3] [--previous-tree DIR]

The folders are left alone 2.5 s first, as a running loop's are (kiro.fs.statcache lists a folder changed in
the last 2 s again at every look). Each round runs in a fresh interpreter per tree (the tree's kiro first on
PYTHONPATH), the trees taking turns.
Each pair is checked: the look after the step finds nothing to hold and nothing to put back.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

INNER = """
import os, sys, time
from pathlib import Path
from kiro.executors.control import TaskFiles
from kiro.store.workspace import Workspace
ws = Workspace(Path(sys.argv[1]))
own = ws.specs / "bench" / "tasks.md"
fd = os.open(own, os.O_RDWR)
at = os.pread(fd, 4096, 0).index(b"- [ ]") + 3
def pair():
    files = TaskFiles.take(ws, own)
    os.pwrite(fd, b"-", at)
    said = files.check(boxed=False, task_id="bench", step_id="1")
    assert not said, said
    os.pwrite(fd, b" ", at)
for _ in range(50):
    pair()
began = time.thread_time_ns()
for _ in range(int(sys.argv[2])):
    pair()
print((time.thread_time_ns() - began) / int(sys.argv[2]) / 1000)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--previous-tree", type=Path)
    args = ap.parse_args()
    sys.path.insert(0, str(HERE / "bench"))
    from step_cost import make_task
    from turns import in_turns

    trees = [HERE] + ([args.previous_tree.resolve()] if args.previous_tree else [])
    with tempfile.TemporaryDirectory(prefix="kiro-steplook-", dir=os.environ.get("BENCH_TMP")) as tmp:
        root = Path(tmp).resolve()
        for name in ("Specs/bench", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
            (root / name).mkdir(parents=True, exist_ok=True)
        (root / "Specs/bench/tasks.md").write_text(make_task(args.steps))
        time.sleep(2.5)  # the folders settle: a listing changed within 2 s is made again at every look
        got, loads = in_turns(INNER, [str(root), str(args.pairs)], trees, args.rounds, root)
    print(f"python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d %H:%M')}, load average "
          f"{min(loads):.2f}-{max(loads):.2f}; thread CPU per look pair (take, a byte written, check, a byte "
          f"written back), {args.pairs} pairs a round, the trees taking turns")
    for tree, figures in got.items():
        print(f"  {tree}: " + "  ".join(f"{f:.1f}" for f in figures) + " us")


if __name__ == "__main__":
    main()
