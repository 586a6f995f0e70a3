"""What the step guard costs: starting `true` through run_process with and without it.

    python bench/step_spawn.py [--runs 50]

Prints figures; asserts nothing. "guarded" is what every step, verify, agent CLI and notifier pays
(setpriv --pdeathsig, the sh guard, the ledger write); "bare" is the same call with setpriv
hidden (no guard, no death signal).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from kiro.executors import groups
from kiro.executors.process import run_process


async def spawn(n: int, cwd: Path) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        result = await run_process(["true"], cwd=cwd)
        assert result.ok
        out.append(time.perf_counter() - started)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=50)
    n = ap.parse_args().runs
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        ledger = groups.Ledger(cwd / "ledger.json")
        groups.current_ledger.set(ledger)
        guarded = asyncio.run(spawn(n, cwd))
        real = groups.setpriv_path
        groups.setpriv_path = lambda: None  # type: ignore[assignment]
        try:
            bare = asyncio.run(spawn(n, cwd))
        finally:
            groups.setpriv_path = real  # type: ignore[assignment]
    for name, xs in (("guarded", guarded), ("bare", bare)):
        xs.sort()
        print(f"{name:8} `true` x{n}: median {statistics.median(xs) * 1000:.1f} ms, "
              f"p95 {xs[int(len(xs) * 0.95) - 1] * 1000:.1f} ms")
    print(f"guard overhead per process: {(statistics.median(guarded) - statistics.median(bare)) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
