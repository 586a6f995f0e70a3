"""Generated bad input: every file and folder kiro reads, times every way it can be wrong, times the
commands that read it. Each case runs the real CLI on its own copy of a workspace that holds an
unfinished loop, and must hold three properties:

    no internal error (no "internal error", no traceback) - it is a KiroError one-liner or it works
    no hang (done within 60 s: a loaded CI machine took over 10 s for a start beside a 1,500-deep tree)
    no file changed when the exit code is 1 (and the one error line names what is wrong)

The cases the issue reported (#7 item 11) must moreover end with exit 1. The suite prints a table
of what it tried and how many cases held, per target and per corruption.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import stat
import subprocess
import sys
import textwrap
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import cli_forkserver, cli_inprocess
from tests.conftest import FAST_CONFIG, shell_task

HANG_SECONDS = 60.0  # a hang never ends: generous, it costs nothing when kiro answers
STATE = ".state/autonomous_loop_other.json"
CONFIG = "config/autonomous_loop.yaml"
HOOK = ".hooks/stop_autonomous_loop_other.md"
GLOBAL_HOOK = ".hooks/stop_autonomous_loop.md"
EVENTS = "Logs/other.jsonl"
FEATURE = "Specs/feature/tasks.md"
OTHER_TASK = "Specs/other/tasks.md"

START = ("start", ["loop", "start", "--task", FEATURE, "--task-id", "feat"])
RESUME = ("resume", ["loop", "resume", "--task-id", "other", "--max-iterations", "5"])
STATUS = ("status", ["loop", "status"])
STATUS_JSON = ("status-json", ["loop", "status", "--json", "--task-id", "other"])
STATE_CMD = ("state", ["loop", "state", "--task-id", "other"])
LOGS = ("logs", ["loop", "logs", "--task-id", "other"])
LOGS_JSON = ("logs-json", ["loop", "logs", "--json", "--task-id", "other"])
STOP = ("stop", ["loop", "stop", "--task-id", "other"])
START_DETACH = ("start-detach", ["loop", "start", "--task", FEATURE, "--task-id", "feat", "--detach"])


# -- corruptions -------------------------------------------------------------------------------------


def _remove(p: Path) -> None:
    if p.is_symlink() or p.is_file() or stat.S_ISFIFO(os.lstat(p).st_mode if os.path.lexists(p) else 0):
        p.unlink()
    elif p.is_dir():
        shutil.rmtree(p)


def _replace(fn: Callable[[Path], None]) -> Callable[[Path], None]:
    def apply(p: Path) -> None:
        if os.path.lexists(p):
            _remove(p)
        p.parent.mkdir(parents=True, exist_ok=True)
        fn(p)
    return apply


def _bytes(data: bytes) -> Callable[[Path], None]:
    return _replace(lambda p: p.write_bytes(data))


def _text(data: str) -> Callable[[Path], None]:
    return _bytes(data.encode("utf-8"))


def _folder(p: Path) -> None:
    p.mkdir()
    (p / "inside.md").write_text("x\n")


def _sparse(size: int) -> Callable[[Path], None]:
    def make(p: Path) -> None:
        with open(p, "wb") as fh:
            fh.truncate(size)
    return _replace(make)


def _edit(fn: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def apply(p: Path) -> None:
        data = p.read_bytes() if p.is_file() else b""
        _remove(p) if os.path.lexists(p) else None
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(fn(data))
    return apply


def _state_edit(fn: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def apply(p: Path) -> None:
        data = json.loads(p.read_text())
        fn(data)
        p.write_text(json.dumps(data, allow_nan=True))
    return apply


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return apply


YAML_BOMB = textwrap.dedent("""\
    a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
    b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
    c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
    d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
    e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
    f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
    g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
    h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
    i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
    """)
DEEP_YAML = "a: " + "[" * 5000 + "]" * 5000 + "\n"
DEEP_BLOCK_YAML = "".join("  " * i + f"k{i}:\n" for i in range(300)) + "  " * 300 + "v: 1\n"
RECURSIVE_YAML = "autonomous_loop: &a\n  max_iterations: 3\n  again: *a\n"

# Ways any file can be wrong, whatever it holds.
FILE_KINDS: dict[str, Callable[[Path], None]] = {
    "a folder": _replace(_folder),
    "a FIFO": _replace(lambda p: os.mkfifo(p)),
    "symlink to /dev/zero": _replace(lambda p: p.symlink_to("/dev/zero")),
    "symlink loop": _replace(lambda p: p.symlink_to(p.name)),
    "dangling symlink": _replace(lambda p: p.symlink_to("missing-target")),
    "not UTF-8": _bytes(b"\xff\xfe\x00\x80bad\n"),
    "NUL bytes": _edit(lambda b: b[: len(b) // 2] + b"\x00\x00" + b[len(b) // 2:]),
    "empty": _bytes(b""),
    "over the size cap (sparse 80 MB)": _sparse(80 * 1024 * 1024),
    "random bytes": _bytes(random.Random(7).randbytes(2000)),
    "cut in half": _edit(lambda b: b[: len(b) // 2]),
}

YAML_KINDS: dict[str, Callable[[Path], None]] = {
    "5,000-deep YAML": _text(DEEP_YAML),
    "300-deep block YAML": _text(DEEP_BLOCK_YAML),
    "YAML bomb (billion laughs)": _text(YAML_BOMB),
    "recursive alias": _text(RECURSIVE_YAML),
    "top level a list": _text("- a\n- b\n"),
    "state_directory outside": _text(FAST_CONFIG + "  state_directory: ../elsewhere\n"),
    "state_directory a file": _text(FAST_CONFIG + "  state_directory: Dashboard.md\n"),
    "state_directory absolute": _text(FAST_CONFIG + "  state_directory: /proc/self\n"),
    "project_dir missing": _text(FAST_CONFIG + "project_dir: no/such/folder\n"),
    "NaN timeout": _text(FAST_CONFIG + "  timeout_seconds: .nan\n"),
    "infinite timeout": _text(FAST_CONFIG + "  timeout_seconds: .inf\n"),
    "10**400 iterations": _text(FAST_CONFIG + "  max_iterations: 1" + "0" * 400 + "\n"),
}

STATE_KINDS: dict[str, Callable[[Path], None]] = {
    'next_retry_at "tomorrow"': _state_edit(_set("steps.2", {"attempts": 1, "next_retry_at": "tomorrow"})),
    "next_retry_at in year 2999": _state_edit(_set("steps.2", {"attempts": 1,
                                                                 "next_retry_at": "2999-01-01T00:00:00+00:00"})),
    "next_retry_at a number": _state_edit(_set("steps.2", {"attempts": 1, "next_retry_at": 12})),
    "NaN metrics": _state_edit(_set("metrics.success_rate", float("nan"))),
    "infinite duration": _state_edit(_set("metrics.total_duration_seconds", float("inf"))),
    "NaN cost": _state_edit(_set("usage.cost_usd", float("nan"))),
    "unknown status": _state_edit(_set("status", "exploded")),
    "negative iteration": _state_edit(_set("iteration", -5)),
    "steps a list": _state_edit(_set("steps", [])),
    "started_at garbage": _state_edit(_set("started_at", "yesterday-ish")),
    "task_path outside": _state_edit(_set("task_path", "../../../etc/passwd")),
    "task_path absolute": _state_edit(_set("task_path", "/dev/zero")),
    "task_id a path": _state_edit(_set("task_id", "../../evil")),
    "task_id of another loop": _state_edit(_set("task_id", "feat")),
    "schema_version 99": _state_edit(_set("schema_version", 99)),
    "deep JSON": _text("[" * 100000 + "]" * 100000),
    "JSON list": _text("[1, 2, 3]"),
}

TASK_KINDS: dict[str, Callable[[Path], None]] = {
    "5,000-deep frontmatter": _text("---\n" + DEEP_YAML + "---\n- [ ] 1. a\n"),
    "YAML bomb frontmatter": _text("---\n" + YAML_BOMB + "---\n- [ ] 1. a\n"),
    "frontmatter never closed": _text("---\ntitle: x\n- [ ] 1. a\n"),
    "no steps": _text("# Nothing to do\n"),
    "bad executor": _text("---\nexecutor: rocket\n---\n- [ ] 1. a\n"),
}

FOLDER_KINDS: dict[str, Callable[[Path], None]] = {
    "a file": _replace(lambda p: p.write_text("not a folder\n")),
    "symlink loop": _replace(lambda p: p.symlink_to(p.name)),
    "dangling symlink": _replace(lambda p: p.symlink_to("missing-folder")),
    "symlink to /dev/zero": _replace(lambda p: p.symlink_to("/dev/zero")),
    "a FIFO": _replace(lambda p: os.mkfifo(p)),
}


def _non_utf8_name(p: Path) -> None:
    p.mkdir(parents=True, exist_ok=True)
    name = os.fsdecode(b"caf\xe9-\xff.md")
    (p / name).write_text("- [ ] 1. x\n")
    (p / os.fsdecode(b"dir-\xfe")).mkdir()


def _deep_tree(p: Path) -> None:
    p.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1500):
        os.mkdir("d", dir_fd=fd)
        nfd = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    os.close(fd)


CONTENT_KINDS: dict[str, Callable[[Path], None]] = {
    "a non-UTF-8 file name inside": _non_utf8_name,
    "a 1,500-deep tree inside": _deep_tree,
}

TASK_IDS = {
    "300-character task id": "a" * 300,
    "129-character task id": "b" * 129,
    "task id '..'": "..",
    "task id with a slash": "a/b",
    "task id with a space": "a b",
    "task id starting with '-x'": "-x",
    "task id starting with '.'": ".hidden",
    "non-ASCII task id": "ünï",
}


# -- the cases -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    target: str  # what is wrong: a path in the workspace, or "--task-id"
    kind: str  # how it is wrong
    command: str
    args: tuple[str, ...]
    apply: Callable[[Path], None] | None
    needle: str  # what the error line must name
    must_fail: bool = False  # the cases: exit 1, not merely "no internal error"

    @property
    def name(self) -> str:
        return f"{self.target} | {self.kind} | {self.command}"


REPORTED = {  # (target, kind) pairs the issue reported; they must end with exit 1
    (HOOK, "a folder"), (GLOBAL_HOOK, "a folder"),
    (".hooks", "a file"), (".state", "a file"), ("Logs", "a file"), ("Specs", "a file"),
    ("Specs", "symlink loop"),
    (CONFIG, "5,000-deep YAML"), (CONFIG, "YAML bomb (billion laughs)"), (CONFIG, "symlink to /dev/zero"),
    (CONFIG, "symlink loop"), (CONFIG, "a FIFO"), (STATE, "symlink to /dev/zero"), (STATE, "symlink loop"),
    (STATE, "a FIFO"), (STATE, 'next_retry_at "tomorrow"'), (STATE, "next_retry_at in year 2999"),
    (STATE, "NaN metrics"), (STATE, "task_id a path"), (STATE, "task_id of another loop"),
}
NEEDLES = {  # a valid config that moves things: the error names what it finds there, not the config
    "state_directory outside": "",
    "state_directory a file": "Dashboard.md",
    "state_directory absolute": "",
    "project_dir missing": "",
}
REPORTED_COMMANDS = {"start", "resume"}  # read-only commands may show a broken loop and a warning


def cases() -> Iterator[Case]:
    def make(target: str, kinds: dict[str, Callable[[Path], None]], commands: list[tuple[str, list[str]]],
             needle: str) -> Iterator[Case]:
        for kind, fn in kinds.items():
            for cmd, args in commands:
                must = (target, kind) in REPORTED and cmd in REPORTED_COMMANDS and (target, cmd) != (HOOK, "start")
                yield Case(target, kind, cmd, tuple(args), fn, NEEDLES.get(kind, needle), must)

    yield from make(CONFIG, FILE_KINDS | YAML_KINDS, [START, RESUME, STATUS], "autonomous_loop.yaml")
    yield from make(STATE, FILE_KINDS | STATE_KINDS, [RESUME, STATUS, STATE_CMD], "autonomous_loop_other.json")
    yield from make(FEATURE, FILE_KINDS | TASK_KINDS, [START], "tasks.md")
    yield from make(OTHER_TASK, FILE_KINDS | TASK_KINDS, [RESUME], "tasks.md")
    hook_kinds = {k: FILE_KINDS[k] for k in ("a folder", "a FIFO", "symlink to /dev/zero", "symlink loop",
                                             "dangling symlink", "not UTF-8")}
    yield from make(HOOK, hook_kinds, [RESUME, START, STOP], "stop_autonomous_loop")
    yield from make(GLOBAL_HOOK, hook_kinds, [RESUME, START], "stop_autonomous_loop")
    yield from make(EVENTS, FILE_KINDS, [LOGS_JSON, RESUME], "other.jsonl")
    for folder in ("Specs", ".state", ".hooks", "Logs"):
        yield from make(folder, FOLDER_KINDS, [START, RESUME], folder)
    for folder in ("Done", "Needs_Action", "config", ".state/backups", ".state/archive", "Logs/completion_reports"):
        yield from make(folder, FOLDER_KINDS, [RESUME], folder.rsplit("/", 1)[-1])
    for folder in ("Specs", "Done", "Needs_Action"):
        yield from make(folder, CONTENT_KINDS, [START, STATUS], folder)
    for kind, tid in TASK_IDS.items():
        for cmd, args in (START, RESUME, STATE_CMD, STOP, START_DETACH):
            args = [tid if a in ("feat", "other") else a for a in args]
            # --detach named Logs/<id>.out after the id before checking it (issue "Hold against the attacks
            # that still work", item 7): every one of these ids must be refused there
            yield Case("--task-id", kind, cmd, tuple(args), None, "task id",
                       must_fail=kind == "300-character task id" or cmd == "start-detach")


ALL = list(cases())


# -- running -----------------------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, Any]:
    """Every entry under root: its type and content (a digest for files, the target for symlinks); lock
    files left out (empty flock targets). Walked through folder descriptors, each name relative to its
    folder's, so that a 1,500-deep tree costs a few milliseconds, not seconds of resolving long paths."""
    seen: dict[str, Any] = {}
    todo = [(os.open(root, os.O_RDONLY | os.O_DIRECTORY), "")]
    while todo:
        fd, prefix = todo.pop()
        try:
            with os.scandir(fd) as it:
                for entry in it:
                    if entry.name.endswith(".lock"):
                        continue
                    rel = prefix + entry.name
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISLNK(st.st_mode):
                        seen[rel] = ("link", os.readlink(entry.name, dir_fd=fd))
                    elif stat.S_ISDIR(st.st_mode):
                        seen[rel] = ("dir",)
                        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                        todo.append((os.open(entry.name, flags, dir_fd=fd), rel + "/"))
                    elif stat.S_ISREG(st.st_mode):
                        if st.st_size > 1 << 20:
                            seen[rel] = ("big", st.st_size, st.st_mtime_ns, st.st_ino)
                        else:
                            with open(os.open(entry.name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd), "rb") as fh:
                                seen[rel] = ("file", hashlib.sha256(fh.read()).hexdigest())
                    else:
                        seen[rel] = ("special", stat.S_IFMT(st.st_mode))
        finally:
            os.close(fd)
    return seen


