"""How long `kiro loop start --detach` keeps the person waiting, beside Typer's own import.

    python bench/detach.py [--runs 5] [--previous-tree DIR] [--instructions [--stages]]

Each round times, in fresh processes taking turns: `python -c "import typer, typer._adapters"` (the
floor any command of this CLI pays), then `kiro loop start --detach` on a one-step shell task (`sleep 1`)
in a fresh workspace: the command's wall time until it returns, and its own CPU (user+sys, from wait4:
the loop's process runs in its own session and is not counted). The command takes the loop's lock and
writes its state itself, then hands the lock to the loop's process and returns without waiting for that
process's start (kiro.core.api.in_background; before, it waited until that process held the lock, so its
wall time held a whole fresh start of it). Each round then waits until the loop has ended (its task moved
to Done/, its lock file gone) and checks the loop id was printed and the step is done.

With --previous-tree (an older checkout, e.g. `git worktree add /tmp/old main`) the
same command of that tree runs in the same round (with this venv's packages). Prints medians. Wall
times are worth comparing on a quiet machine only; the CPU figures and the ratios between the two trees
hold better under load (the load is printed).

With --instructions, also the instructions the `--detach` command executes (valgrind's callgrind, one run
each, the loop's own process not counted: stable under load, where wall times are not), in each tree: the
first start in a fresh workspace (it also keeps kiro's folders out of git, kiro.git.ignore) and a start
beside a loop that ran before. With --stages, where this tree's command spends them: each stage of its
start-up run on top of the ones before it (Typer; kiro's CLI modules; the config resolved; kiro.core.runner
imported; the whole command, a start beside an earlier loop).
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
QUICK = "---\ntitle: One quick step\nexecutor: shell\n---\n- [ ] 1. Nothing\n  ```sh\n  true\n  ```\n"
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
    for sub in ("Specs/a", "Specs/b", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
        (root / sub).mkdir(parents=True)
    (root / "Specs/a/tasks.md").write_text(TASK)
    (root / "Specs/b/tasks.md").write_text(QUICK)
    return root


def foreground_once(root: Path, env: dict[str, str]) -> tuple[float, float]:
    """One foreground `kiro loop start` of the one-step task of `true`, to its end: (wall, CPU)."""
    argv = [sys.executable, "-m", "kiro", "loop", "start", "--task", "Specs/b/tasks.md", "--task-id", "f1"]
    wall, cpu, out, code = timed(argv, cwd=root, env=env)
    assert code == 0 and "[x]" in (root / "Done/b/tasks.md").read_text(), f"exit {code}: {out}"
    return wall, cpu


def instructions(argv: list[str], cwd: Path, env: dict[str, str]) -> int:
    """The instructions one run executes, as callgrind counts them (a child process it starts is not counted)."""
    r = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv], cwd=cwd, env=env,
                       capture_output=True, text=True, check=True)
    return int(next(line for line in r.stderr.splitlines() if "Collected :" in line).split()[-1])


DETACH = ["loop", "start", "--detach", "--task", "Specs/a/tasks.md", "--task-id", "d1"]


def detach_instructions(base: Path, name: str, env: dict[str, str], *, beside: bool) -> int:
    """The `--detach` command's instructions in a fresh workspace (`beside`: after a loop ran there), after a
    warm-up run elsewhere (byte code); waits for the loop to end."""
    detach_once(fresh(base, f"{name}warm"), env)
    root = fresh(base, name)
    if beside:
        foreground_once(root, env)
    ir = instructions([sys.executable, "-m", "kiro", *DETACH], root, env)
    wait_ended(root)
    return ir


STAGES = [
    ("import typer, typer._adapters", "import typer, typer._adapters"),
    ("kiro's CLI modules", "import kiro.cli, kiro.cli.loop, kiro.cli.launch"),
    ("the config resolved", "from kiro.store.settings import settings_for; from kiro.store.workspace import "
                            "Workspace; settings_for(Workspace.find(None))"),
    ("kiro.core.runner imported", "import kiro.core.runner"),
    ("the whole command", f"import sys; sys.argv = ['kiro', *{DETACH!r}]; from kiro.cli import main; main()"),
]


def stages(base: Path, env: dict[str, str]) -> list[str]:
    """Each stage's instructions above the one before it (callgrind, one run each, in a workspace where a
    loop ran before)."""
    lines, before = [], 0
    for i, (name, _code) in enumerate(STAGES):
        code = "\n".join(c for _n, c in STAGES[:i + 1])
        roots = [fresh(base, f"stage{i}{n}") for n in range(2)]
        for root in roots:
            foreground_once(root, env)
        subprocess.run([sys.executable, "-c", code], cwd=roots[0], env=env, capture_output=True, check=True)
        ir = instructions([sys.executable, "-c", code], roots[1], env)
        for root in roots if "main()" in code else ():
            wait_ended(root)
        lines.append(f"    {name}: {ir / 1e6:.0f} M" + (f" (+{(ir - before) / 1e6:.0f} M)" if before else ""))
        before = ir
    return lines


def detach_once(root: Path, env: dict[str, str]) -> tuple[float, float]:
    """One `--detach` start: (wall, CPU) of the command; then waits for the loop to end and checks it."""
    argv = [sys.executable, "-m", "kiro", "loop", "start", "--detach", "--task", "Specs/a/tasks.md",
            "--task-id", "d1"]
    wall, cpu, out, code = timed(argv, cwd=root, env=env)
    assert code == 0 and out.strip().splitlines()[-1] == "d1", f"exit {code}: {out}"
    wait_ended(root)
    return wall, cpu


def wait_ended(root: Path) -> None:
    """Until the detached loop d1 of `root` has done its step and its process has ended."""
    done = root / "Done/a/tasks.md"
    deadline = time.monotonic() + 300
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert done.exists() and "[x]" in done.read_text(), (root / "Logs/d1.out").read_text()
    lock = root / ".state/autonomous_loop_d1.lock"  # gone once the loop's process let go of it: it has ended
    while lock.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not lock.exists(), "the loop's process did not end"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--previous-tree", type=Path, help="an older checkout, timed in the same rounds")
    ap.add_argument("--instructions", action="store_true", help="also count instructions with callgrind")
    ap.add_argument("--stages", action="store_true", help="with --instructions: this tree's command in stages")
    args = ap.parse_args()
    here = str(Path(__file__).resolve().parent.parent)
    trees = {"this tree": {**ENV, "PYTHONPATH": here}}
    if args.previous_tree is not None:
        trees[str(args.previous_tree)] = {**ENV, "PYTHONPATH": str(args.previous_tree.resolve())}
    floor_wall: list[float] = []
    floor_cpu: list[float] = []
    got: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in trees}
    fg: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in trees}
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        for i in range(args.runs + 1):  # the first round warms the byte-code caches: not counted
            w, c, out, code = timed([sys.executable, "-c", FLOOR])
            assert code == 0, out
            for n, (name, env) in enumerate(trees.items()):
                root = fresh(base, f"r{i}t{n}")
                dw, dc = detach_once(root, env)
                ow, oc = foreground_once(root, env)
                if i:
                    got[name][0].append(dw)
                    got[name][1].append(dc)
                    fg[name][0].append(ow)
                    fg[name][1].append(oc)
            if i:
                floor_wall.append(w)
                floor_cpu.append(c)
        if args.instructions:
            typer_ir = instructions([sys.executable, "-c", FLOOR], base, ENV)
            lines.append(f"instructions (callgrind): {FLOOR} {typer_ir / 1e6:.0f} M")
            for n, (name, env) in enumerate(trees.items()):
                first = detach_instructions(base, f"i{n}a", env, beside=False)
                beside = detach_instructions(base, f"i{n}b", env, beside=True)
                lines.append(f"  {name}: --detach, first start in a workspace {first / 1e6:.0f} M "
                             f"({(first - typer_ir) / 1e6:+.0f} M beyond Typer's import); beside an earlier loop "
                             f"{beside / 1e6:.0f} M ({(beside - typer_ir) / 1e6:+.0f} M)")
            if args.stages:
                lines.append("  this tree's --detach beside an earlier loop, in stages, each with the ones before it:")
                lines += stages(base, trees["this tree"])
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
        print(f"    a one-step foreground start (a step of `true`) to its end: {med(fg[name][0]) * 1000:.0f} ms wall, "
              f"{med(fg[name][1]) * 1000:.0f} ms CPU")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
