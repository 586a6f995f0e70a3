"""How a step's process is started (issue #12 item 3): directly, with no per-step wrapper and no
`preexec_fn`, and still dead when kiro dies, grandchildren included, thanks to the one reaper per
kiro process; the ledger of live groups is appended to and read back, torn lines and all."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kiro.processes import groups
from kiro.processes.spawn import ProcessResult, Watchdog, _start, run_process


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_until(predicate: object, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def test_a_step_is_a_direct_child_of_kiro_in_its_own_group(tmp_path: Path) -> None:
    """No setpriv, no `sh` guard between kiro and the command: its parent is kiro, and it leads its
    own process group (so the group can be ended as a whole)."""
    result = asyncio.run(run_process(["sh", "-c", "echo $PPID; ps -o pgid= -p $$"], cwd=tmp_path))
    parent, pgid = result.output.split()
    assert int(parent) == os.getpid()
    assert int(pgid) != os.getpgid(0)


STEP_IN_CHILD = """
import asyncio, sys
from pathlib import Path
from kiro.processes.spawn import ProcessResult, Watchdog, run_process
asyncio.run(run_process(["sh", "-c", "sleep 60 & echo $! > gc.pid; setsid sleep 61 & echo $! > sid.pid; "
                                      "echo $$ > step.pid; sleep 60"], cwd=Path(".")))
"""


def test_kill_9_of_the_parent_kills_the_step_and_its_background_grandchild(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": "/usr/bin:/bin"}  # whether or not setpriv is there: not needed any more
    proc = subprocess.Popen([sys.executable, "-c", STEP_IN_CHILD], cwd=tmp_path, env=env)
    try:
        files = [tmp_path / name for name in ("gc.pid", "sid.pid", "step.pid")]
        assert wait_until(lambda: all(f.exists() and f.read_text().strip() for f in files))
        grandchild, escaped, step = (int(f.read_text()) for f in files)
        assert alive(grandchild) and alive(escaped) and alive(step)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert wait_until(lambda: not alive(step)), "the step outlived its kiro"
        assert wait_until(lambda: not alive(grandchild)), "the step's background child outlived kiro"
        assert wait_until(lambda: not alive(escaped)), "a child that left the step's group (setsid) outlived kiro"
    finally:
        proc.kill()
        proc.wait()


FINISHED_GROUP = """
import subprocess, sys
import pytest

