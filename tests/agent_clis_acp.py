"""The REAL ACP agents (kiro.executors.acp) against the scripted API servers of tests/fakes: the same
models as the agent CLIs' (tests/agent_clis.py, tests/agent_clis_aider_gemini_opencode.py), reached through the ACP
adapter instead of the CLI's headless mode.

- claude-acp: `claude-agent-acp` (npm @agentclientprotocol/claude-agent-acp) on the Anthropic fake;
  its Claude Agent SDK runs its own `claude` binary, which reads ANTHROPIC_BASE_URL as claude does.
- gemini-acp: `gemini --acp` on the Gemini fake, with the settings the gemini tests use.

A brain can be held (`hold`): the scripted model then waits, before answering its `hold_at`-th agent
call, until the test releases it, so a test sees what kiro shows while a step is still running.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kiro.fs.locks import Flock, Timeout
from tests.agent_clis import CODEX_PRICE, Claude, Cli, run_folder, run_once
from tests.agent_clis_aider_gemini_opencode import GEMINI_PRICE, Gemini
from tests.conftest import FAST_CONFIG, Workspace
from tests.fakes import HttpError, Recorded

HOLD_SECONDS = 120.0  # the longest a held model call waits for the test
TASK = "Specs/feature/tasks.md"
PRICES = {"gemini-acp": GEMINI_PRICE, "codex-acp": CODEX_PRICE}  # the agents that report tokens, not money


def configure(ws: Workspace, cli: Cli, extra: str = "", loop: str = "") -> None:
    """The loop's config for an ACP agent: fast timings, the agent, its price when it reports none."""
    price = PRICES.get(cli.name, "")
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + loop + f"agent: {cli.name}\n" + price + extra)


def run(ws: Workspace, cli: Cli, *args: str, timeout: float = 240) -> tuple[int, str]:
    """`kiro loop start` on TASK with the agent's environment: its exit code and what it printed."""
    r = ws.kiro("loop", "start", "--task", TASK, *args, env=ws.env(**cli.env()), timeout=timeout)
    return r.returncode, r.stdout + r.stderr


RETRY_IDLE = 60  # the idle timeout of a dead-endpoint run's second attempt (its first ended before the endpoint)


@dataclass
class DeadRun:
    """One agent's `kiro loop start` on an endpoint that accepts its request and never answers (`dead_run`)."""

    name: str
    code: int  # the loop's exit code...
    out: str  # ...and what it printed
    error: str  # the step's last_error
    seconds: int  # the idle timeout of the attempt that reached the endpoint
    requests: int  # the requests the endpoint got
    silent: list[dict[str, Any]]  # the agent_silent events: the silence said while it lasted

    def assert_ended_by_the_idle_timeout(self) -> None:
        """The attempt ended by the idle timeout, and the error says so: the behaviour every dead-endpoint
        test asserts."""
        assert self.code == 5, self.out
        assert f"printed nothing for {self.seconds} s" in self.error, self.error
        assert "step_idle_timeout_seconds" in self.error, self.error
        assert self.requests >= 1, self.out  # it did reach the endpoint


def dead_run(name: str, key: str, makers: dict[str, Callable[[Path], Any]],
             configure: Callable[..., None], idle: dict[str, int], base: Path) -> DeadRun:
    """Agent `name`'s run on a dead endpoint: the idle timeout (`idle[name]` s) ends the attempt. The silence
    counts from the agent's spawn (SPEC: "printed nothing for that long"), so the idle timeout is longer than
    the agent's silent start-up and each run waits at least that long; a loaded machine may take longer than
    `idle[name]` s to start the agent and have it reach the endpoint: then the attempt ended before the
    test's point, and it is tried once more, afresh, with RETRY_IDLE s.

    Each agent's run is made once in the test run (under `key`), and the runs of `makers` are made together:
    they mostly wait, so their waits overlap, the longest first. Each starts once the one before has reached
    its endpoint (or ended), so one agent starts up at a time, as when they ran one by one. A run another
    worker has begun is left to it (its test waits for it, as long as it would have taken to make it).
    `configure(ws, cli, extra, loop=...)` writes a workspace's config. Skipped, saying why, when the agent is
    not installed."""
    folder = run_folder()
    made = folder / f"{key}-{name}.json"
    own = Flock(folder / f"{key}-{name}.lock")
    try:
        own.acquire()
    except Timeout:  # another worker makes it
        own.acquire(timeout=None)
    try:
        if not made.exists():
            threads = []
            for each in sorted(makers, key=lambda n: (-idle[n], n != name, n)):
                lock = own if each == name else Flock(folder / f"{key}-{each}.lock")
                if lock is not own:
                    try:
                        lock.acquire()
                    except Timeout:  # another worker makes it
                        continue
                if (folder / f"{key}-{each}.json").exists():
                    if lock is not own:
                        lock.release()
                    continue
                reached = threading.Event()
                thread = threading.Thread(target=_dead, name=f"dead-{each}",
                                          args=(each, makers[each], configure, idle[each], base / each, reached,
                                                folder / f"{key}-{each}.json", None if lock is own else lock))
                thread.start()
                threads.append(thread)
                reached.wait()
            for thread in threads:
                thread.join()
        answer = json.loads(made.read_text())
    finally:
        own.release()
    if "skip" in answer:
        pytest.skip(answer["skip"])
    assert "failed" not in answer, answer["failed"]
    return DeadRun(**answer)


