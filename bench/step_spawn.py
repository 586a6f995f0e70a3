"""What starting a step's process costs: `true` through run_process, before and after #12 item 3.

    python bench/step_spawn.py [--runs 50]

Prints figures; asserts only that every spawn succeeded and that a SIGKILLed parent's step group
dies (the guarantee both ways keep).

- "before": each child behind `setpriv --pdeathsig USR2` and a `sh` guard (kiro until #12), the
  ledger rewritten by rename-replace on every start and end of a group.
- "after": each child spawned directly in its own session (vfork-able: no preexec_fn, no wrapper),
  registered with the process's one reaper over a pipe; the ledger appended to.
- "bare": the same spawn with no death guarantee and no ledger at all: the floor.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kiro.fs.atomic import atomic_write
from kiro.processes import groups
from kiro.processes.spawn import run_process

OLD_GUARD = ('exec 3<&0; trap "kill -KILL 0" USR2; trap : TERM INT HUP; "$@" <&3 3<&- & pid=$!; exec 3<&-; '
             'while :; do wait "$pid"; rc=$?; kill -0 "$pid" 2>/dev/null || break; done; exit "$rc"')


def old_wrap(argv: list[str], *, confine: bool = False) -> list[str]:
    tool = groups.setpriv_path()
    assert tool is not None, "setpriv (util-linux) is needed for the 'before' figure"
    return [tool, "--pdeathsig", "USR2", "--", "/bin/sh", "-c", OLD_GUARD, "kiro-step", *argv]


class OldLedger(groups.Ledger):
    def add(self, pgid: int) -> None:
        self.groups[pgid] = self.token
        self._rewrite()

    def discard(self, pgid: int) -> None:
        if self.groups.pop(pgid, None) is not None:
            self._rewrite()

    def _rewrite(self) -> None:
        import json

        if self.groups:
            atomic_write(self.path, json.dumps({"groups": [{"pgid": g, "token": t}
                                                           for g, t in self.groups.items()]}), fsync=False)
        else:
            self.path.unlink(missing_ok=True)


async def spawn(n: int, cwd: Path) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        result = await run_process(["true"], cwd=cwd)
        assert result.ok, result
        out.append(time.perf_counter() - started)
    return out


def measure(name: str, n: int, cwd: Path) -> list[float]:
    real_wrap, real_register, real_unregister = groups.wrap, groups.register, groups.unregister
    if name == "before":
        groups.wrap = old_wrap  # type: ignore[assignment]
    if name in ("before", "bare"):
        groups.register = groups.unregister = lambda pgid: None  # type: ignore[assignment]
    ledger = {"before": OldLedger, "after": groups.Ledger}.get(name)
    groups.current_ledger.set(ledger(cwd / "processes" / f"{name}.json") if ledger else None)
    try:
        return asyncio.run(spawn(n, cwd))
    finally:
        groups.wrap, groups.register, groups.unregister = real_wrap, real_register, real_unregister  # type: ignore[misc]


CHILD = """
import asyncio, sys
from pathlib import Path
from kiro.processes.spawn import run_process
asyncio.run(run_process(["sh", "-c", "sleep 60 & echo $! > " + sys.argv[1] + "; sleep 60"], cwd=Path(".")))
"""


def dies_with_parent(cwd: Path) -> bool:
    """SIGKILL a process running a step whose shell has a background grandchild: both must die."""
    pid_file = cwd / "gc.pid"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(pid_file)], cwd=cwd)
    deadline = time.monotonic() + 20
    while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.02)
    grandchild = int(pid_file.read_text())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{grandchild}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError):
        os.kill(grandchild, signal.SIGKILL)
    return False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=50)
    n = ap.parse_args().runs
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        figures = {}
        samples: dict[str, list[float]] = {"before": [], "after": [], "bare": []}
        for name in samples:
            measure(name, 3, cwd)  # warm-up
        for _ in range(max(1, n // 10)):  # interleaved rounds: a busy machine weighs on all three alike
            for name, xs in samples.items():
                xs += measure(name, 10, cwd)
        for name, xs in samples.items():
            xs.sort()
            figures[name] = statistics.median(xs)
            print(f"{name:7} `true` x{n}: median {figures[name] * 1000:.2f} ms, "
                  f"p95 {xs[int(len(xs) * 0.95) - 1] * 1000:.2f} ms per step process")
        print(f"spawn cost per step: before {figures['before'] * 1000:.2f} ms, after {figures['after'] * 1000:.2f} ms "
              f"(x{figures['before'] / figures['after']:.1f} faster); the death guarantee costs "
              f"{(figures['after'] - figures['bare']) * 1000:.2f} ms over a bare spawn "
              f"(before: {(figures['before'] - figures['bare']) * 1000:.2f} ms)")
        ok = dies_with_parent(cwd)
        print(f"kill -9 of the parent: the step's background grandchild {'died' if ok else 'SURVIVED'}")
        if not ok:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
