"""How fast a waiting loop notices a stop hook: p50/p95 over N hooks dropped while the loop waits.

    python bench/hook_reaction.py [--hooks 50]

The loop's only step fails and its retry is hours away, so the loop sleeps in backoff. A thread
(standing in for a person) drops the hook file; the figure is the time from the file's creation to
the loop's `stop_condition` event. Each round resumes the loop (which removes the hook) and waits
for it to sleep again. Also prints the CPU the process used while waiting.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kiro.core.runner import prepare_resume, prepare_start, run_loops
from kiro.store.workspace import Workspace


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def one_round(run: Any, hook: Path, idle: float) -> tuple[float, float]:
    """Run the loop until it sleeps in backoff; a thread drops the hook after `idle` seconds.
    Returns the reaction time and the process's CPU share while it waited."""
    dropped: dict[str, float] = {}
    detected: dict[str, float] = {}
    sleeping = threading.Event()
    idle_cpu: list[float] = []

    def listener(e: dict[str, Any]) -> None:
        if e["event"] == "backoff":
            sleeping.set()
        elif e["event"] == "stop_condition" and "t" not in detected:
            detected["t"] = time.perf_counter()

    def person() -> None:
        sleeping.wait(30)
        c0 = cpu()
        time.sleep(idle)
        idle_cpu.append((cpu() - c0) / idle)
        dropped["t"] = time.perf_counter()
        hook.write_text("---\ntype: stop_hook\n---\nstop\n")

    t = threading.Thread(target=person)
    t.start()
    [outcome] = asyncio.run(run_loops([run], [listener]))
    t.join()
    assert outcome.reason == "stop_hook", outcome
    return detected["t"] - dropped["t"], idle_cpu[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hooks", type=int, default=50)
    ap.add_argument("--idle", type=float, default=0.3, help="seconds the loop waits before each hook")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in ("Specs/x", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
            (root / name).mkdir(parents=True, exist_ok=True)
        (root / "config/autonomous_loop.yaml").write_text(
            "autonomous_loop:\n  backoff_base_seconds: 36000\n  backoff_max_seconds: 36000\n"
            "  failure_threshold: 1000\n  max_step_retries: 1000\n  max_iterations: 100000\n"
            "  create_progress_reports: false\n")
        (root / "Specs/x/tasks.md").write_text("---\nexecutor: shell\n---\n- [ ] 1. Fails\n  ```sh\n  exit 1\n  ```\n")
        ws = Workspace(root)
        hook = ws.hook_file("hook")
        reactions: list[float] = []
        idle_cpu: list[float] = []

        for i in range(args.hooks):
            run = (prepare_start(ws, "Specs/x/tasks.md", task_id="hook") if i == 0
                   else prepare_resume(ws, "hook"))
            reaction, cpu_share = one_round(run, hook, args.idle)
            reactions.append(reaction)
            idle_cpu.append(cpu_share)
        reactions.sort()
        ms = [r * 1000 for r in reactions]
        p95 = ms[max(0, int(round(0.95 * len(ms))) - 1)]
        print(f"stop-hook reaction over {len(ms)} hooks dropped while the loop waits in backoff: "
              f"p50 {statistics.median(ms):.1f} ms, p95 {p95:.1f} ms, max {ms[-1]:.1f} ms")
        print(f"CPU while waiting: {statistics.mean(idle_cpu) * 100:.2f}% of one core (mean over {len(idle_cpu)} "
              f"waits of {args.idle}s)")


if __name__ == "__main__":
    main()