def diff(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace with an unfinished loop `other` (out of iterations after step 1, no backups),
    and a second task file for `start`."""
    root = tmp_path_factory.mktemp("bad-base") / "vault"
    for name in ("Specs", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
        (root / name).mkdir(parents=True)
    (root / CONFIG).write_text(FAST_CONFIG)
    for rel in (FEATURE, OTHER_TASK):
        (root / rel).parent.mkdir(parents=True)
        (root / rel).write_text(shell_task(2))
    r = cli_forkserver.run(["loop", "start", "--task", OTHER_TASK, "--task-id", "other", "--max-iterations", "1"],
                           cwd=root, env=_env(), timeout=60)  # the fork server the cases' runs use (ForkServer)
    assert r.returncode == 4, r.stdout + r.stderr
    shutil.rmtree(root / ".state" / "backups", ignore_errors=True)
    for rel in (STATE, EVENTS, "Logs/completion_reports", ".state/archive"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / "Logs" / "completion_reports").mkdir(exist_ok=True)
    (root / ".state" / "archive").mkdir(exist_ok=True)
    (root / ".state" / "backups").mkdir(exist_ok=True)
    return root


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KIRO_", "OPENAI_"))}
    env.pop("PYTEST_CURRENT_TEST", None)
    env["PYTHONUNBUFFERED"] = "1"
    env["NO_COLOR"] = "1"
    env["KIRO_RAISE_ERRORS"] = "1"  # an unexpected exception is a traceback, which the suite counts
    return env


class ForkServer:
    """Each case that runs a loop (start, resume, --detach) as `python -m kiro` forked from the suite's fork
    server (tests/cli_forkserver.py): a cold interpreter per case would cost ~1 s of start and imports.
    A read command or `stop` runs in this process (tests/cli_inprocess.py): a fork costs a second on a
    loaded machine. The same properties hold either way: an exception kiro lets through is a traceback
    on stderr and exit 1 there too. (In process, a hang is pytest-timeout's: nothing to kill.)"""

    def run(self, cwd: Path, args: list[str]) -> dict[str, Any]:
        if not cli_inprocess.needs_a_process(args):
            r = cli_inprocess.run(args, cwd=cwd, env=_env())
            return {"code": r.returncode, "stdout": r.stdout, "stderr": r.stderr, "hung": False}
        try:
            r = cli_forkserver.run(args, cwd=cwd, env=_env(), timeout=HANG_SECONDS)
        except subprocess.TimeoutExpired as exc:
            return {"code": -9, "stdout": exc.output or "", "stderr": exc.stderr or "", "hung": True}
        return {"code": r.returncode, "stdout": r.stdout, "stderr": r.stderr, "hung": False}

    def close(self) -> None:
        pass


@dataclass
class Result:
    case: Case
    code: int
    hung: bool
    internal: bool
    changed: list[str]
    error_line: str | None
    problems: list[str]


def run_case(server: ForkServer, base: Path, scratch: Path, case: Case) -> Result:
    root = scratch / "vault"
    if root.exists():
        _rmtree(root)
    shutil.copytree(base, root, symlinks=True)
    if case.apply is not None:
        case.apply(root / case.target)
    before = snapshot(root)
    out = server.run(root, list(case.args))
    both = out["stdout"] + out["stderr"]
    internal = "internal error" in both or "Traceback" in both
    errors = [line for line in out["stderr"].splitlines() if line.strip() and not line.startswith("kiro: warning:")]
    changed = diff(before, snapshot(root)) if out["code"] == 1 else []  # only a refusal must leave all as it was
    problems: list[str] = []
    if internal:
        problems.append("internal error")
    if out["hung"]:
        problems.append(f"hung over {HANG_SECONDS:.0f} s")
    if changed:
        problems.append(f"changed {changed[:3]}")
    if out["code"] == 1:
        if len(errors) != 1:
            problems.append(f"{len(errors)} error lines")
        elif case.needle and case.needle not in errors[0]:
            problems.append(f"error line does not name {case.needle!r}")
    if case.must_fail and out["code"] != 1:
        problems.append(f"exit {out['code']}, not 1")
    if problems:
        problems.append(f"exit {out['code']}: {both.strip()[-300:]!r}")
    return Result(case, out["code"], out["hung"], internal, changed, errors[0] if errors else None, problems)


def _rmtree(root: Path) -> None:
    """shutil.rmtree, also for the 1,500-deep tree (rm copes with any depth)."""
    subprocess.run(["rm", "-rf", "--", str(root)], check=True)


def print_table(results: list[Result]) -> None:
    by_target: dict[str, Counter[str]] = defaultdict(Counter)
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    for r in results:
        for table, key in ((by_target, r.case.target), (by_kind, r.case.kind)):
            table[key]["cases"] += 1
            table[key]["exit 1"] += r.code == 1
            table[key]["other exit"] += r.code != 1
            table[key]["held"] += not r.problems
    for title, table in (("target", by_target), ("corruption", by_kind)):
        print(f"\n{title:<44} {'cases':>6} {'exit 1':>7} {'other':>6} {'held':>5}")
        for key, c in table.items():
            print(f"{key:<44} {c['cases']:>6} {c['exit 1']:>7} {c['other exit']:>6} {c['held']:>5}")
    print(f"\ngenerated bad-input cases: {len(results)}; internal errors: {sum(r.internal for r in results)}; "
          f"hangs over {HANG_SECONDS:.0f} s: {sum(r.hung for r in results)}; "
          f"exit 1 with files changed: {sum(bool(r.changed) for r in results)}; "
          f"exit 1: {sum(r.code == 1 for r in results)}; "
          f"held all properties: {sum(not r.problems for r in results)}")


SHARDS = 4  # the cases in four parts, so `pytest -n 2` (xdist) can run them side by side


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("shard", range(SHARDS), ids=lambda n: f"part{n + 1}of{SHARDS}")
def test_generated_bad_inputs_never_crash_hang_or_change_files(base: Path, tmp_path: Path, shard: int) -> None:
    assert len(ALL) >= 300, len(ALL)
    only = os.environ.get("KIRO_BAD_ONLY")  # a substring of case names, to rerun a few while fixing
    chosen = [c for c in ALL[shard::SHARDS] if not only or only in c.name]
    server = ForkServer()
    try:
        results = []
        for case in chosen:
            results.append(run_case(server, base, tmp_path, case))
            if os.environ.get("KIRO_BAD_SHOW"):  # every case's exit code and error line, while fixing
                print(f"{case.name}: exit {results[-1].code}: {results[-1].error_line}", file=sys.stderr)
            if results[-1].problems and os.environ.get("KIRO_BAD_VERBOSE"):
                print(f"FAILED {case.name}: {'; '.join(results[-1].problems)}", file=sys.stderr, flush=True)
    finally:
        server.close()
    print_table(results)
    failed = [r for r in results if r.problems]
    for r in failed:
        print(f"FAILED {r.case.name}: {'; '.join(r.problems)}")
    assert not failed, f"{len(failed)} of {len(results)} cases broke a property (listed above)"
