"""`kiro loop status` cold start with 50 and 1,000 loops in the workspace, against `python -c pass` and
Typer's own import (`python -c "import typer, typer._adapters"`: kiro's own share is what a command takes
above it, issue #41); and `kiro loop logs --tail 10` on a 100,000-event log (time and peak RSS); this tree's
kiro and, with --other, another checkout's, side by side in one run.

    python bench/status_cold_start.py [--loops 50,1000] [--runs 15] [--events 100000]
                                      [--other ../kiro-previous/.venv/bin] [--instructions]

Each time is the median wall time of fresh processes, run interleaved (after one warm-up run that
writes the byte-code caches). `kiro` is timed as the installed script (`<venv>/bin/kiro`). Every run's
output is checked: the table lists every loop, the tail is the last 10 events. Also prints which heavy
modules `status` imports (STYLE 11: never openai or watchfiles).

With --instructions, also the instructions each command executes (valgrind's callgrind, one run each:
stable under load, where wall times are not), and kiro's own share above Typer's import, the rail of
issue #41 (<= ~180 M, 60 ms). Typer's parameters are pydantic TypeAdapters: the first one built imports
importlib.metadata and scans the installed packages for pydantic plugins (~130 M), inside that share
whatever kiro does; the `typer parse` line shows it with a small Typer app parsing one option.

With --stages (and --instructions), also where this tree's `kiro loop status` spends its share: the
instructions of each stage of its start-up, each run on top of the ones before it (Typer; kiro's CLI
modules; the config's module; the state store's (the state's models are not imported: status reads the
summaries); pydantic's plugin loader replaced by one of no plugins, as kiro.cli.main does before Typer's first
validator (kiro.plugins.no_pydantic_plugins: no importlib.metadata); the config's validators built; the config
resolved; the whole command).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from kiro import timeutil
from kiro.store.state import CompletedStep, CurrentStep, LoopState
from kiro.store.statestore import StateStore
from kiro.store.workspace import Workspace

# Byte-code caching on, as in a normal install (some sandboxes set PYTHONDONTWRITEBYTECODE, which
# makes every start compile kiro's sources again).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
HEAVY = ("pydantic", "yaml", "asyncio", "typer", "rich", "openai", "watchfiles", "httpx", "temporalio")


def run_once(argv: list[str], cwd: Path) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (user+sys, from wait4) and stdout of one fresh process."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=err, env=ENV)
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv[-4:])} failed ({proc.returncode}): {err.read().decode()[-500:]}")
        return wall, usage.ru_utime + usage.ru_stime, out.read().decode()


def rss_of(argv: list[str], cwd: Path) -> int:
    """Peak RSS (KiB) of one run, as GNU time measures it (from a small parent: a fork of this
    benchmark would count its pages too)."""
    with tempfile.NamedTemporaryFile("r") as report:
        subprocess.run(["/usr/bin/time", "-o", report.name, "-f", "%M", *argv], cwd=cwd, env=ENV, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return int(report.read().split()[-1])


class Timer:
    """Interleaved medians: each round runs every command once, so a busy machine weighs on all alike."""

    def __init__(self) -> None:
        self.walls: dict[str, list[float]] = {}
        self.cpus: dict[str, list[float]] = {}

    def run(self, name: str, argv: list[str], cwd: Path, check: Callable[[str], None] | None = None) -> None:
        if "cold" in name:  # an older kiro's status cache removed: the full scan of every loop
            (cwd / ".state" / "status_index").unlink(missing_ok=True)
        wall, cpu, out = run_once(argv, cwd)
        if check is not None:
            check(out)
        self.walls.setdefault(name, []).append(wall)
        self.cpus.setdefault(name, []).append(cpu)

    def wall(self, name: str) -> float:
        return statistics.median(self.walls[name])

    def cpu(self, name: str) -> float:
        return statistics.median(self.cpus[name])


def heavy_imports(argv: list[str], cwd: Path) -> list[str]:
    env = {**ENV, "PYTHONPROFILEIMPORTTIME": "1"}
    err = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=env).stderr
    names = {line.split("|")[-1].strip().split(".")[0] for line in err.splitlines() if line.startswith("import time")}
    return sorted(names & set(HEAVY))


TYPER_PARSE = """import typer
from pathlib import Path
app = typer.Typer()
@app.command()
def show(workspace: Path | None = typer.Option(None), task_id: str | None = None, json: bool = False) -> None:
    pass
