"""Probing a loop's lock while `start` takes it: false "already running" failures out of N acquires,
with a tight prober in another thread, for the probe kiro uses (/proc/locks, never takes the lock) and
for the old try-and-release probe, side by side.

    python bench/lock_probe.py [--starts 2000]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kiro.errors import LockHeld
from kiro.fs import locks
from kiro.store.statestore import StateStore
from kiro.store.workspace import Workspace


def trial(store: StateStore, probe: Callable[[Path], bool], starts: int) -> tuple[int, int, float]:
    path = store.ws.lock_file("b")
    stop = threading.Event()
    probes = 0

    def prober() -> None:
        nonlocal probes
        while not stop.is_set():
            probe(path)
            probes += 1

    t = threading.Thread(target=prober)
    t.start()
    failures = 0
    t0 = time.perf_counter()
    try:
        for _ in range(starts):
            try:
                lock = store.acquire("b")
            except LockHeld:
                failures += 1
                continue
            store.release("b", lock)
    finally:
        stop.set()
        t.join()
    return failures, probes, (time.perf_counter() - t0) / starts * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=2000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = StateStore(Workspace(Path(tmp)))
        store.release("b", store.acquire("b"))
        for name, probe in (("/proc/locks probe (kiro)", locks.is_held),
                            ("try-and-release probe (before)", locks._try_and_release)):
            failures, probes, us = trial(store, probe, args.starts)
            print(f"lock probe: {name}: {failures} false 'already running' in {args.starts} acquires "
                  f"against {probes} probes ({us:.0f} us per acquire+release)")


if __name__ == "__main__":
    main()