from kiro.processes import groups
p = subprocess.Popen(["sleep", "30"], start_new_session=True, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
groups.register(p.pid)
groups.unregister(p.pid)  # kiro is done with that group: the reaper must forget it
print(p.pid, flush=True)
"""


def test_the_reaper_leaves_a_group_kiro_finished_with_alone(tmp_path: Path) -> None:
    """A group unregistered (its step ended; its id may be reused) is not killed when kiro exits."""
    out = subprocess.run([sys.executable, "-c", FINISHED_GROUP], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    pid = int(out.split()[0])
    try:
        time.sleep(0.5)  # the reaper has read end-of-file by now and done what it would do
        assert alive(pid)
    finally:
        os.kill(pid, signal.SIGKILL)


def test_the_ledger_is_appended_and_read_back_torn_lines_and_old_form_included(tmp_path: Path) -> None:
    path = tmp_path / "processes" / "t.json"
    ledger = groups.Ledger(path, token="tok")
    ledger.add(11)
    ledger.add(12)
    ledger.discard(11)
    lines = path.read_text().splitlines()
    assert [json.loads(x) for x in lines] == [{"pgid": 11, "token": "tok"}, {"pgid": 12, "token": "tok"},
                                               {"ended": 11}]
    with open(path, "a") as fh:
        fh.write('{"pgid": 13, "tok')  # kiro killed mid-append
    assert groups.Ledger(path).recorded() == [(12, "tok")]
    ledger.discard(12)
    ledger.close()
    assert not path.exists()  # the run ended with no live group: no file left
    path.write_text(json.dumps({"groups": [{"pgid": 7, "token": "old"}]}))  # written by kiro before #12
    assert groups.Ledger(path).recorded() == [(7, "old")]


def test_a_confined_command_still_runs_behind_setpriv_without_privileges(tmp_path: Path) -> None:
    argv = groups.wrap(["true"], confine=True)
    if groups.setpriv_path() is None:
        assert argv == ["true"]
    else:
        assert argv[0].endswith("setpriv") and "--no-new-privs" in argv and "--pdeathsig" not in argv
    assert groups.wrap(["true"]) == ["true"]
    result = asyncio.run(run_process(["sh", "-c", "grep NoNewPrivs /proc/self/status"], cwd=tmp_path, confine=True))
    if groups.setpriv_path() is not None:
        assert result.output.split() == ["NoNewPrivs:", "1"]


def test_a_step_is_waited_for_on_the_event_loop_not_by_a_thread_of_its_own(tmp_path: Path) -> None:
    """Python 3.11's asyncio starts a thread per child to wait for it; kiro waits through a pidfd on
    the event loop that spawned it (as 3.12 does). Loops in two threads spawning at once each get
    their own step's exit status and output."""
    import threading

    async def one(code: int) -> tuple[int | None, str, list[str]]:
        task = asyncio.ensure_future(run_process(["sh", "-c", f"sleep 0.3; echo out{code}; exit {code}"], cwd=tmp_path))
        await asyncio.sleep(0.15)  # the step is running
        waiters = [t.name for t in threading.enumerate() if "waitpid" in t.name]
        result = await task
        return result.returncode, result.output.strip(), waiters

    results: dict[int, tuple[int | None, str, list[str]]] = {}
    threads = [threading.Thread(target=lambda c=c: results.__setitem__(c, asyncio.run(one(c)))) for c in (3, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results[3][:2] == (3, "out3") and results[5][:2] == (5, "out5")
    if sys.version_info < (3, 12):
        assert results[3][2] == [] and results[5][2] == [], "a thread was started to wait for a step"


def test_a_step_whose_pidfd_cannot_be_opened_is_waited_for_by_a_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No file descriptor left for the pidfd (EMFILE): the step still runs and its exit status
    comes back, through a waiting thread as before."""
    import errno

    def no_fd(pid: int, flags: int = 0) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(os, "pidfd_open", no_fd)
    result = asyncio.run(run_process(["sh", "-c", "echo fell back; exit 4"], cwd=tmp_path))
    assert (result.returncode, result.output.strip()) == (4, "fell back")


def test_a_program_found_once_is_looked_up_again_when_it_is_gone(tmp_path: Path) -> None:
    """Where a program is in PATH is looked up at each spawn (every shell step runs `bash`): removed, or no
    longer executable, the step's error is exec's, as if exec had searched PATH itself."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "kiro-test-tool"
    tool.write_text("#!/bin/sh\necho tool ran\n")
    tool.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def run() -> str:
        return asyncio.run(run_process(["kiro-test-tool"], cwd=tmp_path, env=env)).output.strip()

    assert run() == "tool ran"
    assert run() == "tool ran"
    tool.chmod(0o644)
    with pytest.raises(FileNotFoundError):  # no executable of that name left in PATH: exec's own error
        run()
    tool.chmod(0o755)
    assert run() == "tool ran"
    tool.unlink()
    with pytest.raises(FileNotFoundError):
        run()
    (bin_dir / "kiro-test-tool").mkdir()  # a folder of that name is not a program either
    with pytest.raises(FileNotFoundError):
        run()


def test_a_program_is_looked_up_in_path_at_each_spawn_and_keeps_its_name(tmp_path: Path) -> None:
    """exec is handed the program where PATH has it now (no search of PATH in the child): one put in an
    earlier PATH folder during a run is the one the next step runs, as a terminal would run it, and the
    program still sees the name it was called by (argv[0]), not the path it was found at."""
    late, early = tmp_path / "late", tmp_path / "early"
    for folder, says in ((late, "late"), (early, "early")):
        folder.mkdir()
        (folder / "kiro-test-tool").write_text(f"#!/bin/sh\necho {says}\n")
    (late / "kiro-test-tool").chmod(0o755)  # early/'s is not executable yet
    env = {**os.environ, "PATH": f"{early}:{late}:{os.environ['PATH']}"}

    def run(argv: list[str]) -> str:
        return asyncio.run(run_process(argv, cwd=tmp_path, env=env)).output.strip()

    assert run(["kiro-test-tool"]) == "late"
    (early / "kiro-test-tool").chmod(0o755)
    assert run(["kiro-test-tool"]) == "early"
    probe = "import sys; print(open('/proc/self/cmdline', 'rb').read().split(b'\\0')[0].decode())"
    assert run(["python3", "-c", probe]) == "python3"  # argv[0] as given
    assert run(["bash", "-c", 'echo "$BASH"']) == groups.which("bash", env["PATH"])


def test_which_finds_what_shutil_which_finds(tmp_path: Path) -> None:
    """kiro.processes.groups.which (kiro's runs do not import shutil) against shutil.which: a
    program found, one missing, a folder and a file that is not executable named like it, an empty
    PATH entry (the current folder)."""
    import shutil

    from kiro.processes.groups import which

    (tmp_path / "a").mkdir()
    (tmp_path / "a/tool").mkdir()  # a folder named like the program
    (tmp_path / "b").mkdir()
    (tmp_path / "b/tool").write_text("#!/bin/sh\n")  # not executable
    (tmp_path / "c").mkdir()
    (tmp_path / "c/tool").write_text("#!/bin/sh\n")
    (tmp_path / "c/tool").chmod(0o755)
    search = os.pathsep.join(str(tmp_path / d) for d in ("a", "b", "c"))
    for program, path in [("tool", search), ("tool", str(tmp_path / "a")), ("sh", os.defpath),
                          ("no-such-program-here", os.defpath), ("bash", "/usr/bin:" + search)]:
        assert which(program, path) == shutil.which(program, path=path), (program, path)
    assert which("tool", search) == str(tmp_path / "c/tool")


@pytest.mark.parametrize("why", ["cancelled", "idle", "aborted", "timed_out"])
def test_the_one_watchdog_ends_a_silent_child_and_says_why(tmp_path: Path, why: str) -> None:
    """What ends a step's process early (a stop, its silence, its own fatal line, the step's time) is one
    watchdog (kiro.processes.spawn.Watchdog), the one an ACP agent's turn uses too: the child is ended
    within the grace period, not left to run its 600 s, and the result says which it was."""

    async def run() -> ProcessResult:
        cancel = asyncio.Event()
        if why == "cancelled":
            asyncio.get_running_loop().call_later(0.5, cancel.set)
        return await run_process(["bash", "-c", "echo started; sleep 600"], cwd=tmp_path, cancel=cancel,
                                 idle_timeout=1 if why == "idle" else None, timeout=1 if why == "timed_out" else None,
                                 on_stdout=(lambda data: b"started" in data) if why == "aborted" else None)

    result = asyncio.run(run())
    flags = {"cancelled": result.cancelled, "idle": result.idle_timed_out, "aborted": result.aborted,
             "timed_out": result.timed_out}
    assert [name for name, on in flags.items() if on] == [why], flags
    assert result.returncode is not None and result.returncode != 0 and "started" in result.output
    assert result.duration < 300, result.duration  # ended, not run to its end
    print(f"{why}: ended after {result.duration:.2f} s, exit status {result.returncode}")


def test_while_kiro_holds_the_child_up_its_silence_is_not_an_idle_timeout() -> None:
    """An ACP agent waiting for kiro's answer to its permission request (a guardrail may make kiro wait) is
    silent because of kiro: the idle timeout does not end it meanwhile, and counts again from the answer."""

    async def run() -> tuple[str | None, str | None]:
        dog = Watchdog(idle_timeout=0.2)
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        held_done = asyncio.Event()

        async def held() -> None:
            with dog.hold():
                await asyncio.sleep(1.0)  # five idle timeouts, all kiro's
            held_done.set()

        holder = asyncio.ensure_future(held())
        during = await dog.watch(turn, holder)  # the holder's end comes first: None
        assert held_done.is_set()
        after = await dog.watch(turn)
        return during, after

    during, after = asyncio.run(run())
    assert during is None  # the hold ended before any idle timeout fired
    assert after == "idle"  # then the silence counts again and ends it


def test_a_prompt_on_stdin_reaches_the_child_whole_or_as_far_as_it_reads(tmp_path: Path) -> None:
    """An agent CLI given its prompt on stdin (`stdin_data`) reads all of it, even past what a pipe holds at
    once; a child that exits without reading it is not an error; stderr apart comes back apart."""
    prompt = b"".join(b"line %d of the prompt\n" % i for i in range(50_000))  # ~1.1 MB: many pipe bufferfuls
    read = asyncio.run(run_process(["sh", "-c", "wc -c; echo said >&2"], cwd=tmp_path, stdin_data=prompt,
                                   separate_stderr=True))
    assert (read.returncode, read.output.strip(), read.stderr.strip()) == (0, str(len(prompt)), "said")
    unread = asyncio.run(run_process(["sh", "-c", "echo left; exit 3"], cwd=tmp_path, stdin_data=prompt))
    assert (unread.returncode, unread.output.strip()) == (3, "left")


def test_a_step_reads_dev_null_opened_once_not_at_each_spawn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step given no input reads /dev/null (end of file at once), as with `subprocess.DEVNULL`; kiro keeps it open
    for every spawn instead of `Popen` opening and closing it each time, and makes no buffered file object over
    the pipes it reads by descriptor (issue #41: a system call or three less a step)."""

    def opened(self: subprocess.Popen[bytes]) -> int:
        raise AssertionError("/dev/null opened for a spawn")

    monkeypatch.setattr(subprocess.Popen, "_get_devnull", opened)
    for _ in range(2):
        result = asyncio.run(run_process(["bash", "-c", "readlink /proc/self/fd/0; cat; echo read $?"], cwd=tmp_path))
        assert (result.returncode, result.output.split()) == (0, ["/dev/null", "read", "0"])

    async def unbuffered() -> object:
        child = await _start(["true"], cwd=tmp_path, env=None, confine=False, box=None,
                             stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            await child.proc.wait()
            return type(child.proc.popen.stdout)
        finally:
            assert child.proc.popen.stdout is not None
            child.proc.popen.stdout.close()
            child.release()

    assert asyncio.run(unbuffered()) is io.FileIO


def test_a_forked_child_starts_a_reaper_of_its_own_and_a_step_asks_no_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reaper is this process's: a child forked from kiro (a fork server's job) starts its own at its first
    spawn, with a mark of its own, as the fork tells it (`os.register_at_fork`); telling the reaper of a group
    asks the kernel for no pid (three `getpid` calls a step before)."""
    mark = groups.start_reaper()
    assert mark is not None
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own reaper, its own mark
        try:
            theirs = groups.start_reaper()
            os.write(write_end, (theirs[1] if theirs is not None else "none").encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        child_mark = f.read().decode()
    os.waitpid(pid, 0)
    assert child_mark not in ("", "none", mark[1]) and child_mark.startswith(f"{pid}.")

    def asked() -> int:
        raise AssertionError("getpid asked")

    monkeypatch.setattr(os, "getpid", asked)
    assert groups.start_reaper() == mark
    groups.register(999_999_999)
    groups.unregister(999_999_999)
