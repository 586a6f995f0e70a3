"""Steps side by side (`parallel: N`): 8 independent `(P)` shell steps of 2 s each, each writing its own file,
with `parallel: 4` against `parallel: 1` (one after another, as before), in a real git repository.

    python bench/parallel_steps.py [--steps 8] [--seconds 2] [--parallel 4]

Prints the wall time of each run (kiro's start to its exit) and checks what a person would: every step done,
the boxes and the checkpoint commits in plan order, every file in HEAD, no worktree or branch left.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kiro.store import tasks  # noqa: E402
from tests.gitutil import files_in, git, init_repo, trailers  # noqa: E402


def plan(steps: int, seconds: float) -> str:
    lines = ["---", "title: side by side", "executor: shell", "---", "# Plan"]
    for i in range(1, steps + 1):
        lines += [f"- [ ] {i}. (P) Write part {i}", "  ```sh",
                  f"  sleep {seconds:g}; mkdir -p parts; echo {i} > parts/{i}.txt", "  ```"]
    return "\n".join(lines) + "\n"


def one_run(steps: int, seconds: float, parallel: int) -> tuple[float, float, list[str]]:
    """(seconds from kiro's start to its exit, seconds from the loop's first event to its last, problems)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in ("Specs/b", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
            (root / name).mkdir(parents=True, exist_ok=True)
        # parallel 1 is the default: no key, so that the same run works on a kiro from before the key
        (root / "config/autonomous_loop.yaml").write_text(f"parallel: {parallel}\n" if parallel > 1 else "")
        (root / "Specs/b/tasks.md").write_text(plan(steps, seconds))
        init_repo(root)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KIRO_", "GIT_"))}
        started = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "kiro", "loop", "start", "--task", "Specs/b/tasks.md", "-q",
                            "--task-id", "b"], cwd=root, env=env, capture_output=True, text=True)
        took = time.perf_counter() - started
        stamps = [json.loads(line)["ts"] for line in (root / "Logs/b.jsonl").read_text().splitlines()
                  if line.strip()]
        loop = (datetime.fromisoformat(stamps[-1]) - datetime.fromisoformat(stamps[0])).total_seconds()
        problems = [] if r.returncode == 0 else [f"exit {r.returncode}: {r.stdout[-400:]} {r.stderr[-400:]}"]
        ids = [str(i) for i in range(1, steps + 1)]
        done = root / "Done/b/tasks.md"
        if not done.exists() or [s.id for s in tasks.load(done).steps if s.done] != ids:
            problems.append("not every box is checked")
        order = [trailers(root, sha).get("Kiro-Step-Id") for sha in git(root, "rev-list", "--reverse",
                                                                         "HEAD").split()[1:]]
        if order != ids:
            problems.append(f"checkpoints out of plan order: {order}")
        missing = [i for i in ids if f"parts/{i}.txt" not in files_in(root, "HEAD")]
        if missing:
            problems.append(f"HEAD lacks parts {missing}")
        if len(git(root, "worktree", "list").splitlines()) != 1 or git(root, "branch").split() != ["*", "main"]:
            problems.append("worktrees or branches left: " + git(root, "worktree", "list") + git(root, "branch"))
        return took, loop, problems


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--parallel", type=int, default=4)
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    for n in (args.parallel, 1):
        took, loop, problems = one_run(args.steps, args.seconds, n)
        print(f"{args.steps} (P) shell steps of {args.seconds:g} s, parallel: {n}: {took:.1f} s "
              f"(the loop itself: {loop:.1f} s)"
              f"{'' if not problems else '; PROBLEMS: ' + ' | '.join(problems)}")


if __name__ == "__main__":
    main()
