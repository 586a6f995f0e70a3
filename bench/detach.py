"""How long `kiro loop start --detach` keeps the person waiting, beside Typer's own import.

    python bench/detach.py [--runs 5] [--previous-tree DIR]

Each round times, in fresh processes taking turns: `python -c "import typer, typer._adapters"` (the
floor any command of this CLI pays), then `kiro loop start --detach` on a one-step shell task (`sleep 1`)
in a fresh workspace: the command's wall time until it returns, and its own CPU (user+sys, from wait4:
the loop's process runs in its own session and is not counted). The command takes the loop's lock and
writes its state itself, then hands the lock to the loop's process and returns without waiting for that
process's start (kiro.core.api.in_background; before, it waited until that process held the lock, so its
wall time held a whole fresh start of it). Each round then waits until the loop has ended (its task moved
to Done/, its lock file gone) and checks the loop id was printed and the step is done.

With --previous-tree (an older checkout, e.g. `git worktree add /tmp/old main`, or /work/main) the
same command of that tree runs in the same round (with this venv's packages). Prints medians. Wall
times are worth comparing on a quiet machine only; the CPU figures and the ratios between the two trees
hold better under load (the load is printed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENV = {k: v for k, v in os.environ.items() if not k.startswith(("KIRO_", "PYTHONDONTWRITEBYTECODE"))}
TASK = "---\ntitle: One step\nexecutor: shell\n---\n- [ ] 1. Wait\n  ```sh\n  sleep 1\n  ```\n"
FLOOR = "import typer, typer._adapters"


def timed(argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
          ) -> tuple[float, float, str, int]:
    """Wall seconds, CPU seconds (user+sys, wait4), stdout+stderr, exit code of one fresh process."""
    with tempfile.TemporaryFile() as out:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env or ENV)
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        out.seek(0)
        return wall, usage.ru_utime + usage.ru_stime, out.read().decode(), os.waitstatus_to_exitcode(status)


def fresh(base: Path, name: str) -> Path:
    root = base / name
    for sub in ("Specs/a", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
        (root / sub).mkdir(parents=True)
    (root / "Specs/a/tasks.md").write_text(TASK)
    return root


def detach_once(root: Path, env: dict[str, str]) -> tuple[float, float]:
    """One `--detach` start: (wall, CPU) of the command; then waits for the loop to end and checks it."""
    argv = [sys.executable, "-m", "kiro", "loop", "start", "--detach", "--task", "Specs/a/tasks.md",
            "--task-id", "d1"]
    wall, cpu, out, code = timed(argv, cwd=root, env=env)
    assert code == 0 and out.strip().splitlines()[-1] == "d1", f"exit {code}: {out}"
    done = root / "Done/a/tasks.md"
    deadline = time.monotonic() + 300
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert done.exists() and "[x]" in done.read_text(), (root / "Logs/d1.out").read_text()
    lock = root / ".state/autonomous_loop_d1.lock"  # gone once the loop's process let go of it: it has ended
    while lock.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not lock.exists(), "the loop's process did not end"
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--previous-tree", type=Path, help="an older checkout, timed in the same rounds")
    args = ap.parse_args()
    here = str(Path(__file__).resolve().parent.parent)
    trees = {"this tree": {**ENV, "PYTHONPATH": here}}
    if args.previous_tree is not None:
        trees[str(args.previous_tree)] = {**ENV, "PYTHONPATH": str(args.previous_tree.resolve())}
    floor_wall: list[float] = []
    floor_cpu: list[float] = []
    got: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        for i in range(args.runs + 1):  # the first round warms the byte-code caches: not counted
            w, c, out, code = timed([sys.executable, "-c", FLOOR])
            assert code == 0, out
            for n, (name, env) in enumerate(trees.items()):
                dw, dc = detach_once(fresh(base, f"r{i}t{n}"), env)
                if i:
                    got[name][0].append(dw)
                    got[name][1].append(dc)
            if i:
                floor_wall.append(w)
                floor_cpu.append(c)
    med = statistics.median
    fw, fc = med(floor_wall), med(floor_cpu)
    print(f"kiro loop start --detach, one-step task; medians of {args.runs} (load {os.getloadavg()[0]:.1f})")
    print(f"  {FLOOR}: {fw * 1000:.0f} ms wall, {fc * 1000:.0f} ms CPU")
    first = None
    for name, (walls, cpus) in got.items():
        w, c = med(walls), med(cpus)
        ratio = f"; {w / first:.2f}x this tree's wall" if first else ""
        print(f"  {name}: returns after {w * 1000:.0f} ms wall ({(w - fw) * 1000:+.0f} ms beyond Typer's "
              f"import), its own CPU {c * 1000:.0f} ms ({(c - fc) * 1000:+.0f} ms beyond){ratio}")
        first = first or w


if __name__ == "__main__":
    main()
