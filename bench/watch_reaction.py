"""How fast `kiro loop watch` reacts to files: a task file dropped into Specs/ (to its `loop_started`)
and a deleted stop hook (to the paused loop's `loop_resumed`), p50/p95 over N rounds each.

    python bench/watch_reaction.py [--rounds 10]

The supervisor runs in-process; a thread stands in for the person who drops and deletes files.
Before issue 7 item 5 these were the 30 s rescan and the 5 s safety poll.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from kiro.core.supervisor import Supervisor
from kiro.store.workspace import Workspace

TASK = "---\nexecutor: shell\n---\n" + "".join(f"- [ ] {i}. Wait\n  ```sh\n  sleep 0.3\n  ```\n" for i in (1, 2))


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[max(0, int(round(p * len(s))) - 1)]


async def bench(root: Path, rounds: int) -> tuple[list[float], list[float]]:
    seen: dict[str, float] = {}
    names: dict[str, str] = {}  # task id -> "t<i>", the task's folder

    def listener(e: dict[str, Any]) -> None:
        if e["event"] == "loop_started":
            names[e["task_id"]] = e["task_path"].split("/")[1]
        event = e["event"] if e["event"] != "stop_condition" else f"stop_{e.get('status')}"
        seen.setdefault(f"{event}:{names.get(e['task_id'], e['task_id'])}", time.perf_counter())

    sup = Supervisor(Workspace(root), listeners=[listener], max_parallel=4)
    runner = asyncio.create_task(sup.run())

    async def wait_for(key: str, timeout: float = 60) -> float:
        deadline = time.perf_counter() + timeout
        while key not in seen:
            if time.perf_counter() > deadline:
                raise SystemExit(f"no {key} within {timeout} s")
            await asyncio.sleep(0.001)
        return seen[key]

    await asyncio.sleep(0.5)
    new_task: list[float] = []
    unhook: list[float] = []
    for i in range(rounds):
        path = root / f"Specs/t{i}/tasks.md"
        path.parent.mkdir(parents=True)
        await asyncio.sleep(0.2)
        t0 = time.perf_counter()
        path.write_text(TASK)
        new_task.append(await wait_for(f"loop_started:t{i}") - t0)
        tid = next(k for k, v in names.items() if v == f"t{i}")
        hook = root / f".hooks/stop_autonomous_loop_{tid}.md"
        hook.write_text("stop\n")
        await wait_for(f"stop_paused:t{i}")
        await asyncio.sleep(0.2)
        t0 = time.perf_counter()
        hook.unlink()
        unhook.append(await wait_for(f"loop_resumed:t{i}") - t0)
    sup.stop()
    await runner
    return new_task, unhook


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in ("Specs", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
            (root / name).mkdir(parents=True, exist_ok=True)
        (root / "config/autonomous_loop.yaml").write_text("autonomous_loop:\n  create_progress_reports: false\n")
        new_task, unhook = asyncio.run(bench(root, args.rounds))
    for label, values in (("new task file in Specs/ -> loop_started", new_task),
                          ("stop hook deleted -> loop_resumed", unhook)):
        ms = [v * 1000 for v in values]
        print(f"watch: {label} over {len(ms)} rounds: p50 {statistics.median(ms):.1f} ms, "
              f"p95 {pct(ms, 0.95):.1f} ms, max {max(ms):.1f} ms")


if __name__ == "__main__":
    main()