def dead_early(key: str, makers: dict[str, Callable[[Path], Any]], configure: Callable[..., None],
               idle: dict[str, int]) -> Callable[[], None]:
    """A `made_early` maker (tests/agent_clis.py) of `dead_run`'s runs under `key`, in a folder of its own
    (removed after: what the tests read of a run is its answer), unless another process makes or made them."""

    def begin() -> None:
        first = min(makers, key=lambda n: (-idle[n], n))  # the one `dead_run` makes first
        with Flock(run_folder() / f"{key}-{first}.lock") as lock:
            try:
                lock.acquire()
            except Timeout:
                return
        if (run_folder() / f"{key}-{first}.json").exists():
            return
        base = Path(tempfile.mkdtemp(prefix=f"kiro-{key}-"))
        try:
            dead_run(first, key, makers, configure, idle, base)
        finally:
            shutil.rmtree(base, ignore_errors=True)

    return begin


def _dead(name: str, make: Callable[[Path], Any], configure: Callable[..., None], idle: int, base: Path,
          reached: threading.Event, made: Path, lock: Flock | None) -> None:
    """One `dead_run`: its answer into `made` (then `lock` is released); `reached` set once its agent reached
    the endpoint (or its run ended)."""
    from tests.agent_clis import task_text
    from tests.conftest import new_cli_home, new_workspace

    home = new_cli_home()
    cli = None
    answer: dict[str, Any] = {}
    try:
        cli = make(home)
        if not cli.installed:
            answer = {"skip": cli.skip_reason()}
            return
        cli.start()
        ws = new_workspace(base / "vault")
        ws.task(task_text(1))
        cli.server.hang = True  # accepts the connection, never answers
        for attempt, seconds in enumerate((idle, RETRY_IDLE)):
            configure(ws, cli, f"step_idle_timeout_seconds: {seconds}\nstep_timeout_seconds: 3000\n",
                      loop="  failure_threshold: 1\n")
            tid = f"dead{attempt}"
            proc = ws.spawn("loop", "start", "--task", TASK, "--task-id", tid, *(("--fresh",) if attempt else ()),
                            env=ws.env(**cli.env(), KIRO_RAISE_ERRORS="1"))
            try:
                while proc.poll() is None and not cli.server.requests:
                    time.sleep(0.1)
                if cli.server.requests:
                    reached.set()
                code = proc.wait(timeout=seconds + 240)
            finally:
                if proc.poll() is None:
                    proc.kill()
            if cli.server.requests:
                break
            print(f"{name} did not reach its endpoint within {seconds} s of its start (a slow start): again")
        answer = {"name": name, "code": code, "out": ws.output(proc),
                         "error": ws.state(tid)["steps"]["1"]["last_error"], "seconds": seconds,
                         "requests": len(cli.server.requests),
                         "silent": [e for e in ws.events(tid) if e["event"] == "agent_silent"]}
    except BaseException:
        answer = {"failed": traceback.format_exc()}  # the test raises it
    finally:
        reached.set()
        if cli is not None:
            cli.close()
        shutil.rmtree(home, ignore_errors=True)
        made.with_suffix(".part").write_text(json.dumps(answer))
        made.with_suffix(".part").rename(made)
        if lock is not None:
            lock.release()