app(["--task-id", "x"], standalone_mode=False)
"""


def instructions(argv: list[str], cwd: Path) -> int:
    """The instructions one run executes, as callgrind counts them (its own start-up excluded)."""
    r = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv], cwd=cwd, env=ENV,
                       capture_output=True, text=True, check=True)
    return int(next(line for line in r.stderr.splitlines() if "Collected :" in line).split()[-1])


# `kiro loop status`'s start-up in stages, each run with the ones before it (--stages).
STAGES = [
    ("import typer, typer._adapters", "import typer, typer._adapters"),
    ("kiro's CLI modules", "import kiro.cli, kiro.cli.loop, kiro.cli.launch"),
    ("kiro.store.config imported", "import kiro.store.config"),
    ("kiro.store.statestore imported", "import kiro.store.statestore"),
    ("no pydantic plugin loader (kiro.plugins)", "from kiro.plugins import no_pydantic_plugins; no_pydantic_plugins()"),
    ("the config's validators built", "import kiro.store.config as config; config._build()"),
    ("the config resolved", "from kiro.store.settings import settings_for; from kiro.store.workspace import "
                            "Workspace; settings_for(Workspace.find(None))"),
    ("the whole command", "import sys; sys.argv = ['kiro', 'loop', 'status']; from kiro.cli import main; main()"),
]


def stages(cwd: Path) -> list[str]:
    """Each stage's instructions above the one before it (callgrind, one run each)."""
    lines, before = [], 0
    for i, (name, _code) in enumerate(STAGES):
        code = "\n".join(c for _n, c in STAGES[:i + 1])
        subprocess.run([sys.executable, "-c", code], cwd=cwd, env=ENV, capture_output=True, check=True)  # byte code
        ir = instructions([sys.executable, "-c", code], cwd)
        lines.append(f"    {name}: {ir / 1e6:.0f} M" + (f" (+{(ir - before) / 1e6:.0f} M)" if before else ""))
        before = ir
    return lines


