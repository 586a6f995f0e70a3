"""The trees taking turns: a `-c` script run in a fresh interpreter per tree (the tree's kiro first on PYTHONPATH),
round by round, its last printed number kept per tree, with the load average at each run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def in_turns(script: str, args: list[str], trees: list[Path], rounds: int,
             cwd: Path) -> tuple[dict[Path, list[float]], list[float]]:
    """`python -c script *args` for each tree in turn, `rounds` times: the figures by tree, and the loads."""
    got: dict[Path, list[float]] = {tree: [] for tree in trees}
    loads: list[float] = []
    for _ in range(rounds):
        for tree in trees:
            env = dict(os.environ, PYTHONPATH=str(tree))
            r = subprocess.run([sys.executable, "-c", script, *args], env=env, cwd=cwd,
                               capture_output=True, text=True, timeout=3600)  # not here: `-c` puts the cwd first
            assert r.returncode == 0, r.stderr[-2000:]
            got[tree].append(float(r.stdout.split()[-1]))
            loads.append(os.getloadavg()[0])
    return got, loads
