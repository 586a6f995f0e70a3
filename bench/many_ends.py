"""The parts of a loop's end that grow with the loops of a workspace, in the tree on PYTHONPATH: Dashboard.md's
render (as `DashboardService` renders it, the files read kept between renders) and the digest's computation.

    python bench/many_ends.py [--loops 1000] [--renders 20] [--digests 3]

A workspace (on /dev/shm when it exists) of `--loops` loops: half of them live in this process (running, their
locks held here, handed to the render as a process's own loops are), half ended, their state files archived; of
the ended ones, every other one recorded running with its lock file left behind (a killed loop's; one in ten of
them held, as by another process). Prints each part's CPU (this thread) per call, the readings of /proc/locks, the
dashboard's blocks made (one a loop, or only those a render cannot keep), and a hash of the text with its times
cut, to compare two trees' output.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from kiro import timeutil
from kiro.fs import locks
from kiro.store.state import CompletedStep, LoopState
from kiro.store.statestore import StateStore
from kiro.store.workspace import Workspace
from kiro.views import dashboard, digest

TIMES = re.compile(r"\d{4}-\d\d-\d\dT[\d:.+\-Z]+|\*\*Duration\*\*: .*|written_at.*")


made = {"blocks": 0}
block = dashboard._block


def counted_block(*args: Any) -> list[str]:
    made["blocks"] += 1
    return block(*args)


class CountedTable:
    """/proc/locks, its readings counted."""

    reads = 0

    def read_bytes(self) -> bytes:
        CountedTable.reads += 1
        return Path("/proc/locks").read_bytes()


def state(i: int, now: str, status: str) -> LoopState:
    tid = f"loop{i:04d}"
    now = timeutil.iso()
    st = LoopState.model_validate({
        "task_id": tid, "task_path": f"Specs/{tid}/tasks.md", "title": f"Task {i}", "status": status,
        "iteration": 10, "max_iterations": 50, "steps_total": 10, "steps_done": 10 if status == "completed" else 5,
        "started_at": now, "updated_at": now, "finished_at": now if status == "completed" else None, "pid": 4242,
        "current_step": None if status == "completed" else {"step_id": "6", "description": "Step 6",
                                                             "status": "in_progress"},
        "completed_steps": [CompletedStep(step_id=str(j), description=f"Step {j}", completed_at=now,
                                          duration_seconds=1.0) for j in range(1, 6)]})
    st.refresh_metrics()
    return st


def timed(name: str, n: int, fn: Any, root: Path) -> None:
    if not n:
        return
    out = fn()  # the first: reads every file
    CountedTable.reads = made["blocks"] = 0
    began = time.thread_time()
    for _ in range(n):
        out = fn()
    spent = (time.thread_time() - began) / n * 1000
    text = out if isinstance(out, str) else repr(sorted(out.items(), key=str))
    mark = hashlib.sha256(TIMES.sub("", text.replace(str(root), "<root>")).encode()).hexdigest()[:12]
    print(f"  {name:<18} {spent:8.2f} ms CPU a call   {CountedTable.reads / n:6.1f} readings of /proc/locks   "
          f"{made['blocks'] / n:6.0f} dashboard blocks made   text {mark}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--loops", type=int, default=1000)
    ap.add_argument("--renders", type=int, default=20)
    ap.add_argument("--digests", type=int, default=3)
    args = ap.parse_args()
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    root = Path(tempfile.mkdtemp(prefix="kiro-many-ends-", dir=base))
    try:
        ws, now = Workspace(root), timeutil.iso()
        real_iso, ticks = timeutil.iso, iter(range(10**9))
        base = timeutil.parse(now)  # while the loops are made, a clock that ticks a millisecond each time it is
        timeutil.iso = lambda when=None: real_iso(when or base + timedelta(milliseconds=next(ticks)))  # read: one order
        (root / "Specs").mkdir()
        store = StateStore(ws)
        live: dict[str, LoopState] = {}
        held = []
        for i in range(args.loops):
            if i % 2:  # running here: its state on disk, its lock held
                st = state(i, now, "running")
                live[st.task_id] = st
                store.save(st)
                held.append(store.acquire(st.task_id))
                continue
            killed = i % 4 == 0
            st = state(i, now, "running" if killed else "completed")
            (store.save if killed else store.archive)(st)
            if killed:
                if i % 40 == 0:
                    held.append(store.acquire(st.task_id))
                else:
                    ws.lock_file(st.task_id).touch()
        timeutil.iso = real_iso
        locks.PROC_LOCKS = CountedTable()  # type: ignore[assignment]
        dashboard._block = counted_block
        print(f"{args.loops} loops ({len(live)} live), {len(held)} locks held; /proc/locks "
              f"{len(Path('/proc/locks').read_bytes())} bytes")
        disk = dashboard.DiskStates(store)
        timed("dashboard.render", args.renders, lambda: dashboard.render(ws, store, live, disk=disk), root)
        timed("digest.compute", args.digests, lambda: digest.compute(store, date.today(), None), root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
