"""What starting one loop of a batch costs in instructions: a figure this machine's moods do not move.

    python bench/start_instructions.py [--loops 50 250] [--no-frontmatter] [--previous-tree DIR]

`kiro loop start --task a --task b ...` prepares every loop (its task file read, its state, lock,
reserve and summary made, the task file recorded in .state/task_files.json) and writes them together
(kiro.core.runner.StartBatch). Here that start of FEW and of MANY loops (openai executor, task files of
ten steps with a `title:` frontmatter, on tmpfs: /dev/shm) runs under valgrind's callgrind
(Debian's `valgrind` package; PYTHONHASHSEED=0), and so does the same script stopped before the
start (the workspace made, the imports done); the start's count at MANY minus the one at FEW,
divided by MANY - FEW, is what one more loop costs. A run first writes the byte-code caches, not
counted. Each start is checked: every loop's state file and its task file's record are there.

With --previous-tree DIR (a checkout of an older kiro, e.g. `git worktree add /tmp/old <commit>`) the
same runs are made with that tree, and the ratio is printed. bench/many_loops.py times the same start
on the disk, where the cost of creating files (5 per loop) can be larger than all of this.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
HERE = Path(__file__).resolve().parent.parent

SCRIPT = r'''
import json, os, sys, tempfile
from pathlib import Path
n, frontmatter, start = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3] == "1"
from kiro.core.runner import LoopIndex, StartBatch, prepare_start
from kiro.store.statestore import StateStore
from kiro.store.workspace import Workspace
import kiro.executors.openai_agent  # noqa: F401 - imported by a real start before its loops
with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as tmp:
    root = Path(tmp)
    for name in ("Specs", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
        (root / name).mkdir()
    (root / "config/autonomous_loop.yaml").write_text(
        "executor: openai\nllm:\n  base_url: http://127.0.0.1:9/v1\n  model: bench\n"
        "autonomous_loop:\n  create_progress_reports: false\n")
    task = ("---\ntitle: bench\n---\n" if frontmatter else "") + "".join(
        f"- [ ] {i}. Step {i}\n" for i in range(1, 11))
    for i in range(n):
        (root / f"Specs/t{i:04d}").mkdir()
        (root / f"Specs/t{i:04d}/tasks.md").write_text(task)
    os.environ["OPENAI_API_KEY"] = "sk-bench-" + "k" * 40
    if start:
        ws = Workspace(root)
        index = LoopIndex(StateStore(ws))
        with StartBatch() as batch:
            for i in range(n):
                prepare_start(ws, f"Specs/t{i:04d}/tasks.md", task_id=f"t{i:04d}", index=index, batch=batch)
        states = len(list((root / ".state").glob("autonomous_loop_t*.json")))
        recorded = root / ".state/task_files.json"  # where kiro keeps each task file's loop (an older kiro: in it)
        ids = (len(json.loads(recorded.read_text())) if recorded.exists() else
               sum("kiro_task_id: t" in (root / f"Specs/t{i:04d}/tasks.md").read_text() for i in range(n)))
        assert states == n and ids == n, (states, ids)
'''


def count(tree: Path, loops: int, frontmatter: bool, start: bool) -> int:
    r = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c",
                        SCRIPT, str(loops), "1" if frontmatter else "0", "1" if start else "0"],
                       env={**ENV, "PYTHONHASHSEED": "0", "PYTHONPATH": str(tree)}, capture_output=True, text=True,
                       cwd="/")  # not a folder holding a kiro/ (`-c` puts the current folder first on sys.path)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    for line in r.stderr.splitlines():
        if "Collected :" in line:
            return int(line.rsplit(":", 1)[1])
    raise AssertionError("no count from callgrind")


def per_loop(tree: Path, few: int, many: int, frontmatter: bool) -> float:
    count(tree, 5, frontmatter, True)  # byte-code caches written, not counted
    starts = count(tree, many, frontmatter, True) - count(tree, few, frontmatter, True)
    setups = count(tree, many, frontmatter, False) - count(tree, few, frontmatter, False)
    return (starts - setups) / (many - few)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loops", type=int, nargs=2, default=(50, 250), metavar=("FEW", "MANY"))
    ap.add_argument("--no-frontmatter", action="store_true", help="task files without a frontmatter")
    ap.add_argument("--previous-tree", type=Path)
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("this bench needs valgrind (apt-get install valgrind)")
    few, many = args.loops
    frontmatter = not args.no_frontmatter
    trees = [("this tree", HERE)]
    if args.previous_tree is not None:
        trees.append((str(args.previous_tree), args.previous_tree.resolve()))
    results = {label: per_loop(tree, few, many, frontmatter) for label, tree in trees}
    print(f"instructions per loop of a batch start (callgrind; {few} and {many} loops, openai executor, task files "
          f"{'with' if frontmatter else 'without'} a frontmatter, the workspace's making left out):")
    mine = results["this tree"]
    for label, each in results.items():
        ratio = f"; {each / mine:.2f}x this tree" if label != "this tree" else ""
        print(f"  {label}: {each / 1e6:.2f}M per loop{ratio}")


if __name__ == "__main__":
    main()