def make_workspace(root: Path, loops: int) -> None:
    for name in ("Specs", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
        (root / name).mkdir()
    store = StateStore(Workspace(root))
    statuses = ["paused", "completed", "failed", "running", "max_iterations"]
    for i in range(loops):
        st = LoopState(task_id=f"task_{i:04d}", task_path=f"Specs/t{i}/tasks.md", status=statuses[i % 5],
                       iteration=i % 97, steps_total=20, steps_done=i % 20, title=f"Task {i}")
        st.completed_steps = [CompletedStep(step_id=str(j), description=f"step {j}", completed_at=timeutil.iso(),
                                            duration_seconds=3.0) for j in range(i % 20)]
        if i % 20 < 19:
            st.current_step = CurrentStep(step_id=str(i % 20), description=f"step {i % 20}", status="in_progress")
        st.total_successes = i % 20
        st.refresh_metrics()
        store.save(st, fsync=False)


def lists_all(loops: int) -> Callable[[str], None]:
    def check(out: str) -> None:
        lines = out.splitlines()
        ids = {line.split()[0] for line in lines[1:]}
        assert lines[0].startswith("TASK ID") and len(lines) == loops + 1, f"{len(lines) - 1} rows, not {loops}"
        assert ids == {f"task_{i:04d}" for i in range(loops)}, "the table misses loops"
    return check


def json_lists_all(loops: int) -> Callable[[str], None]:
    def check(out: str) -> None:
        rows = json.loads(out)
        assert len(rows) == loops and {r["task_id"] for r in rows} == {f"task_{i:04d}" for i in range(loops)}
    return check


def make_log(root: Path, events: int) -> None:
    for name in ("Specs", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
        (root / name).mkdir()
    st = LoopState(task_id="big", task_path="Specs/big/tasks.md", status="completed")
    StateStore(Workspace(root)).save(st, fsync=False)
    with open(root / "Logs" / "big.jsonl", "w", encoding="utf-8") as fh:
        for i in range(events):
            kind = ("step_started", "tool_called", "step_completed")[i % 3]
            fh.write(json.dumps({"ts": "2026-11-22T10:00:00.000+00:00", "task_id": "big", "iteration": i // 3,
                                 "event": kind, "step_id": str(i // 3), "description": f"step {i // 3}",
                                 "duration_seconds": 1.5, "tool": "read_file", "arguments": {"path": "x.py"},
                                 "seq": i}) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loops", default="50,1000")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--other", type=Path, help="the bin/ folder of another checkout's venv (e.g. main's)")
    ap.add_argument("--instructions", action="store_true", help="also count instructions with callgrind")
    ap.add_argument("--stages", action="store_true", help="with --instructions: `loop status`'s start-up in stages")
    args = ap.parse_args()
    trees = {"this": Path(sys.executable).parent}
    if args.other:
        trees["other"] = args.other
    with tempfile.TemporaryDirectory() as tmp:
        base_dir = Path(tmp)
        loop_counts = [int(x) for x in args.loops.split(",")]
        logs = base_dir / "logs"
        logs.mkdir()
        make_log(logs, args.events)

        def last_ten(out: str) -> None:
            seqs = [json.loads(line)["seq"] for line in out.splitlines()]
            assert seqs == list(range(args.events - 10, args.events)), seqs

        def last_ten_text(out: str) -> None:
            last = (args.events - 1) // 3
            assert len(out.splitlines()) == 10 and f"[{last}] " in out.splitlines()[-1], out

        commands: list[tuple[str, list[str], Path, Callable[[str], None] | None]] = [
            ("pass", [sys.executable, "-c", "pass"], base_dir, None),
            ("typer", [sys.executable, "-c", "import typer, typer._adapters"], base_dir, None)]
        for tree, bin_dir in trees.items():
            kiro = [str(bin_dir / "kiro")]
            for n in loop_counts:
                root = base_dir / f"{tree}{n}"  # a workspace per tree: an older kiro may write caches in it
                root.mkdir()
                make_workspace(root, n)
                commands += [(f"{tree} status{n}", [*kiro, "loop", "status"], root, lists_all(n)),
                             (f"{tree} json{n}", [*kiro, "loop", "status", "--json"], root, json_lists_all(n))]
                if tree != "this":
                    commands.append((f"{tree} cold{n}", [*kiro, "loop", "status"], root, lists_all(n)))
            commands += [(f"{tree} tail", [*kiro, "loop", "logs", "--tail", "10"], logs, last_ten_text),
                         (f"{tree} tailjson", [*kiro, "loop", "logs", "--tail", "10", "--json"], logs, last_ten)]
        timer = Timer()
        for _name, argv, cwd, _check in commands:  # warm-up: byte-code caches (and an older kiro's own caches)
            run_once(argv, cwd)
        for _ in range(args.runs):
            for name, argv, cwd, check in commands:
                timer.run(name, argv, cwd, check)
        base, base_cpu = timer.wall("pass"), timer.cpu("pass")
        typer_wall, typer_cpu = timer.wall("typer"), timer.cpu("typer")
        lines = [f"python -c pass: {base * 1000:.1f} ms wall, {base_cpu * 1000:.1f} ms CPU (medians of {args.runs}, "
                 f"interleaved; load {os.getloadavg()[0]:.2f})",
                 f"python -c 'import typer, typer._adapters': {typer_wall * 1000:.1f} ms wall, "
                 f"{typer_cpu * 1000:.1f} ms CPU; kiro's own share below is a command's time above this"]

        def own(name: str) -> str:
            return (f"kiro's own {(timer.wall(name) - typer_wall) * 1000:.1f} ms wall, "
                    f"{(timer.cpu(name) - typer_cpu) * 1000:.1f} ms CPU")
        size = (logs / "Logs" / "big.jsonl").stat().st_size
        for tree, bin_dir in trees.items():
            kiro = [str(bin_dir / "kiro")]
            lines.append(f"{tree} ({bin_dir}):")
            for n in loop_counts:
                table, cpu = timer.wall(f"{tree} status{n}"), timer.cpu(f"{tree} status{n}")
                lines.append(f"  kiro loop status, {n:>4} loops: {table * 1000:6.1f} ms = {table / base:.2f}x "
                             f"python -c pass (CPU {cpu * 1000:.1f} ms = {cpu / base_cpu:.2f}x); "
                             f"--json {timer.wall(f'{tree} json{n}') * 1000:.1f} ms; {own(f'{tree} status{n}')}")
                if f"{tree} cold{n}" in timer.walls:
                    cold = timer.wall(f"{tree} cold{n}")
                    lines.append(f"    without its status_index cache: {cold * 1000:.1f} ms = {cold / base:.2f}x")
                heavy = heavy_imports([*kiro, "loop", "status"], base_dir / f"{tree}{n}")
                lines.append(f"    heavy modules imported: {', '.join(heavy) if heavy else 'none'}")
            tail_text, tail_json = timer.wall(f"{tree} tail"), timer.wall(f"{tree} tailjson")
            rss = rss_of([*kiro, "loop", "logs", "--tail", "10"], logs)
            lines.append(f"  kiro loop logs --tail 10, {args.events} events ({size / 2**20:.0f} MiB): "
                         f"{tail_text * 1000:.1f} ms = {tail_text / base:.2f}x python -c pass "
                         f"(CPU {timer.cpu(f'{tree} tail') * 1000:.1f} ms; --json {tail_json * 1000:.1f} ms), "
                         f"peak RSS {rss / 1024:.1f} MiB; {own(f'{tree} tail')}")
            heavy = heavy_imports([*kiro, "loop", "logs", "--tail", "10"], logs)
            lines.append(f"    heavy modules imported: {', '.join(heavy) if heavy else 'none'}")
        lines.append(f"python -c pass peak RSS {rss_of([sys.executable, '-c', 'pass'], logs) / 1024:.1f} MiB")
        if args.instructions:
            n = loop_counts[0]
            typer_ir = instructions([sys.executable, "-c", "import typer, typer._adapters"], base_dir)
            parse_ir = instructions([sys.executable, "-c", TYPER_PARSE], base_dir)
            lines.append(f"instructions (callgrind): import typer, typer._adapters {typer_ir / 1e6:.0f} M; "
                         f"typer parse (its adapters, the plugin scan) {parse_ir / 1e6:.0f} M")
            for tree, bin_dir in trees.items():
                kiro = [str(bin_dir / "kiro")]
                status_ir = instructions([*kiro, "loop", "status"], base_dir / f"{tree}{n}")
                logs_ir = instructions([*kiro, "loop", "logs", "--tail", "10"], logs)
                lines.append(f"  {tree}: loop status ({n} loops) {status_ir / 1e6:.0f} M, kiro's own "
                             f"{(status_ir - typer_ir) / 1e6:.0f} M ({(status_ir - parse_ir) / 1e6:.0f} M above typer "
                             f"parse); loop logs --tail 10 {logs_ir / 1e6:.0f} M, kiro's own "
                             f"{(logs_ir - typer_ir) / 1e6:.0f} M ({(logs_ir - parse_ir) / 1e6:.0f} M)")
            if args.stages:
                lines.append(f"  this: loop status ({n} loops) in stages, each with the ones before it:")
                lines += stages(base_dir / f"this{n}")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
