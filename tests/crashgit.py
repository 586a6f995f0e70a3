"""SIGKILLs at random points around git checkpoints, shared by the slow test and bench/git_crash.py.

Each step appends its id to `side_effects.log` in a folder beside the workspace (never committed; the
config's `sandbox_paths.rw` lets the step's box write there, its path in $CRASH_SIDE_LOG) and writes
`files/<id>.txt` (the project change its checkpoint commits). kiro is killed at random moments,
half of the time with its whole process group (so a git it runs dies mid-write too), then resumed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from kiro.store import tasks
from kiro.store.state import LoopState
from tests import cli_forkserver
from tests.gitutil import changed_in, files_in, fsck_problems, git, git_env, init_repo, trailers

STEP = ('mkdir -p files; echo "$KIRO_STEP_ID" >> "$CRASH_SIDE_LOG"; '
        'echo "$KIRO_STEP_ID" > files/$KIRO_STEP_ID.txt')


def task_text(n: int) -> str:
    return "\n".join(["---", "title: crashy", "executor: shell", "---", "# Plan"]) + "\n" + step_lines(1, n)


def step_lines(first: int, last: int) -> str:
    lines = []
    for i in range(first, last + 1):
        lines += [f"- [ ] {i}. Step {i}", "  ```sh", f"  {STEP}", "  ```"]
    return "\n".join(lines) + "\n"


AHEAD = 15  # steps left to do at each start while kills remain (a round does 0-5 on a fast machine: never all)


@dataclass
class Report:
    kills: int = 0
    group_kills: int = 0
    modes: Counter[str] = field(default_factory=Counter)
    runs: int = 0
    events: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    steps: int = 0  # the task's steps at the end


def _state_file(root: Path, tid: str) -> Path | None:
    for p in (root / ".state" / f"autonomous_loop_{tid}.json", root / ".state/archive" / f"autonomous_loop_{tid}.json"):
        if p.exists():
            return p
    return None


def side_log(root: Path) -> Path:
    """Where the steps note that they ran: beside the workspace, granted to the step's box."""
    return root.parent / f"{root.name}-side" / "side_effects.log"