def kinds(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == name]


def descendants(pid: int) -> list[list[str]]:
    """The command lines of the processes below `pid` (its children, theirs, ...), as /proc shows them."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        ppid = int(text[text.rindex(")") + 2:].split()[1])  # after "(comm) state"
        parents.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], list(parents.get(pid, []))
    while todo:
        child = todo.pop()
        todo += parents.get(child, [])
        try:
            argv = (Path("/proc") / str(child) / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        found.append([a.decode("utf-8", "replace") for a in argv if a])
    return found


@dataclass
class SharedRun:
    """What the tests that read one `shared_run` are given."""

    name: str  # the agent's
    root: Path  # the workspace
    code: int  # `kiro loop start`'s exit code...
    out: str  # ...and what it printed
    calls: int  # the model calls made
    input_tokens: int  # the input tokens each reported
    seen: dict[str, Any]  # what the run's `body` saw besides (followed_run: while the model call was held)

    @property
    def ws(self) -> Workspace:
        return Workspace(self.root)


def shared_run(key: str, make: Callable[[Path], Any], base: Path, steps: int, config: str = "",
               extra: Callable[[Any, Workspace], list[Any]] | None = None,
               body: Callable[[Workspace, Any], dict[str, Any]] | None = None) -> SharedRun:
    """One real run that several tests read (`run_once`: one in the test run under `key`, whichever workers
    they land on): the CLI `make(home)` on its scripted server, a workspace under `base` with a task of
    `steps` steps, `configure`d with `config`, the CLI's tool calls before it checks the box `extra(cli, ws)`,
    then `body(ws, cli)` (by default `kiro loop start` on the task; a body answers its exit code `code`, its
    output `out` and what else it saw). Skipped, saying why, when the CLI is not installed."""

    def made() -> dict[str, Any]:
        from tests.agent_clis import task_text
        from tests.conftest import new_cli_home, new_workspace

        home = new_cli_home()
        try:
            cli = make(home)
            if not cli.installed:
                pytest.skip(cli.skip_reason())
            cli.start()
            try:
                ws = new_workspace(base / "vault")
                ws.task(task_text(steps))
                configure(ws, cli, config)
                if extra is not None:
                    cli.extra = extra(cli, ws)
                if body is None:
                    code, out = run(ws, cli)
                    answer: dict[str, Any] = {"code": code, "out": out}
                else:
                    answer = body(ws, cli)
                return {"name": cli.name, "root": str(ws.root), **answer, "calls": cli.calls(),
                        "input_tokens": cli.input_tokens}
            finally:
                cli.close()
        finally:
            shutil.rmtree(home, ignore_errors=True)

    made_run = run_once(key, made)
    code, out = made_run.pop("code"), made_run.pop("out")
    return SharedRun(made_run.pop("name"), Path(made_run.pop("root")), code, out, made_run.pop("calls"),
                     made_run.pop("input_tokens"), made_run)


def followed_run(name: str, make: Callable[[Path], Any], base: Path, steps: int, what: str,
                 extra: Callable[[Any, Workspace], list[Any]] | None = None,
                 while_held: Callable[[Any], Any] | None = None) -> SharedRun:
    """A `shared_run` of `kiro loop start --agent NAME` whose second model call the scripted model holds, and
    meanwhile `kiro loop logs --follow` looking for the agent's tool call on tasks.md (`what`), then released
    to finish. Besides the loop's exit code and output, what was seen while the call was held: the follow's
    line and exit code, the step's status, whether the loop still ran, and `while_held(proc)`'s answer."""

    def body(ws: Workspace, cli: Any) -> dict[str, Any]:
        cli.held = held = Held(at=2)
        return _followed(ws, cli, held, what, while_held)

    return shared_run(f"followed-{name}", make, base, steps, extra=extra, body=body)


def _followed(ws: Workspace, cli: Any, held: Held, what: str,
              while_held: Callable[[Any], Any] | None) -> dict[str, Any]:
    seen: dict[str, Any] = {"reached": False, "line": None, "status": None, "running": None, "while_held": None}
    proc = ws.spawn("loop", "start", "--task", TASK, "--agent", cli.name, env=ws.env(**cli.env()))
    follow = None
    try:
        if held.reached.wait(120):
            seen["reached"] = True
            if while_held is not None:
                seen["while_held"] = while_held(proc)
            tid = ws.only_task_id()
            follow = ws.spawn("loop", "logs", "--task-id", tid, "--follow")
            with contextlib.suppress(AssertionError):  # not seen: `line` stays None, and the test says so
                seen["line"] = ws.wait_for(lambda: next((x for x in ws.output(follow).splitlines()
                                                         if "tasks.md" in x and "(completed)" in x), None),
                                           timeout=60, what=what)
            seen["status"] = ws.state(tid)["current_step"]["status"]
            seen["running"] = proc.poll() is None and not held.released.is_set()
        held.released.set()
        seen["code"] = proc.wait(timeout=240)
        seen["follow_code"] = follow.wait(timeout=60) if follow is not None else None
    finally:
        held.released.set()
        for p in (proc, follow):
            if p is not None and p.poll() is None:
                p.kill()
    return {**seen, "out": ws.output(proc), "follow_out": ws.output(follow) if follow is not None else ""}


def shows_a_tool_call_while_the_step_ran(run: SharedRun) -> None:
    """What `followed_run` saw while the step's model call was held: `kiro loop logs --follow` printed the
    agent's tool call on tasks.md while the step still ran; released, the loop and the follow ended well."""
    seen = run.seen
    assert seen["reached"], run.out  # the held model call came
    assert seen["line"], f"timed out waiting for the tool call in `kiro loop logs --follow`:\n{seen['follow_out']}"
    assert seen["status"] == "in_progress"  # the step is still running...
    assert seen["running"]  # ...its model call held by the test
    assert run.code == 0, run.out
    assert seen["follow_code"] == 0, seen["follow_out"]
    print(f"{run.name}: while the step ran, `logs --follow` showed: {seen['line'].strip()}")


