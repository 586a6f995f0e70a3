"""Bad days (#7 items 12 and 13): a full disk, huge replies, writes killed half-way, a closed pipe,
output that is not a terminal, a very deep tree. Each test fails on the code before the fix."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiro.fs.bounds import EVENT_FIELD_CHARS, TRANSCRIPT_FIELD_CHARS
from kiro.store.events import EventLog
from kiro.store.logread import read_events
from kiro.store.transcript import Transcript
from tests import cli_forkserver
from tests.conftest import AGENTS_CACHE, FAST_CONFIG, Workspace, deep_tree, new_workspace, shell_task
from tests.fake_openai import invoke, make_harness

# -- item 12: a full disk ------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MiB filesystem (tmpfs) mounted for the test; skipped, saying why, where mounting is
    not permitted (not root, or no CAP_SYS_ADMIN in this container)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a 2 MiB tmpfs to fill up (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


FILL_TASK = """\
---
title: full
executor: shell
---
- [ ] 1. one
  ```sh
  echo 1 >> side.log
  ```
- [ ] 2. fill the disk (from inside the project: the step's box lets it write only there), and succeed
  ```sh
  echo 2 >> side.log; cat /dev/zero > fill_big 2>/dev/null || true
  i=0; while echo x > fill$i 2>/dev/null; do i=$((i+1)); done
  ```
- [ ] 3. three
  ```sh
  echo 3 >> side.log
  ```
""" + "".join(f"<!-- notes line {i:04d}: {'.' * 60} -->\n" for i in range(200))  # a file of several pages


def _fill(prefix: Path) -> None:
    """Take every free block: one big file, then small ones until not even one more fits."""
    with contextlib.suppress(OSError), open(f"{prefix}-big", "wb") as fh:
        while True:
            fh.write(b"\0" * 65536)
            fh.flush()
    for i in range(1000):
        try:
            Path(f"{prefix}-{i}").write_bytes(b"x")
        except OSError:
            break


def test_a_full_disk_stops_the_loop_cleanly_and_resume_just_works(small_disk: Path) -> None:
    root = small_disk / "vault"
    for name in ("Specs/feature", ".state", "config"):
        (root / name).mkdir(parents=True)
    (root / "config/autonomous_loop.yaml").write_text(FAST_CONFIG)
    ws = Workspace(root)
    ws.task(FILL_TASK)
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "full")
    both = r.stdout + r.stderr
    assert r.returncode == 1, both
    assert "disk full" in r.stderr and "internal error" not in both and "Traceback" not in both
    st = ws.state("full")
    assert st["status"] == "stopped" and st["stop_reason"] == "disk_full"  # not left `running`
    assert st["total_failures"] == 0 and st["consecutive_failures"] == 0  # the step is not blamed
    assert [c["step_id"] for c in st["completed_steps"]] == ["1", "2"]
    assert "- [x] 2." in (root / "Specs/feature/tasks.md").read_text()
    assert not list((root / ".state").glob(".*.tmp"))

    for p in root.glob("fill*"):  # space again
        p.unlink()
    r = ws.kiro("loop", "resume", "--task-id", "full")  # no --reset-failures needed
    assert r.returncode == 0, r.stdout + r.stderr
    assert (root / "side.log").read_text().split() == ["1", "2", "3"]  # step 2 did not run again
    assert ws.state("full")["status"] == "completed"


def test_resume_on_a_still_full_disk_says_so_and_runs_nothing(small_disk: Path) -> None:
    root = small_disk / "vault"
    for name in ("Specs/feature", ".state", "config"):
        (root / name).mkdir(parents=True)
    (root / "config/autonomous_loop.yaml").write_text(FAST_CONFIG)
    ws = Workspace(root)
    ws.task(FILL_TASK)
    assert ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "full").returncode == 1
    _fill(small_disk / "more")  # the room kiro's reserve gave back is taken again
    before = (root / ".state/autonomous_loop_full.json").read_bytes()
    for _ in range(2):
        r = ws.kiro("loop", "resume", "--task-id", "full")
        assert r.returncode == 1 and "disk full" in r.stderr, r.stdout + r.stderr
        assert "internal error" not in r.stdout + r.stderr
        assert (root / ".state/autonomous_loop_full.json").read_bytes() == before  # nothing changed
    assert (root / "side.log").read_text().split() == ["1", "2"]


# -- item 13: bounded logs ---------------------------------------------------------------------------


def test_a_30_mb_reply_is_not_stored_whole_in_the_transcript(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    reply = "A" * 15_000_000 + "Z" * 15_000_000
    Transcript(path, "t").write("response", iteration=1, attempt=1, content=reply)
    size = path.stat().st_size
    assert size < 2 * TRANSCRIPT_FIELD_CHARS, size
    [record] = [json.loads(line) for line in path.read_text().splitlines()]
    assert record["content"].startswith("AAAA") and record["content"].endswith("ZZZZ")
    assert "characters cut by kiro" in record["content"]


def test_event_fields_are_clipped(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "e.jsonl")
    log.append({"event": "step_failed", "error": "x" * 5_000_000, "nested": {"output": ["y" * 100_000]}})
    log.close()
    [event] = list(read_events(tmp_path / "e.jsonl"))
    assert len(event["error"]) < EVENT_FIELD_CHARS + 100
    assert len(event["nested"]["output"][0]) < EVENT_FIELD_CHARS + 100


# -- item 13: temp files of killed writes ------------------------------------------------------------


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_temp_files_left_by_killed_writes_are_removed_at_resume(ws: Workspace) -> None:
    ws.task(shell_task(2))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "t", "--max-iterations", "1")
    assert r.returncode == 4, r.stdout + r.stderr
    dead = _dead_pid()
    stale_state = ws.root / f".state/.autonomous_loop_t.json.{dead}.tmp"
    stale_backup = ws.root / f".state/backups/.autonomous_loop_t.x.json.{dead}.tmp"
    stale_task = ws.root / "Specs/feature/.tasks.md.k2j4h1.kiro-tmp"
    live_writer = ws.root / f".state/.autonomous_loop_other.json.{os.getpid()}.tmp"  # its writer is alive
    for p in (stale_state, stale_backup, stale_task, live_writer):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("half a write")
    os.utime(stale_task, (1_000_000_000, 1_000_000_000))
    r = ws.kiro("loop", "resume", "--task-id", "t", "--max-iterations", "5")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not stale_state.exists() and not stale_backup.exists() and not stale_task.exists()
    assert live_writer.exists()


# -- item 13: a closed pipe, output that is not a terminal ------------------------------------------


def test_logs_json_into_head_exits_quietly(ws: Workspace) -> None:
    ws.task(shell_task(3))
    assert ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "p").returncode == 0
    log = ws.root / "Logs/p.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    with open(log, "a") as fh:  # far more than a pipe holds, so that kiro writes into a closed pipe
        for _ in range(400):
            fh.writelines(lines)
    r = subprocess.run(f"'{sys.executable}' -m kiro loop logs --json --task-id p | head -1", shell=True,
                       cwd=ws.root, env=ws.env(), capture_output=True, text=True, timeout=60)
    assert r.stderr == "", r.stderr
    assert len(r.stdout.splitlines()) == 1 and json.loads(r.stdout)["task_id"] == "p"


def test_status_watch_prints_when_not_on_a_terminal(ws: Workspace) -> None:
    ws.task(shell_task(2))
    assert ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "w",
                   "--max-iterations", "1").returncode == 4
    proc = ws.spawn("loop", "status", "--watch", "--interval", "0.2")  # stdout is a file
    try:
        out = ws.wait_for(lambda: ws.output(proc) if "max_iterations" in ws.output(proc) else None,
                          what="the status table in the output file")
        assert "w" in out.split() and "TASK ID" in out
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 0, ws.output(proc)  # Ctrl-C ends the watch
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- item 13: a very deep tree --------------------------------------------------------------------


def test_list_files_and_search_files_survive_a_1500_deep_tree(tmp_path: Path) -> None:
    h = make_harness(tmp_path / "ws")
    (h.root / "deep").mkdir()
    deep_tree(h.root / "deep", 1500)

    async def go(tool: str, args: dict[str, str]) -> str:
        return (await invoke(h.tool_env(), tool, args)).text

    listed = asyncio.run(go("list_files", {"path": "deep", "pattern": "*"}))
    assert "Recursion" not in listed and listed.startswith("deep/d/"), listed[:300]
    found = asyncio.run(go("search_files", {"pattern": "needle", "path": "deep"}))
    assert "Recursion" not in found, found[:300]
    subprocess.run(["rm", "-rf", str(h.root / "deep")], check=True)


def test_a_batch_start_on_a_full_disk_says_so_and_leaves_nothing_behind(small_disk: Path) -> None:
    """`kiro loop start --task a --task b --task c` with room for little more than one loop's files:
    one line that says the disk is full, exit 1; no loop, no temp file, every task file as it was."""
    root = small_disk / "vault"
    for name in ("Specs", ".state", "config"):
        (root / name).mkdir(parents=True)
    (root / "config/autonomous_loop.yaml").write_text(FAST_CONFIG)
    ws = Workspace(root)
    texts = {}
    for name in ("a", "b", "c"):
        texts[name] = FILL_TASK.replace("title: full", f"title: {name}")
        ws.task(texts[name], rel=f"Specs/{name}/tasks.md")
    _fill(small_disk / "more")
    big = small_disk / "more-big"
    os.truncate(big, big.stat().st_size - 180 * 1024)  # room for one loop's reserve (128 KiB), not three
    r = ws.kiro("loop", "start", "--task", "Specs/a/tasks.md", "--task", "Specs/b/tasks.md",
                "--task", "Specs/c/tasks.md")
    both = r.stdout + r.stderr
    assert r.returncode == 1, both
    assert "disk full" in r.stderr and "internal error" not in both and "Traceback" not in both, both
    assert list((root / ".state").glob("autonomous_loop_*.json")) == [], both
    assert list(root.rglob("*.kiro.tmp")) == [] and list((root / ".state").glob(".kiro-reserve-*")) == []
    print(r.stderr.strip())
    for name, text in texts.items():
        assert (root / f"Specs/{name}/tasks.md").read_text() == text


def _reserves(state: Path) -> dict[str, int]:
    """The reserve files in `state` (files, not what else may be planted there) and the bytes really
    taken by each."""
    return {p.name: p.stat().st_blocks * 512 for p in state.glob(".kiro-reserve-*")
            if p.is_file() and not p.is_symlink()}


def test_loops_of_one_process_share_one_reserve_file_that_shrinks_as_they_end(tmp_path: Path) -> None:
    """Three loops started together take one reserve file (one new file, not three), holding each
    loop's share; a loop that ends gives its share back, and the last one removes the file."""
    from kiro.core.runner import LoopIndex, StartBatch, prepare_start
    from kiro.store.statestore import StateStore
    from kiro.store.workspace import Workspace as KiroWorkspace

    root = tmp_path / "vault"
    for name in ("Specs", ".state", "config"):
        (root / name).mkdir(parents=True)
    (root / "config/autonomous_loop.yaml").write_text(FAST_CONFIG)
    for name in ("a", "b", "c"):
        (root / f"Specs/{name}").mkdir()
        (root / f"Specs/{name}/tasks.md").write_text(shell_task(1))
    ws = KiroWorkspace(root)
    with StartBatch() as batch:
        runs = [prepare_start(ws, f"Specs/{n}/tasks.md", task_id=n, index=LoopIndex(StateStore(ws)), batch=batch)
                for n in ("a", "b", "c")]
    held = _reserves(root / ".state")
    assert list(held) == [f".kiro-reserve-{os.getpid()}"], held
    [three] = held.values()
    assert three >= 3 * 128 * 1024, held
    runs[0].release()
    [two] = _reserves(root / ".state").values()
    assert 2 * 128 * 1024 <= two < three
    runs[1].release()
    runs[2].release()
    assert _reserves(root / ".state") == {}


HOLD_A_RESERVE = """
import os, sys, time
from pathlib import Path
from kiro.fs import diskfull
diskfull.reserve(Path(sys.argv[1]), "x", 0)
print("held", flush=True)
if sys.argv[2] == "die":
    os.kill(os.getpid(), 9)
time.sleep(60)
"""


def test_a_killed_process_reserve_is_removed_by_the_next_one_and_a_live_one_is_kept(tmp_path: Path) -> None:
    from kiro.fs import diskfull

    state = tmp_path / ".state"
    state.mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    killed = subprocess.run([sys.executable, "-c", HOLD_A_RESERVE, str(state), "die"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert killed.returncode == -signal.SIGKILL and killed.stdout == "held\n", killed.stderr
    [old] = _reserves(state)
    (state / ".kiro-reserve-t1").write_bytes(b"\0" * 4096)  # one per loop, as kiro before 2026-11-27 left them
    with subprocess.Popen([sys.executable, "-c", HOLD_A_RESERVE, str(state), "live"], env=env,
                          stdout=subprocess.PIPE, text=True) as live:
        try:
            assert live.stdout is not None and live.stdout.readline() == "held\n"
            diskfull.reserve(state, "mine", 0)
            try:
                assert sorted(_reserves(state)) == sorted([f".kiro-reserve-{live.pid}", f".kiro-reserve-{os.getpid()}"])
            finally:
                diskfull.drop(state, "mine")
            assert list(_reserves(state)) == [f".kiro-reserve-{live.pid}"]
        finally:
            live.kill()
    assert old not in _reserves(state)


def test_a_folder_or_symlink_in_place_of_the_reserve_file_is_stepped_around(tmp_path: Path) -> None:
    """Something planted where this process's reserve file goes (a folder, a symlink to a file of the
    person's) is neither followed nor an error: the reserve takes the next name."""
    from kiro.fs import diskfull

    state = tmp_path / ".state"
    state.mkdir()
    (state / f".kiro-reserve-{os.getpid()}").mkdir()
    target = tmp_path / "precious.txt"
    target.write_text("mine\n")
    (state / f".kiro-reserve-{os.getpid()}-1").symlink_to(target)
    diskfull.reserve(state, "a", 0)
    try:
        assert list(_reserves(state)) == [f".kiro-reserve-{os.getpid()}-2"]
    finally:
        diskfull.drop(state, "a")
    assert target.read_text() == "mine\n" and _reserves(state) == {}
    assert (state / f".kiro-reserve-{os.getpid()}").is_dir() and (state / f".kiro-reserve-{os.getpid()}-1").is_symlink()


def test_a_forked_child_leaves_its_parents_reserve_alone(tmp_path: Path) -> None:
    """A fork server's child runs its own loops: dropping a share or freeing every reserve there must
    not shrink or remove the file its parent holds."""
    from kiro.fs import diskfull

    state = tmp_path / ".state"
    state.mkdir()
    diskfull.reserve(state, "parent", 0)
    try:
        before = _reserves(state)
        pid = os.fork()
        if pid == 0:  # the child: what a loop of its own does when it ends, and on a full disk
            code = 0
            try:
                diskfull.drop(state, "parent")
                code = 3 if diskfull.release_all() else 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert _reserves(state) == before
    finally:
        diskfull.drop(state, "parent")
    assert _reserves(state) == {}


def test_a_reserve_that_does_not_fit_leaves_the_others_as_they_were(small_disk: Path) -> None:
    from kiro.fs import diskfull

    state = small_disk / ".state"
    state.mkdir()
    diskfull.reserve(state, "a", 0)
    try:
        [one] = _reserves(state).values()
        _fill(small_disk / "more")
        with pytest.raises(diskfull.DiskFull, match="disk full: could not write a 128 KiB reserve"):
            diskfull.reserve(state, "b", 0)
        assert list(_reserves(state).values()) == [one]
    finally:
        diskfull.drop(state, "a")
    assert _reserves(state) == {}
    with pytest.raises(diskfull.DiskFull):
        diskfull.reserve(state, "c", 1024 * 1024)  # no room: and no file is left behind
    assert _reserves(state) == {}


def test_a_finished_task_moves_to_a_done_folder_on_another_file_system(small_disk: Path, tmp_path: Path) -> None:
    """Done/ mounted from elsewhere: the move cannot be a rename (EXDEV); the task is copied there
    and removed from Specs/, as a rename would have left it."""
    root = tmp_path / "vault"
    for name in ("Specs/feature", ".state", "config"):
        (root / name).mkdir(parents=True)
    (root / "config/autonomous_loop.yaml").write_text(FAST_CONFIG)
    ws = Workspace(root)
    ws.task(shell_task(2))
    done = root / "Done"
    done.mkdir()
    r = subprocess.run(["mount", "--bind", str(small_disk), str(done)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot bind-mount a folder: {r.stderr.strip()}")
    try:
        r2 = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "x")
        assert r2.returncode == 0, r2.stdout + r2.stderr
        assert not (root / "Specs/feature/tasks.md").exists()
        assert (small_disk / "feature/tasks.md").read_text().count("- [x]") == 2
    finally:
        subprocess.run(["umount", "-l", str(done)], check=False)


# -- standard output on a full disk ------------------------------------------------------------------------

FULL_OUTPUT = [
    ("loop", "status"), ("loop", "status", "--json"), ("loop", "state", "--task-id", "t1"),
    ("loop", "logs", "--task-id", "t1"), ("loop", "logs", "--task-id", "t1", "--tail", "2"),
    ("loop", "progress", "--task-id", "t1"), ("loop", "stats"), ("loop", "history", "--task-id", "t1"),
    ("agents",), ("--version",), ("--help",), ("loop", "start", "--help"),
]


@pytest.fixture(scope="module")
def one_loop(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """One finished loop, made once for the module: the commands run on it only read it."""
    ws = new_workspace(tmp_path_factory.mktemp("one_loop") / "vault")
    ws.task(shell_task(2))
    assert ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "t1").returncode == 0
    return ws


def _to(ws: Workspace, out: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    with open(out, "w") as fh:
        return cli_forkserver.run(args, cwd=ws.root, env=ws.env(**{**AGENTS_CACHE, **env}), stdout=fh.fileno(),
                                  timeout=60)  # `kiro agents` among them: the CLIs asked once per run


@pytest.mark.parametrize("args", FULL_OUTPUT, ids=" ".join)
def test_output_to_dev_full_is_one_line_and_exit_1(one_loop: Workspace, args: tuple[str, ...]) -> None:
    """`kiro ... > /dev/full`: before, a traceback or "internal error"."""
    r = _to(one_loop, Path("/dev/full"), *args)
    assert (r.returncode, r.stderr) == (1, "kiro: cannot write to standard output: No space left on device\n")


def test_output_to_a_file_on_a_full_disk_is_one_line_and_exit_1(one_loop: Workspace, small_disk: Path) -> None:
    filler = small_disk / "filler"
    with contextlib.suppress(OSError), open(filler, "wb") as fh:
        while True:
            fh.write(b"x" * 65536)
            fh.flush()
    for args in (("loop", "status"), ("loop", "logs", "--task-id", "t1"), ("loop", "stats")):
        r = _to(one_loop, small_disk / "out.txt", *args)
        assert (r.returncode, r.stderr) == (1, "kiro: cannot write to standard output: No space left on device\n"), args
    filler.unlink()  # room again: the same command writes its output
    r = _to(one_loop, small_disk / "out.txt", "loop", "status")
    assert r.returncode == 0 and "t1" in (small_disk / "out.txt").read_text()


# -- a current folder that was deleted; kiro init into a place it cannot create ---------------------------


@pytest.mark.parametrize("args", [("loop", "status"), ("loop", "start", "--task", "Specs/feature/tasks.md"),
                                  ("loop", "stop", "--task-id", "t1"), ("loop", "resume", "--task-id", "t1"),
                                  ("init",)], ids=" ".join)
def test_a_deleted_current_folder_is_one_line(tmp_path: Path, ws: Workspace, args: tuple[str, ...]) -> None:
    """A shell still in a folder someone deleted: before, "internal error: FileNotFoundError"."""
    gone = tmp_path / "gone"
    gone.mkdir()
    code = f"import os, sys; os.chdir({str(gone)!r}); os.rmdir({str(gone)!r}); sys.argv = ['kiro', *{list(args)!r}]; " \
           "from kiro.cli import main; main()"
    r = subprocess.run([sys.executable, "-c", code], env=ws.env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("kiro: the current folder no longer exists (deleted?)") and r.stderr.count("\n") == 1


def test_a_deleted_current_folder_with_a_named_workspace_still_runs(tmp_path: Path, ws: Workspace) -> None:
    ws.task(shell_task(1))
    gone = tmp_path / "gone"
    gone.mkdir()
    code = f"import os, sys; os.chdir({str(gone)!r}); os.rmdir({str(gone)!r}); " \
           f"sys.argv = ['kiro', 'loop', 'start', '-w', {str(ws.root)!r}, '--task', 'Specs/feature/tasks.md', " \
           "'--task-id', 't1']; from kiro.cli import main; main()"
    r = subprocess.run([sys.executable, "-c", code], env=ws.env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert ws.state("t1")["status"] == "completed"


@pytest.mark.parametrize(("where", "says"), [("a_file/ws", "Not a directory"), ("a_file", "File exists"),
                                             ("no_write/ws", "Permission denied")])
def test_init_where_it_cannot_create_is_one_line(tmp_path: Path, ws: Workspace, where: str, says: str) -> None:
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "no_write").mkdir(mode=0o500)
    target = tmp_path / where
    env = ws.env()
    argv = [sys.executable, "-m", "kiro", "init", str(target)]
    if where.startswith("no_write") and os.geteuid() == 0:  # root writes anywhere: drop to nobody for this one
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
    r = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stderr) == (1, f"kiro: cannot create the workspace {str(target)!r}: {says}\n")


def test_a_task_path_that_is_not_utf8_is_one_line_and_leaves_no_state(ws: Workspace) -> None:
    """A folder named with bytes that are not UTF-8: before, "internal error: PydanticSerializationError"
    when the state was written (the path goes into the state, events and reports as JSON text)."""
    folder = os.fsdecode(os.fsencode(str(ws.root / "Specs")) + b"/bad\xff")
    os.makedirs(folder)
    Path(folder, "tasks.md").write_text(shell_task(1))
    r = subprocess.run([sys.executable, "-m", "kiro", "loop", "start", "--task", os.path.join(folder, "tasks.md")],
                       cwd=ws.root, env=ws.env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.endswith("/Specs/bad\\xff/tasks.md': its path is not valid UTF-8; rename the file or its "
                             "folder\n") and r.stderr.count("\n") == 1, r.stderr
    assert not list((ws.root / ".state").glob("*.json"))


def test_a_line_nested_100000_deep_in_an_event_log_is_skipped_by_every_reader(ws: Workspace) -> None:
    """An agent CLI or a shell step can write Logs/: a JSON line 100,000 brackets deep makes Python's
    parser raise RecursionError (not ValueError). Every reader skips it and shows the rest."""
    ws.task(shell_task(2))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "t")
    assert r.returncode == 0, r.stdout + r.stderr
    log = ws.root / "Logs" / "t.jsonl"
    with open(log, "a", encoding="utf-8") as fh:
        fh.write("[" * 100_000 + "]" * 100_000 + "\n")
        fh.write('{"event": "' + "{" * 50_000 + '"}\n')  # deep-looking text inside a string: a fine record
    tried = {
        "logs": ("loop", "logs", "--task-id", "t"),
        "logs --json": ("loop", "logs", "--task-id", "t", "--json"),
        "logs --tail": ("loop", "logs", "--task-id", "t", "--tail", "3"),
        "stats": ("loop", "stats"),
        "history": ("loop", "history"),
    }
    held = []
    for name, args in tried.items():
        r = ws.run(*args)
        if r.returncode == 0 and "internal error" not in r.stdout + r.stderr and "Traceback" not in r.stderr:
            held.append(name)
        else:
            print(f"  {name}: exit {r.returncode}: {(r.stdout + r.stderr)[-300:]}")
    print(f"a hostile line in an event log: {len(held)} of {len(tried)} readers held ({', '.join(held)})")
    assert len(held) == len(tried)
    assert '"loop_finished"' in ws.run("loop", "logs", "--task-id", "t", "--json").stdout  # the rest is shown
