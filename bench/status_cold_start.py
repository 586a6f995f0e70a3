"""`kiro loop status` cold start with 50 loops in the workspace, against `python -c pass`.

    python bench/status_cold_start.py [--loops 50] [--runs 15]

Each figure is the median wall time of fresh processes. Also reports whether the command imported
openai or watchfiles (it should not: reading status must stay cheap).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kiro import timeutil
from kiro.state import CompletedStep, LoopState, StateStore
from kiro.workspace import Workspace

# Byte-code caching on, as in a normal install (some sandboxes set PYTHONDONTWRITEBYTECODE, which
# makes every start compile kiro's sources again); one warm-up run writes the caches.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def median_time(argv: list[str], runs: int, cwd: Path) -> float:
    subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=ENV)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=ENV)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loops", type=int, default=50)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in ("Specs", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
            (root / name).mkdir()
        store = StateStore(Workspace(root))
        statuses = ["paused", "completed", "failed", "running", "max_iterations"]
        for i in range(args.loops):
            st = LoopState(task_id=f"task_{i:03d}", task_path=f"Specs/t{i}/tasks.md", status=statuses[i % 5],
                           iteration=i, steps_total=20, steps_done=i % 20)
            st.completed_steps = [CompletedStep(step_id=str(j), description=f"step {j}", completed_at=timeutil.iso(),
                                                duration_seconds=3.0) for j in range(i % 20)]
            store.save(st, fsync=False)
        kiro = [sys.executable, "-m", "kiro", "loop", "status", "-w", str(root)]
        base = median_time([sys.executable, "-c", "pass"], args.runs, root)
        status = median_time(kiro, args.runs, root)
        as_json = median_time([*kiro, "--json"], args.runs, root)
        imports = subprocess.run([sys.executable, "-X", "importtime", *kiro[1:]], cwd=root, capture_output=True,
                                 text=True, env=ENV).stderr
        heavy = sorted({line.split("|")[-1].strip().split(".")[0] for line in imports.splitlines()
                        if line.split("|")[-1].strip().split(".")[0] in ("openai", "watchfiles", "httpx2")})
        print(f"kiro loop status, {args.loops} loops: median {status * 1000:.0f} ms "
              f"(--json {as_json * 1000:.0f} ms); python -c pass: {base * 1000:.0f} ms; "
              f"ratio {status / base:.1f}x")
        print(f"heavy modules imported by status: {', '.join(heavy) if heavy else 'none (no openai, no watchfiles)'}")


if __name__ == "__main__":
    main()
