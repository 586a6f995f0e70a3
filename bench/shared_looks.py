"""SPEC §15's looks around a step when many loops of one process share them (issue #41): N loops, each with its
own task file in Specs/, take their look before the step from one shared look (`TaskFiles.take(look=...)`) and
check after it against one shared look (`TaskFiles.check(look=...)`), as the loops whose steps begin and end in
the same turns of the event loop do (kiro.executors.control.shared_look). Prints the event loop thread's CPU
(`time.thread_time`) per loop and step, the two looks themselves left out (one each for all N loops).

    python bench/shared_looks.py [--loops 1000] [--rounds 3] [--previous-tree DIR]

Each round runs in a fresh interpreter per tree (the tree's kiro first on PYTHONPATH), the trees taking turns.
Each check is checked: nothing held, nothing put back. `--skip` (inner) makes the looks and no take or check,
for an instruction count of the takes and checks alone under callgrind (the difference of the two runs).
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
import asyncio, sys, time
from pathlib import Path
from kiro.executors import control
from kiro.store.workspace import Workspace
ws = Workspace(Path(sys.argv[1]))
owns = sorted(ws.specs.glob("*/tasks.md"))
steps = 0 if "--skip" in sys.argv else int(sys.argv[2])
async def main() -> float:
    before = await control.shared_look(ws, boxed=False)
    after = await control.shared_look(ws, boxed=False)
    began = time.thread_time_ns()
    for _ in range(steps):
        files = [control.TaskFiles.take(ws, own, boxed=False, look=before) for own in owns]
        for i, f in enumerate(files):
            said = f.check(boxed=False, task_id=f"t{i}", step_id="1", look=after)
            assert not said, said
    return (time.thread_time_ns() - began) / max(steps * len(owns), 1) / 1000
print(asyncio.run(main()))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loops", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=3, help="steps of every loop a round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--previous-tree", type=Path)
    args = ap.parse_args()
    sys.path.insert(0, str(HERE / "bench"))
    from turns import in_turns

    trees = [HERE] + ([args.previous_tree.resolve()] if args.previous_tree else [])
    with tempfile.TemporaryDirectory(prefix="kiro-sharedlooks-", dir=os.environ.get("BENCH_TMP")) as tmp:
        root = Path(tmp).resolve()
        for name in ("Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
            (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(args.loops):
            (root / f"Specs/t{i}").mkdir(parents=True)
            (root / f"Specs/t{i}/tasks.md").write_text(f"---\ntitle: t{i}\nexecutor: openai\n---\n# Plan\n\n"
                                                       f"- [ ] 1. Step\n")
        time.sleep(2.5)  # the folders settle: a listing changed within 2 s is made again at every look
        got, loads = in_turns(INNER, [str(root), str(args.steps)], trees, args.rounds, root)
    print(f"python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d %H:%M')}, load average "
          f"{min(loads):.2f}-{max(loads):.2f}; {args.loops} loops sharing one look before and one after, "
          f"thread CPU per loop and step (take and check), {args.steps} steps a round, the trees taking turns")
    for tree, figures in got.items():
        print(f"  {tree}: " + ", ".join(f"{f:.1f}" for f in figures) + " us")


if __name__ == "__main__":
    main()
