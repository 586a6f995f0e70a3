"""Git checkpoints: what a commit per step costs, and a bigger SIGKILL run than the test suite's.

    python bench/git_checkpoints.py [--steps 100] [--kills 150] [--merge-loops 15]

Prints figures; asserts nothing (the kill runs print the problems they found, if any):
- the wall time per iteration of a shell-step task whose steps each write one file, with
  `checkpoints: off` and `checkpoints: git`, side by side (the difference is the commit per step);
- `--kills` SIGKILLs aimed at commits (index lock held, branch just moved, or random) across a
  run, half of them with git's whole process group, checked as tests/test_git_crash.py does;
- `--merge-loops` loops with `isolation: worktree` and `merge: auto`, each killed around its merge.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.crashgit import run, run_merges  # noqa: E402
from tests.gitutil import init_repo  # noqa: E402


def per_step(steps: int, mode: str) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in ("Specs/b", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
            (root / name).mkdir(parents=True, exist_ok=True)
        (root / "config/autonomous_loop.yaml").write_text(
            f"autonomous_loop:\n  max_iterations: 100000\ncheckpoints: {mode}\n")
        lines = ["---", "title: bench", "executor: shell", "---"]
        for i in range(1, steps + 1):
            lines += [f"- [ ] {i}. Step {i}", "  ```sh", f"  echo {i} > f{i % 10}.txt", "  ```"]
        (root / "Specs/b/tasks.md").write_text("\n".join(lines) + "\n")
        init_repo(root)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KIRO_", "GIT_"))}
        started = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "kiro", "loop", "start", "--task", "Specs/b/tasks.md", "-q"],
                           cwd=root, env=env, capture_output=True, text=True)
        total = time.perf_counter() - started
        assert r.returncode == 0, r.stdout + r.stderr
        return total / steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--kills", type=int, default=150)
    ap.add_argument("--merge-loops", type=int, default=15)
    args = ap.parse_args()
    load = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} cores, load average {load:.1f}")
    off = per_step(args.steps, "off")
    on = per_step(args.steps, "git")
    print(f"per iteration, {args.steps} shell steps each writing a file: checkpoints off {off * 1000:.1f} ms, "
          f"checkpoints git {on * 1000:.1f} ms (+{(on - off) * 1000:.1f} ms for the commit)")
    if args.kills:
        with tempfile.TemporaryDirectory() as tmp:
            rep = run(Path(tmp) / "vault", steps=max(args.kills * 3, 100), kills=args.kills, seed=int(time.time()))
        ev = rep.events
        print(f"kills around commits: {rep.kills} ({rep.group_kills} with git's process group, aimed "
              f"{dict(rep.modes)}), {rep.runs} runs in {rep.seconds:.1f} s; recovered {ev['step_recovered']} steps, "
              f"{ev['checkpoint_recovered']} commits found by their trailers, {ev['git_lock_cleared']} stale locks "
              f"cleared; problems: {len(rep.problems)}")
        for p in rep.problems[:20]:
            print(f"  PROBLEM: {p}")
    if args.merge_loops:
        with tempfile.TemporaryDirectory() as tmp:
            rep = run_merges(Path(tmp) / "vault", loops=args.merge_loops, seed=int(time.time()))
        print(f"kills around auto-merges: {rep.kills} over {args.merge_loops} loops ({rep.group_kills} with the "
              f"process group), {rep.runs} runs in {rep.seconds:.1f} s; torn checkouts healed "
              f"{rep.events['merge_resumed']}, stale locks cleared {rep.events['git_lock_cleared']}; "
              f"problems: {len(rep.problems)}")
        for p in rep.problems[:20]:
            print(f"  PROBLEM: {p}")


if __name__ == "__main__":
    main()