def _setup(root: Path, config: str) -> dict[str, str]:
    """The config (with the box's grant of the side log's folder) and the environment kiro runs with."""
    side_log(root).parent.mkdir(parents=True, exist_ok=True)
    (root / "config/autonomous_loop.yaml").write_text(
        config + f"sandbox_paths:\n  rw: [{json.dumps(str(side_log(root).parent))}]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KIRO_", "OPENAI_", "GIT_"))}
    env["KIRO_RAISE_ERRORS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"  # (as the other tests' kiro runs: one fork server serves them all)
    env["CRASH_SIDE_LOG"] = str(side_log(root))
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def start(args: list[str], root: Path, env: dict[str, str], out: int | None = None) -> cli_forkserver.ForkedProcess:
    """`python -m kiro *args` in `root`, in a session and process group of its own (a kill of the group takes
    the gits it runs too), its output to the file descriptor `out` (None: nowhere). A process of its own, forked
    from the test process's kiro fork server (tests/cli_forkserver.py): no interpreter start and imports each
    time (3-7 s on a loaded machine), the rest as a `subprocess.Popen` of it."""
    null = os.open(os.devnull, os.O_WRONLY) if out is None else None
    try:
        return cli_forkserver.ForkedProcess(args, cwd=root, env=env, stdout=out if null is None else null,
                                            stderr=out if null is None else null, start_new_session=True)
    finally:
        if null is not None:
            os.close(null)


def kill(proc: cli_forkserver.ForkedProcess, rng: random.Random) -> bool | None:
    """SIGKILL a loop's process group (the gits and steps it runs with it) or its process alone, by a coin toss
    of `rng`: True for the group, False for the process alone, None when it ended on its own between the
    caller's poll and the kill (no kill)."""
    group = rng.random() < 0.5
    try:
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.send_signal(signal.SIGKILL)
    except ProcessLookupError:
        return None
    return group


def _counts(root: Path) -> Counter[str]:
    p = side_log(root)
    return Counter(p.read_text().split()) if p.exists() else Counter()


def _wait_for_git(root: Path, mode: str, proc: cli_forkserver.ForkedProcess, rng: random.Random) -> None:
    lock = root / ".git/index.lock"
    ref = root / ".git/refs/heads/main"
    try:
        before = ref.stat().st_mtime_ns
    except FileNotFoundError:
        before = 0
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and proc.poll() is None:
        if mode == "index_lock" and lock.exists():
            break
        if mode == "new_commit":
            try:
                if ref.stat().st_mtime_ns != before:
                    break
            except FileNotFoundError:
                pass
        time.sleep(0.0002)
    time.sleep(rng.uniform(0.0, 0.003))


def run(root: Path, *, steps: int, kills: int, seed: int, max_delay: float = 0.2) -> Report:
    """Kill `kills` times, then let the loop finish; check every promise. Problems are collected,
    not raised, so that a benchmark can print them.

    The task starts with `steps` steps; while kills remain, steps are added to its end between runs (as a
    person may add to a plan) so that AHEAD are left at each start: however fast the machine, the loop is
    killed mid-task every time, and what is left to run unkilled after the last kill is short."""
    started = time.monotonic()
    rep = Report()
    for name in ("Specs/crashy", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
        (root / name).mkdir(parents=True, exist_ok=True)
    env = _setup(root, "autonomous_loop:\n  max_iterations: 100000\n  backoff_base_seconds: 0.01\n")
    (root / "Specs/crashy/tasks.md").write_text(task_text(steps))
    init_repo(root)
    rng = random.Random(seed)
    tid = "crashy"
    frozen: dict[str, int] = {}
    seen_commits: dict[str, str] = {}  # step id -> the checkpoint the state first recorded
    created = False
    state: LoopState | None = None
    total = steps
    while rep.kills < kills:
        if state is not None and total - len(state.completed_steps) < AHEAD:  # (kiro is not running)
            with open(root / state.task_path, "a") as fh:
                fh.write(step_lines(total + 1, total + AHEAD))
            total += AHEAD
        args = (["loop", "start", "--task", "Specs/crashy/tasks.md", "--task-id", tid] if not created
                else ["loop", "resume", "--task-id", tid])
        with open(root.parent / "crash_run.out", "w") as out:
            proc = start(args, root, env, out.fileno())
        rep.runs += 1
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:  # wait until this process runs the loop
            p = _state_file(root, tid)
            try:
                if p is not None and json.loads(p.read_text()).get("pid") == proc.pid:
                    break
            except ValueError:
                pass
            time.sleep(0.005)
        mode = rng.choice(("random", "index_lock", "new_commit"))
        rep.modes[mode] += 1
        if mode == "random":
            time.sleep(rng.uniform(0.0, max_delay))
        else:  # aim: while git holds the index lock, or right after a commit moved the branch
            _wait_for_git(root, mode, proc, rng)
        if proc.poll() is None and (group := kill(proc, rng)) is not None:
            rep.group_kills += group
            rep.kills += 1
        code = proc.wait(timeout=60)
        p = _state_file(root, tid)
        if p is None:
            continue
        created = True
        state = LoopState.model_validate_json(p.read_bytes())
        counts = _counts(root)
        task_file = root / state.task_path
        checked = {s.id for s in tasks.load(task_file).steps if s.done} if task_file.exists() else None
        for c in state.completed_steps:
            frozen.setdefault(c.step_id, counts[c.step_id])
            if c.checkpoint:
                first = seen_commits.setdefault(c.step_id, c.checkpoint)
                if first != c.checkpoint:
                    rep.problems.append(f"step {c.step_id}: checkpoint changed from {first} to {c.checkpoint}")
            if checked is not None and c.step_id not in checked:
                rep.problems.append(f"step {c.step_id} recorded completed but its box is not checked")
        if state.status == "completed":
            if code != 0:
                rep.problems.append(f"completed with exit {code}")
            break
    if state is None or state.status != "completed":
        r = cli_forkserver.run(["loop", "resume", "--task-id", tid], cwd=root, env=env, timeout=600)
        if r.returncode != 0:
            rep.problems.append(f"final resume exit {r.returncode}: {r.stdout[-500:]} {r.stderr[-500:]}")
    p = _state_file(root, tid)
    assert p is not None
    final = LoopState.model_validate_json(p.read_bytes())
    rep.seconds = time.monotonic() - started
    if final.status != "completed":
        rep.problems.append(f"final status {final.status}")
    counts = _counts(root)
    for sid, n in frozen.items():
        if counts[sid] != n:
            rep.problems.append(f"step {sid} ran again after the state recorded it completed ({n} -> {counts[sid]})")
    rep.steps = total
    ids = [str(i) for i in range(1, total + 1)]
    if [c.step_id for c in final.completed_steps] != ids:
        rep.problems.append(f"completed steps {[c.step_id for c in final.completed_steps]}")
    # git: one commit per step, whole, in the history, with the step's change; nothing half-made
    history = _history(root)
    per_step: Counter[str] = Counter()
    for t, _ in history.values():
        if t.get("Kiro-Task-Id") == tid:
            per_step[t.get("Kiro-Step-Id", "?")] += 1
    for sid in ids:
        if per_step[sid] != 1:
            rep.problems.append(f"step {sid} has {per_step[sid]} commits")
    for c in final.completed_steps:
        if not c.checkpoint:
            rep.problems.append(f"step {c.step_id} has no checkpoint ({c.checkpoint_note})")
            continue
        if seen_commits.get(c.step_id, c.checkpoint) != c.checkpoint:
            rep.problems.append(f"step {c.step_id}: final checkpoint differs from the first one recorded")
        found, changed = history.get(c.checkpoint) or (trailers(root, c.checkpoint), changed_in(root, c.checkpoint))
        if found.get("Kiro-Step-Id") != c.step_id:
            rep.problems.append(f"step {c.step_id}: checkpoint {c.checkpoint} has other trailers")
        if f"files/{c.step_id}.txt" not in changed:
            rep.problems.append(f"step {c.step_id}: checkpoint does not hold files/{c.step_id}.txt")
    head_files = files_in(root, "HEAD")
    missing = [s for s in ids if f"files/{s}.txt" not in head_files]
    if missing:
        rep.problems.append(f"HEAD lacks files of steps {missing[:10]}")
    rep.problems += [f"fsck: {x}" for x in fsck_problems(root)]
    status = subprocess.run(["git", "status", "--porcelain", "--", "files", "README.md"], cwd=root, env=git_env(),
                            capture_output=True, text=True).stdout
    if status:
        rep.problems.append(f"uncommitted project changes left: {status[:200]}")
    locks = [str(p) for p in (root / ".git").rglob("*.lock")]
    if locks:
        rep.problems.append(f"lock files left: {locks}")
    for record in (root / "Logs" / f"{tid}.jsonl").read_text().splitlines():
        try:
            rep.events[json.loads(record)["event"]] += 1
        except (ValueError, KeyError):
            continue
    return rep


def _history(root: Path) -> dict[str, tuple[dict[str, str], set[str]]]:
    """Each commit of HEAD's history: its Kiro- trailers and the files it changed, as tests.gitutil's
    `trailers` and `changed_in` read them, from one `git log` (not two git processes a commit)."""
    out: dict[str, tuple[dict[str, str], set[str]]] = {}
    for record in git(root, "log", "--format=%x1e%H%n%B%x1f", "--name-only", "HEAD").split("\x1e")[1:]:
        head, _, names = record.partition("\x1f")
        sha, _, body = head.partition("\n")
        found = {}
        for line in body.splitlines():
            if line.startswith("Kiro-") and ":" in line:
                k, _, v = line.partition(":")
                found[k] = v.strip()
        out[sha] = found, set(names.split())
    return out


MERGE_STEP = ('echo "$KIRO_TASK_ID" >> "$CRASH_SIDE_LOG"; mkdir -p "out/$KIRO_TASK_ID"; '
              'for i in $(seq 1 60); do echo "$KIRO_TASK_ID $i" > "out/$KIRO_TASK_ID/$i.txt"; done; '
              'echo "$KIRO_TASK_ID" >> README.md')


def run_merges(root: Path, *, loops: int, seed: int) -> Report:
    """`isolation: worktree` + `merge: auto`: each loop is killed once or twice around its merge into
    main (aimed at main's index lock and branch ref), then resumed until it finishes."""
    started = time.monotonic()
    rep = Report()
    for name in ("Specs", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
        (root / name).mkdir(parents=True, exist_ok=True)
    env = _setup(root, "autonomous_loop:\n  backoff_base_seconds: 0.01\nisolation: worktree\nmerge: auto\n")
    init_repo(root)
    (root / "README.md").write_text("# project\n" + "".join(f"line {i}\n" for i in range(40)))
    git(root, "commit", "-qam", "a longer README")
    rng = random.Random(seed)
    lock, ref = root / ".git/index.lock", root / ".git/refs/heads/main"
    for n in range(loops):
        tid = f"m{n}"
        (root / f"Specs/{tid}").mkdir(parents=True)
        (root / f"Specs/{tid}/tasks.md").write_text(
            f"---\ntitle: {tid}\nexecutor: shell\n---\n- [ ] 1. Write\n  ```sh\n  {MERGE_STEP}\n  ```\n")
        created = False
        for attempt in range(10):
            args = (["loop", "start", "--task", f"Specs/{tid}/tasks.md", "--task-id", tid] if not created
                    else ["loop", "resume", "--task-id", tid])
            proc = start(args, root, env)
            rep.runs += 1
            if attempt < 2:
                mode = rng.choice(("index_lock", "new_commit", "random"))
                rep.modes[mode] += 1
                before = ref.stat().st_mtime_ns
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and proc.poll() is None:
                    if mode == "index_lock" and lock.exists():
                        break
                    if mode == "new_commit" and ref.stat().st_mtime_ns != before:
                        break
                    if mode == "random" and _state_file(root, tid) is not None:
                        time.sleep(rng.uniform(0.0, 0.6))
                        break
                    time.sleep(0.0002)
                time.sleep(rng.uniform(0.0, 0.002))
                if proc.poll() is None and (group := kill(proc, rng)) is not None:
                    rep.group_kills += group
                    rep.kills += 1
            code = proc.wait(timeout=120)
            created = created or _state_file(root, tid) is not None
            if code == 0:
                break
            if code not in (-9, 137):
                rep.problems.append(f"{tid}: exit {code}")
                break
        st = LoopState.model_validate_json(_state_file(root, tid).read_bytes())  # type: ignore[union-attr]
        if st.status != "completed" or st.git is None or st.git.merge_status != "merged":
            rep.problems.append(f"{tid}: {st.status} {st.stop_reason} merge {st.git and st.git.merge_status} "
                                f"{st.git and st.git.conflict_files}: "
                                + " | ".join(ln for ln in (root / "Logs" / f"{tid}.jsonl").read_text().splitlines()
                                             if '"merge_' in ln)[-600:])
        if (root / ".kiro/worktrees" / tid).exists():
            rep.problems.append(f"{tid}: worktree left after the merge")
        for record in (root / "Logs" / f"{tid}.jsonl").read_text().splitlines():
            try:
                rep.events[json.loads(record)["event"]] += 1
            except (ValueError, KeyError):
                continue
    rep.seconds = time.monotonic() - started
    runs = Counter(side_log(root).read_text().split())
    merges: Counter[str] = Counter()
    for sha in git(root, "rev-list", "--first-parent", "main").split():
        merges[trailers(root, sha).get("Kiro-Merge", "")] += 1
    for n in range(loops):
        tid = f"m{n}"
        if merges[f"kiro/{tid}"] != 1:
            rep.problems.append(f"{tid}: {merges[f'kiro/{tid}']} merge commits on main")
        # a step killed mid-run runs again on resume (SPEC §4); a step recorded completed never does
        kinds = [json.loads(ln).get("event") for ln in (root / "Logs" / f"{tid}.jsonl").read_text().splitlines()
                 if ln.strip()]
        # (completed: by the run itself, or found by its commit's trailers after a kill: step_recovered)
        done = [i for i, k in enumerate(kinds) if k in ("step_completed", "step_recovered")]
        if len(done) != 1 or "step_started" in kinds[done[0]:]:
            rep.problems.append(f"{tid}: completed {len(done)} times, started again after completing: "
                                f"{bool(done) and 'step_started' in kinds[done[0]:]}")
        if not 1 <= runs[tid] <= kinds.count("step_started"):
            rep.problems.append(f"{tid}: its step ran {runs[tid]} times for {kinds.count('step_started')} starts")
        if not (root / f"out/{tid}/60.txt").exists() or f"{tid}\n" not in (root / "README.md").read_text():
            rep.problems.append(f"{tid}: its files are not in the main tree")
    status = git(root, "status", "--porcelain", "--untracked-files=no")
    if status:
        rep.problems.append(f"main tree not clean: {status[:300]}")
    rep.problems += [f"fsck: {x}" for x in fsck_problems(root)]
    locks = [str(p) for p in (root / ".git").rglob("*.lock")]
    if locks:
        rep.problems.append(f"lock files left: {locks}")
    if len(git(root, "worktree", "list", "--porcelain").split("\n\n")) > 1 + 1:
        rep.problems.append("worktrees left: " + git(root, "worktree", "list"))
    return rep
