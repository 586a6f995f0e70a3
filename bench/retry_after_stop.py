"""A long Retry-After is a wait a stop hook ends: p50/p95 from dropping the hook to the loop's
`stop_condition`, over N rounds, while the loop sleeps on `Retry-After: 3600` from a scripted
OpenAI-compatible server on 127.0.0.1 (tests/fake_openai.py; the real `openai` client talks to it).

    python bench/retry_after_stop.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kiro.core.runner import prepare_resume, prepare_start, run_loops
from kiro.store.workspace import Workspace
from tests.fake_openai import FakeOpenAI


def one_round(run: Any, hook: Path) -> tuple[float, int]:
    sleeping = threading.Event()
    times: dict[str, float] = {}

    def listener(e: dict[str, Any]) -> None:
        if e["event"] == "guardrail_triggered" and e.get("limit") == "retry_after":
            sleeping.set()
        elif e["event"] == "stop_condition" and "stop" not in times:
            times["stop"] = time.perf_counter()

    def person() -> None:
        sleeping.wait(30)
        time.sleep(0.2)
        times["drop"] = time.perf_counter()
        hook.write_text("stop\n")

    t = threading.Thread(target=person)
    t.start()
    [outcome] = asyncio.run(run_loops([run], [listener]))
    t.join()
    assert outcome.reason == "stop_hook", outcome
    return times["stop"] - times["drop"], outcome.exit_code


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    os.environ.setdefault("OPENAI_API_KEY", "sk-bench")
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAI() as fake:
        root = Path(tmp)
        for name in ("Specs/x", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
            (root / name).mkdir(parents=True, exist_ok=True)
        (root / "config/autonomous_loop.yaml").write_text(
            f"executor: openai\nllm:\n  base_url: {fake.base_url}\n  model: m\n  max_retries: 2\n"
            "autonomous_loop:\n  create_progress_reports: false\n")
        (root / "Specs/x/tasks.md").write_text("- [ ] 1. Wait for the endpoint\n")
        ws = Workspace(root)
        hook = ws.hook_file("ra")
        reactions = []
        for i in range(args.rounds):
            fake.error(429, "come back in an hour", retry_after=3600)
            run = prepare_start(ws, "Specs/x/tasks.md", task_id="ra") if i == 0 else prepare_resume(ws, "ra")
            reaction, _code = one_round(run, hook)
            reactions.append(reaction * 1000)
        requests = len(fake.chat_requests)
    reactions.sort()
    p95 = reactions[max(0, int(round(0.95 * len(reactions))) - 1)]
    print(f"Retry-After 3600 -> sleeping; stop hook -> stop over {len(reactions)} rounds: "
          f"p50 {statistics.median(reactions):.1f} ms, p95 {p95:.1f} ms, max {reactions[-1]:.1f} ms; "
          f"{requests} requests in all (1 per round: no retries burned)")


if __name__ == "__main__":
    main()
