"""What one state save of a running loop costs kiro (issue #41): a loop's journal (kiro.store.statestore's
LiveJournal) taking the saves of N steps of `true` as the engine makes them, one save a step (a step's
closing save and the next one's opening save are one record: `Loop.save_soon`), each with a checked box's
descriptor to fdatasync first.

    python bench/save_cost.py [--saves 20 120] [--rounds 3] [--previous-tree DIR] [--callgrind]

Each run is a fresh interpreter (the tree's kiro first on PYTHONPATH, this venv's packages); what a step
changes is what the engine changes: `iteration`, a new `current_step`, a `completed_steps` item with its
receipt, `total_successes`. Printed per save: the calling thread's CPU (`time.thread_time`: the record,
its JSON, the append, both fdatasyncs, the summary) and, with --callgrind, the instructions of the whole
process (valgrind's callgrind, PYTHONHASHSEED=0: a MANY-save run minus a FEW-save run, divided by the
difference; kernel work such as the fdatasyncs is not in it). With --previous-tree the trees take turns.
The journal is checked: it replays to the state saved.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

INNER = r'''
import json, os, sys, tempfile, time
from pathlib import Path
from kiro import timeutil
from kiro.store import journal
from kiro.store.receipts import Receipt
from kiro.store.state import CompletedStep, CurrentStep, LoopState
from kiro.store.statestore import StateStore
from kiro.store.workspace import Workspace

n = int(sys.argv[1])
root = Path(tempfile.mkdtemp(prefix="kiro-savecost-", dir=os.environ.get("BENCH_TMP")))
(root / ".state").mkdir()
store = StateStore(Workspace(root))
state = LoopState(task_id="task_20261129_120000", task_path="Specs/bench/tasks.md", status="running",
                  executor="shell", max_iterations=100000, title="bench")
task = os.open(root / "tasks.md", os.O_RDWR | os.O_CREAT, 0o644)
os.write(task, b"- [ ] 1. Step 1\n" * 100)


def step(i: int) -> None:
    state.iteration += 1
    state.current_step = CurrentStep(step_id=str(i), description=f"Step {i}", status="in_progress",
                                     started_at=timeutil.iso())
    store.save_job(state)()
    now = timeutil.iso()
    state.completed_steps.append(CompletedStep(
        step_id=str(i), description=f"Step {i}", completed_at=now, duration_seconds=0.012, iteration=state.iteration,
        receipt=Receipt(step_id=str(i), title=f"Step {i}", executor="shell", attempts=1, started_at=now,
                        finished_at=now, duration_seconds=0.012)))
    state.total_successes += 1
    state.current_step.status = "completed"
    os.pwrite(task, b"x", 3)  # the box, synced before the record that says so
    store.sync_before_next_save(state.task_id, os.dup(task))


store.open_journal(state)
for i in range(20):  # the first save writes a snapshot; a loop some way in
    step(i)
began = time.thread_time_ns()
for i in range(20, 20 + n):
    step(i)
spent = time.thread_time_ns() - began
live = store.journals[state.task_id]
with live.shadow_lock:
    # the state as saved: the shadow, its long lists from their encoded items (the shadow may hold them empty)
    expected = {k: [json.loads(p) for p in live.encoded[k]] if k in live.encoded and isinstance(v, list) else v
                for k, v in json.loads(json.dumps(live.shadow)).items()}
got = journal.read_state_dict(store.path(state.task_id))
assert got == expected and got["iteration"] == 20 + n, "the journal does not replay to the state saved"
store.close_journal(state.task_id)
print(json.dumps({"thread_ns": spent}))
'''


def run(tree: Path, saves: int, callgrind: bool) -> tuple[float, int | None]:
    """(thread CPU ns of the saves, the process's instructions or None) of one run with `tree`'s kiro."""
    env = dict(os.environ, PYTHONPATH=str(tree.resolve()), PYTHONHASHSEED="0")
    env.pop("KIRO_RAISE_ERRORS", None)
    cmd = [sys.executable, "-c", INNER, str(saves)]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        if callgrind:
            cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *cmd]
        # cwd: not a tree (`python -c` puts the current folder before PYTHONPATH)
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600, cwd=tmp)
        assert r.returncode == 0, r.stderr[-2000:]
        thread_ns = float(__import__("json").loads(r.stdout.strip().splitlines()[-1])["thread_ns"])
        found = re.search(r"Collected : (\d+)", r.stderr) if callgrind else None
        return thread_ns, int(found.group(1)) if found else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--saves", type=int, nargs=2, default=(20, 120), metavar=("FEW", "MANY"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--previous-tree", type=Path)
    ap.add_argument("--callgrind", action="store_true", help="also count instructions (slow: ~50x)")
    args = ap.parse_args()
    few, many = args.saves
    trees = [HERE] + ([args.previous_tree] if args.previous_tree else [])
    cpu: dict[Path, list[float]] = {t: [] for t in trees}
    instr: dict[Path, list[float]] = {t: [] for t in trees}
    for _ in range(args.rounds):
        for tree in trees:
            ns, small = run(tree, few, args.callgrind)
            ns_many, big = run(tree, many, args.callgrind)
            cpu[tree].append(ns_many / many / 1000)
            if small is not None and big is not None:
                instr[tree].append((big - small) / (many - few) / 1e6)
    print(f"python {sys.version.split()[0]}, load average {os.getloadavg()[0]:.2f}; one save a step "
          f"({many} saves; instructions: {many} minus {few}), medians of {args.rounds} rounds, the trees taking turns")
    for tree in trees:
        line = f"  {tree}: thread CPU {statistics.median(cpu[tree]):.1f} us per save " \
               f"(rounds {', '.join(f'{x:.1f}' for x in cpu[tree])})"
        if instr[tree]:
            line += f", {statistics.median(instr[tree]):.3f} M instructions per save"
        print(line)


if __name__ == "__main__":
    main()
