"""What the redactor costs: building it, and cutting secrets from typical writes.

    python bench/redact_cost.py [--secrets 40] [--events 20000]

Prints figures; asserts nothing. The redactor is built once per run from the environment and the
config, then every event, state save, report and prompt passes through it. Figures: the build
time; microseconds per event record (`Redactor.data` on a dict, as `Loop.emit` does); MB/s on a
64 KB step output with and without a secret in it; the same for a 200 KB state file.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid

from kiro.store.config import Config
from kiro.store.redact import Redactor


def per_call(fn: object, arg: object, n: int) -> float:
    f = fn  # type: ignore[assignment]
    started = time.perf_counter()
    for _ in range(n):
        f(arg)  # type: ignore[operator]
    return (time.perf_counter() - started) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--secrets", type=int, default=40, help="secret-looking variables in the environment")
    ap.add_argument("--events", type=int, default=20000)
    args = ap.parse_args()
    env = {f"SERVICE_{i}_TOKEN": f"tok-{uuid.uuid4().hex}" for i in range(args.secrets)}
    env.update({f"PLAIN_{i}": f"value {i}" for i in range(100)})
    env["OPENAI_API_KEY"] = "sk-" + uuid.uuid4().hex
    cfg = Config.model_validate({"llm": {"base_url": "https://u:p4ssw0rd-long@proxy.example/v1"}})

    started = time.perf_counter()
    r = Redactor.for_run(cfg, env)
    build = time.perf_counter() - started

    event = {"ts": "2026-11-22T08:00:00Z", "task_id": "task_1", "iteration": 7, "event": "step_completed",
             "step_id": "3.2", "description": "Write the parser for the config file", "attempt": 1,
             "duration_seconds": 12.5, "checked": ["3.2"]}
    ev = per_call(r.data, event, args.events)
    clean = ("build output line without anything secret in it\n" * 1400)[:64_000]
    dirty = clean[:32_000] + env["SERVICE_7_TOKEN"] + clean[32_000:]
    out_clean = per_call(r.text, clean, 500)
    out_dirty = per_call(r.text, dirty, 500)
    state = json.dumps({"completed_steps": [{"step_id": str(i), "summary": "did the thing " * 10}
                                            for i in range(1000)]}, indent=2)
    st = per_call(r.text, state, 50)

    print(f"secrets known: {len(r.secrets)} values, {len(r.literal_forms)} URL forms")
    print(f"build (once per run): {build * 1000:.2f} ms")
    print(f"event record (Loop.emit): {ev * 1e6:.1f} us")
    print(f"64 KB step output, no secret: {out_clean * 1000:.3f} ms ({64 / 1024 / out_clean:.0f} MB/s)")
    print(f"64 KB step output, one secret: {out_dirty * 1000:.3f} ms ({64 / 1024 / out_dirty:.0f} MB/s)")
    print(f"state file {len(state) // 1024} KB: {st * 1000:.3f} ms ({len(state) / 1e6 / st:.0f} MB/s)")


if __name__ == "__main__":
    main()
