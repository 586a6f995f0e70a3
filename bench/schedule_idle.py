"""What a scheduled task costs between runs, and how long a run's own bookkeeping takes.

    python bench/schedule_idle.py [--seconds 10] [--runs 5]

1. A `kiro loop start` of a task with a far-away cron schedule (it waits for its first fire): the CPU
   time the waiting process uses over `--seconds`, from /proc/<pid>/stat. The schedule's own wait is
   one timer; what the process spends is its file watcher's (watchfiles' Rust loop, `step=5` ms in
   kiro/core/watch.py, so that hooks and messages are seen within tens of milliseconds) and state timers,
   the same as any waiting or paused kiro loop.
2. A shell task `schedule: {every: 1s}` of one `true` step run `--runs` times: per run, the time from
   `schedule_fired` to `run_finished` (uncheck the boxes, one step, the report, the summary memory).

Prints figures; asserts only that the loop waited and that the runs happened.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KIRO_", "OPENAI_"))}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _workspace(tmp: Path, frontmatter: str) -> Path:
    ws = tmp / "vault"
    for name in ("Specs/job", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
        (ws / name).mkdir(parents=True, exist_ok=True)
    (ws / "config/autonomous_loop.yaml").write_text("autonomous_loop:\n  backoff_base_seconds: 0.01\n")
    (ws / "Specs/job/tasks.md").write_text(f"---\ntitle: bench\nexecutor: shell\n{frontmatter}\n---\n"
                                           "- [ ] 1. step\n  ```sh\n  true\n  ```\n")
    return ws


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait(predicate, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    raise SystemExit("timed out")


def _events(ws: Path, tid: str) -> list[dict[str, object]]:
    p = ws / "Logs" / f"{tid}.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.exists() else []


def idle(seconds: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ws = _workspace(Path(tmp), 'schedule: "0 3 1 1 *"')
        proc = subprocess.Popen([sys.executable, "-m", "kiro", "loop", "start", "--task", "Specs/job/tasks.md",
                                 "--task-id", "idle"], cwd=ws, env=_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            _wait(lambda: any(e.get("event") == "state_changed" and e.get("to") == "sleeping"
                              for e in _events(ws, "idle")))
            time.sleep(0.5)
            before = _cpu_seconds(proc.pid)
            time.sleep(seconds)
            used = _cpu_seconds(proc.pid) - before
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    print(f"waiting for the next run: {used * 1000:.0f} ms CPU in {seconds:g} s "
          f"({used / seconds * 60 * 1000:.1f} ms per minute)")


def runs(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ws = _workspace(Path(tmp), "schedule: {every: 1s}")
        proc = subprocess.Popen([sys.executable, "-m", "kiro", "loop", "start", "--task", "Specs/job/tasks.md",
                                 "--task-id", "runs"], cwd=ws, env=_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            _wait(lambda: sum(e.get("event") == "run_finished" for e in _events(ws, "runs")) >= n, timeout=120)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        fired: dict[object, datetime] = {}
        spans = []
        for e in _events(ws, "runs"):
            if e.get("event") == "schedule_fired":
                fired[e["run"]] = datetime.fromisoformat(str(e["ts"]))
            elif e.get("event") == "run_finished" and e["run"] in fired:
                spans.append((datetime.fromisoformat(str(e["ts"])) - fired[e["run"]]).total_seconds())
    assert len(spans) >= n, spans
    print(f"a run of one `true` step, fire to run_finished: median {statistics.median(spans) * 1000:.0f} ms, "
          f"max {max(spans) * 1000:.0f} ms over {len(spans)} runs")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    idle(args.seconds)
    runs(args.runs)


if __name__ == "__main__":
    main()
