"""How fast a waiting loop wakes for a message (SPEC §11: within 100 ms): p50/p95 over N messages
queued (as `kiro loop tell` does) while the loop sleeps in a retry backoff hours long.

    python bench/message_wake.py [--messages 30]

The loop (the command executor, whose step fails) sleeps in backoff; a thread standing in for a person
queues a message; the figure is the time from the inbox write to the loop's next `step_started` event
(the attempt that carries the message in its prompt). The loop stops at a stop hook after the last one.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kiro.core.runner import prepare_start, run_loops
from kiro.store.messages import Inbox
from kiro.store.workspace import Workspace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=30)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in ("Specs/x", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
            (root / name).mkdir(parents=True, exist_ok=True)
        (root / "config/autonomous_loop.yaml").write_text(
            "executor: command\nexecutor_command: 'false'\ncommand_success: exit_code\n"
            "autonomous_loop:\n  backoff_base_seconds: 36000\n  backoff_max_seconds: 36000\n"
            "  exponential_backoff: false\n  failure_threshold: 1000\n  max_step_retries: 1000\n"
            "  max_iterations: 100000\n  create_progress_reports: false\n"
            "guardrails:\n  loop_detection_repeats: 1000\n")
        (root / "Specs/x/tasks.md").write_text("- [ ] 1. Fails\n")
        ws = Workspace(root)
        run = prepare_start(ws, "Specs/x/tasks.md", task_id="wake")
        inbox = Inbox(ws, "wake")
        backoffs = threading.Semaphore(0)
        started: list[float] = []
        queued: list[float] = []

        def listener(e: dict[str, Any]) -> None:
            if e["event"] == "backoff":
                backoffs.release()
            elif e["event"] == "step_started":
                started.append(time.perf_counter())

        def person() -> None:
            for i in range(args.messages):
                assert backoffs.acquire(timeout=60), "the loop never slept"
                time.sleep(0.2)
                queued.append(time.perf_counter())
                inbox.queue(f"message {i}")
            assert backoffs.acquire(timeout=60)
            ws.hook_file("wake").write_text("---\ntype: stop_hook\n---\nstop\n")

        t = threading.Thread(target=person)
        t.start()
        [outcome] = asyncio.run(run_loops([run], [listener]))
        t.join()
        assert outcome.reason == "stop_hook", outcome
        ms = sorted((s - q) * 1000 for q, s in zip(queued, started[1:], strict=False))
        p95 = ms[max(0, int(round(0.95 * len(ms))) - 1)]
        print(f"message wake over {len(ms)} messages queued while the loop sleeps in a 10 h backoff: "
              f"p50 {statistics.median(ms):.1f} ms, p95 {p95:.1f} ms, max {ms[-1]:.1f} ms")


if __name__ == "__main__":
    main()