class Held:
    """Hold the `at`-th agent call (1-based) until released; `reached` is set when the call arrives."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.reached = threading.Event()
        self.released = threading.Event()
        self.count = 0

    def wait(self) -> None:
        self.count += 1
        if self.count == self.at:
            self.reached.set()
            self.released.wait(HOLD_SECONDS)


class ClaudeAcp(Claude):
    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.name, self.program = "claude-acp", "claude-agent-acp"
        self.package = "@agentclientprotocol/claude-agent-acp"
        self.held: Held | None = None

    def brain(self, rec: Recorded) -> Any:
        from tests.fakes import anthropic as fa

        if self.held is not None and fa.is_agent_call(rec.body):
            self.held.wait()
        return super().brain(rec)

    def env(self) -> dict[str, str]:
        """claude's, less ANTHROPIC_MODEL: the adapter's default model, as people run it, with which
        claude-agent-acp 0.101 opens its session in mode `auto` (edits never asked; kiro sets `default`)."""
        env = super().env()
        del env["ANTHROPIC_MODEL"]
        return env

    def write_call(self, path: str, content: str) -> tuple[str, dict[str, str]]:
        return ("Write", {"file_path": path, "content": content})

    def read_call(self, path: str) -> tuple[str, dict[str, str]]:
        return ("Read", {"file_path": path})

    def shell_call(self, command: str) -> tuple[str, dict[str, str]]:
        return ("Bash", {"command": command, "description": "run it"})


class GeminiAcp(Gemini):
    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.name, self.package = "gemini-acp", "@google/gemini-cli"
        self.held: Held | None = None

    def brain(self, rec: Recorded) -> Any:
        if self.held is not None and ":streamGenerateContent" in rec.path:
            self.held.wait()
        return super().brain(rec)

    def write_call(self, path: str, content: str) -> tuple[str, dict[str, str]]:
        return ("write_file", {"file_path": path, "content": content})

    def read_call(self, path: str) -> tuple[str, dict[str, str]]:
        return ("read_file", {"file_path": path})

    def shell_call(self, command: str) -> tuple[str, dict[str, str]]:
        return ("run_shell_command", {"command": command, "description": "run it"})


ACP_CLIS: dict[str, Callable[[Path], ClaudeAcp | GeminiAcp]] = {"claude-acp": ClaudeAcp, "gemini-acp": GeminiAcp}

__all__ = ["ACP_CLIS", "ClaudeAcp", "GeminiAcp", "Held", "HttpError"]
