"""What a receipt (SPEC §14) costs per step: seconds and bytes of state.

    python bench/receipts.py [--steps 20] [--protected 50] [--previous-tree DIR]

A git project with `--protected` files under tests/ (protected_paths: ['tests/**']), a shell task of
`--steps` steps that each append a line to app.py, and `verify: true`. The loop is run with this tree's kiro and
(with --previous-tree, a checkout of main before receipts: `git archive main | tar -x -C DIR`) with that tree's,
each in a fresh subprocess. Printed per tree: wall seconds per step (the whole run over the steps; this machine's
speed moves by a third between runs), the state file's bytes (archived, journal folded in), and, for this tree,
the receipt's bytes per step (its JSON in the state).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=B", "-c", "user.email=b@example.com", *args], cwd=cwd, check=True,
                   capture_output=True)


def run(tree: Path, steps: int, protected: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "vault"
        for name in ("Specs/b", "Done", "config", ".state", "tests"):
            (ws / name).mkdir(parents=True)
        for i in range(protected):
            (ws / "tests" / f"test_{i}.py").write_text(f"def test_{i}():\n    assert {i} == {i}\n" * 5)
        (ws / "app.py").write_text("")
        (ws / ".gitignore").write_text("")
        git(ws, "init", "-q", "-b", "main")
        git(ws, "add", "-A")
        git(ws, "commit", "-qm", "start")
        guarded = "protected_paths: ['tests/**']\n" if (tree / "kiro" / "store" / "receipts.py").exists() else ""
        (ws / "config" / "autonomous_loop.yaml").write_text(
            f"verify: 'true'\n{guarded}sandbox: off\nautonomous_loop:\n  archive_state_file: true\n")
        lines = ["---", "executor: shell", "---"]
        for i in range(1, steps + 1):
            lines += [f"- [ ] {i}. Step {i}", "  ```sh", f"  echo line{i} >> app.py", "  ```"]
        (ws / "Specs" / "b" / "tasks.md").write_text("\n".join(lines) + "\n")
        env = {**os.environ, "PYTHONPATH": str(tree)}
        env.pop("KIRO_RAISE_ERRORS", None)
        began = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "kiro", "loop", "start", "--task", "Specs/b/tasks.md",
                               "--task-id", "bench"], cwd=ws, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - began
        assert proc.returncode == 0, proc.stdout + proc.stderr
        state_file = ws / ".state" / "archive" / "autonomous_loop_bench.json"
        state = json.loads(state_file.read_text())
        receipts = [c["receipt"] for c in state["completed_steps"] if c.get("receipt")]
        return {"seconds_per_step": wall / steps, "state_bytes": state_file.stat().st_size,
                "receipt_bytes_per_step": (sum(len(json.dumps(r)) for r in receipts) / len(receipts)) if receipts
                else 0.0, "receipts": len(receipts)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--protected", type=int, default=50)
    ap.add_argument("--previous-tree", type=Path)
    a = ap.parse_args()
    trees = [("this tree", HERE)] + ([("previous", a.previous_tree)] if a.previous_tree else [])
    for name, tree in trees:
        r = run(tree, a.steps, a.protected)
        print(f"{name:10} {a.steps} steps, {a.protected} protected files: {r['seconds_per_step']:.3f} s/step, "
              f"state {r['state_bytes']:,} bytes, receipts {r['receipts']} ({r['receipt_bytes_per_step']:.0f} "
              f"bytes each)")


if __name__ == "__main__":
    main()
