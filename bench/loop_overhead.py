"""The loop's own overhead per iteration, and the state-write time with 1,000 completed steps.

    python bench/loop_overhead.py [--steps 200] [--state-steps 1000]

Prints figures; asserts nothing. The overhead is the wall time of a 200-step task whose steps run
`true` with the shell executor, minus the time the same 200 `bash -e -c true` processes take on
their own: what kiro adds per iteration (re-reading the task file, two checkbox edits, two state
saves with fsync, events, dashboard).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from kiro import timeutil
from kiro.executors.process import run_process
from kiro.runner import prepare_start, run_loops
from kiro.state import CompletedStep, LoopState, StateStore
from kiro.workspace import Workspace


def make_task(n: int) -> str:
    lines = ["---", "title: bench", "executor: shell", "---"]
    for i in range(1, n + 1):
        lines += [f"- [ ] {i}. Step {i}", "  ```sh", "  true", "  ```"]
    return "\n".join(lines) + "\n"


async def bare_processes(n: int, cwd: Path) -> float:
    started = time.perf_counter()
    for _ in range(n):
        await run_process(["bash", "-e", "-c", "true"], cwd=cwd, timeout=30)
    return time.perf_counter() - started


def loop_overhead(steps: int, label: str = "") -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in ("Specs/bench", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
            (root / name).mkdir(parents=True, exist_ok=True)
        (root / "config/autonomous_loop.yaml").write_text("autonomous_loop:\n  max_iterations: 100000\n")
        (root / "Specs/bench/tasks.md").write_text(make_task(steps))
        ws = Workspace(root)
        bare = asyncio.run(bare_processes(steps, root))
        run = prepare_start(ws, "Specs/bench/tasks.md", task_id="bench")
        started = time.perf_counter()
        [outcome] = asyncio.run(run_loops([run]))
        total = time.perf_counter() - started
        assert outcome.exit_code == 0, outcome
        per_iter = total / steps
        overhead = (total - bare) / steps
        print(f"loop{label}, {steps} shell steps running `true`: {total:.2f} s total, "
              f"{per_iter * 1000:.1f} ms per iteration")
        print(f"  the same {steps} `bash -e -c true` processes alone: {bare:.2f} s ({bare / steps * 1000:.1f} ms each)")
        print(f"  kiro's own overhead per iteration: {overhead * 1000:.1f} ms")


def state_write(n_completed: int, repeats: int = 50) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ws = Workspace(Path(tmp))
        store = StateStore(ws)
        st = LoopState(task_id="bench", task_path="Specs/bench/tasks.md", max_iterations=100000)
        now = timeutil.iso()
        st.completed_steps = [
            CompletedStep(step_id=f"{i // 10}.{i % 10}", description=f"Step number {i} with a realistic title",
                          completed_at=now, duration_seconds=12.5, iteration=i, summary="did the thing " * 5)
            for i in range(n_completed)
        ]
        st.iteration = n_completed
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            store.save(st)
            times.append(time.perf_counter() - t)
        nofsync = []
        for _ in range(repeats):
            t = time.perf_counter()
            store.save(st, fsync=False)
            nofsync.append(time.perf_counter() - t)
        size = store.path("bench").stat().st_size
        times.sort()
        print(f"state write, {n_completed} completed steps ({size / 1024:.0f} KiB): "
              f"median {statistics.median(times) * 1000:.2f} ms, p95 {times[int(0.95 * len(times)) - 1] * 1000:.2f} ms "
              f"(with fsync); median {statistics.median(nofsync) * 1000:.2f} ms without fsync")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--state-steps", type=int, default=1000)
    args = ap.parse_args()
    print(f"python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d %H:%M')}")
    loop_overhead(args.steps)
    # The same with fsync made a no-op: what is left is kiro's CPU and plain file I/O; the difference
    # is the price of durability (about six fsyncs per iteration) on this disk.
    real_fsync = os.fsync
    os.fsync = lambda fd: None
    try:
        loop_overhead(args.steps, " (fsync disabled)")
    finally:
        os.fsync = real_fsync
    state_write(args.state_steps)


if __name__ == "__main__":
    main()
