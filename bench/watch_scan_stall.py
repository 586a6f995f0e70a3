"""How long `kiro loop watch` holds its running loops still while it takes on many task files at once
(issue #12 item 5: no synchronous durable write on the event loop).

    python bench/watch_scan_stall.py [--files 200] [--running 4] [--parallel N] [--previous-tree DIR]
                                     [--alternate N]

The supervisor runs in-process with `--running` loops busy (each step a `sleep 0.05`, so their events
flow all along). Then `--files` task files appear in Specs/ at once (written by a thread, as a person's
`cp -r` would). A heartbeat coroutine on the supervisor's event loop ticks every millisecond; what is
printed is the longest gap between two ticks and the gaps' p99 while the new loops are taken on (from
the first file until every new loop's state file exists), and how long that took. A gap is time in
which no running loop could log an event, notice a stop hook or answer a model.

`--parallel` is the supervisor's `max_parallel_loops` (default: `--running`, so the new loops are
prepared and wait as pending, and what is measured is taking them on). With `--parallel` above
`--running` they also start running at once, and their first iterations share the event loop too.

The bench checks the work was done: every file got its loop (a state file, and the task file recorded in
.state/task_files.json) and the busy loops went on. With --previous-tree DIR (e.g. `git worktree add
/tmp/old <commit>`), the same run is made with that tree's kiro in a subprocess, alternating --alternate
N times, and the medians are printed side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
BUSY = "---\nexecutor: shell\n---\n" + "".join(f"- [ ] {i}. Busy\n  ```sh\n  sleep 0.05\n  ```\n"
                                               for i in range(1, 2001))
NEW = "---\nexecutor: shell\n---\n- [ ] 1. Quick\n  ```sh\n  true\n  ```\n"


async def bench(root: Path, files: int, running: int, parallel: int) -> dict[str, Any]:
    from kiro.core.supervisor import Supervisor
    from kiro.store.workspace import Workspace

    started: dict[str, str] = {}
    busy_events = 0

    def listener(e: dict[str, Any]) -> None:
        nonlocal busy_events
        if e["event"] == "loop_started":
            started[e["task_id"]] = e["task_path"]
        elif e["event"] == "step_completed":
            busy_events += 1

    for i in range(running):
        (root / f"Specs/busy{i}").mkdir(parents=True)
        (root / f"Specs/busy{i}/tasks.md").write_text(BUSY)
    sup = Supervisor(Workspace(root), listeners=[listener], max_parallel=parallel)
    runner = asyncio.create_task(sup.run())
    deadline = time.perf_counter() + 60
    while len(started) < running:
        if time.perf_counter() > deadline:
            raise SystemExit("the busy loops did not start")
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.5)

    gaps: list[float] = []
    ticking = True

    async def heartbeat() -> None:
        last = time.perf_counter()
        while ticking:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    beat = asyncio.create_task(heartbeat())
    await asyncio.sleep(0.1)
    gaps.clear()
    before = busy_events

    def drop() -> None:
        for i in range(files):
            (root / f"Specs/new{i}").mkdir(parents=True)
            (root / f"Specs/new{i}/tasks.md").write_text(NEW)

    t0 = time.perf_counter()
    dropper = threading.Thread(target=drop)
    dropper.start()
    state_dir = root / ".state"
    deadline = time.perf_counter() + 300
    while True:
        taken = len(list(state_dir.glob("autonomous_loop_*.json"))) + len(list((state_dir / "archive").glob(
            "autonomous_loop_*.json"))) - running
        if taken >= files:
            break
        if time.perf_counter() > deadline:
            raise SystemExit(f"only {taken} of {files} new task files got a loop")
        await asyncio.sleep(0.005)
    took = time.perf_counter() - t0
    ticking = False
    await beat
    dropper.join()
    went_on = busy_events - before
    sup.stop()
    await runner
    recorded = root / ".state/task_files.json"  # each task file's loop (an older kiro wrote it in the file)
    entries = json.loads(recorded.read_text()).values() if recorded.exists() else []
    paths = {Path(e["path"]).parent.name for e in entries}
    marked = sum(f"new{i}" in paths or "kiro_task_id:" in (root / f"Specs/new{i}/tasks.md").read_text()
                 for i in range(files) if (root / f"Specs/new{i}/tasks.md").exists())
    moved = len(list((root / "Done").glob("new*/tasks.md")))
    assert marked + moved >= files, f"{files - marked - moved} task files have no loop"
    assert went_on > 0, "the busy loops did not go on"
    ms = sorted(g * 1000 for g in gaps)
    return {"files": files, "running": running, "parallel": parallel, "took_s": took, "max_gap_ms": ms[-1],
            "p99_gap_ms": ms[int(len(ms) * 0.99)], "ticks": len(ms), "busy_steps": went_on}


def measure(files: int, running: int, parallel: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kiro-scan-", dir=os.environ.get("KIRO_BENCH_DIR")) as tmp:
        root = Path(tmp)
        for name in ("Specs", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
            (root / name).mkdir(parents=True, exist_ok=True)
        (root / "config/autonomous_loop.yaml").write_text("autonomous_loop:\n  create_progress_reports: false\n"
                                                           "  max_iterations: 100000\n")
        return asyncio.run(bench(root, files, running, parallel))


def run_tree(tree: Path | None, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree.resolve())
    r = subprocess.run([sys.executable, str(HERE), "--json", "--files", str(args.files), "--running",
                        str(args.running), "--parallel", str(args.parallel)], env=env, capture_output=True,
                       text=True, timeout=900, cwd=tempfile.gettempdir())
    if r.returncode != 0:
        raise SystemExit(f"the run with {tree or 'this tree'} failed: {r.stderr.strip().splitlines()[-3:]}")
    result: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return result


def show(label: str, rows: list[dict[str, Any]]) -> None:
    med = {k: statistics.median(r[k] for r in rows) for k in ("took_s", "max_gap_ms", "p99_gap_ms", "busy_steps")}
    print(f"{label}: {rows[0]['files']} task files taken on beside {rows[0]['running']} running loops "
          f"(max_parallel_loops {rows[0]['parallel']}) in "
          f"{med['took_s']:.2f} s; the event loop's longest stall {med['max_gap_ms']:.1f} ms, p99 gap "
          f"{med['p99_gap_ms']:.1f} ms; the running loops did {med['busy_steps']:.0f} steps meanwhile "
          f"(medians of {len(rows)}; each stall: {', '.join(str(round(r['max_gap_ms'])) for r in rows)} ms)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--running", type=int, default=4)
    ap.add_argument("--parallel", type=int, default=None)
    ap.add_argument("--previous-tree", type=Path)
    ap.add_argument("--alternate", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.parallel is None:
        args.parallel = args.running
    if args.json:
        print(json.dumps(measure(args.files, args.running, args.parallel)))
        return
    if args.previous_tree is None:
        show("this tree", [measure(args.files, args.running, args.parallel)])
        return
    here_tree = HERE.parent.parent
    mine: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    for _ in range(args.alternate):
        mine.append(run_tree(here_tree, args))
        theirs.append(run_tree(args.previous_tree, args))
    show("this tree", mine)
    show(f"previous ({args.previous_tree})", theirs)


if __name__ == "__main__":
    main()
