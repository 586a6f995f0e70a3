"""The fast read path (issue #12 item 4): `kiro loop status`, `state` and `logs` answered with the
standard library only, byte for byte what the full CLI prints, and the full CLI whenever the fast
path has a doubt."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kiro import fastread
from tests.conftest import Workspace, shell_task

TASK = "Specs/feature/tasks.md"
FORBIDDEN = ("pydantic", "pydantic_core", "yaml", "asyncio", "typer", "click", "filelock")

PROBE = """
import json, sys
from kiro.fastread import run
code = run(sys.argv[1:])
sys.stdout.flush()
sys.stderr.write("\\n@@" + json.dumps({"code": code, "modules": sorted(sys.modules)}) + "\\n")
"""


def probe(ws: Workspace, *args: str, **env: str) -> tuple[int | None, list[str], str]:
    """Run the fast path alone in a fresh interpreter: (its exit code or None, the modules it
    imported, its stdout)."""
    r = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=ws.root, env=ws.env(KIRO_FAST_READ_STRICT="1", **env),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stderr.rsplit("@@", 1)[1])
    return report["code"], report["modules"], r.stdout


def both(ws: Workspace, *args: str) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """The same command through the fast path and through the full CLI."""
    fast = ws.kiro(*args, env=ws.env(KIRO_FAST_READ_STRICT="1"))
    full = ws.kiro(*args, env=ws.env(KIRO_NO_FAST_READ="1"))
    return fast, full


def assert_same(ws: Workspace, *args: str) -> None:
    fast, full = both(ws, *args)
    assert (fast.returncode, fast.stdout, fast.stderr) == (full.returncode, full.stdout, full.stderr), args


def checked(ws: Workspace) -> None:
    """A read command through the full path first: it records the checked config for the fast path."""
    r = ws.kiro("loop", "status", env=ws.env(KIRO_NO_FAST_READ="1"))
    assert r.returncode == 0, r.stderr


@pytest.fixture
def loops(ws: Workspace) -> Workspace:
    """Three loops: one completed (archived), one stopped at max_iterations, one paused by its hook."""
    ws.task(shell_task(3))
    assert ws.kiro("loop", "start", "--task", TASK, "--task-id", "done1").returncode == 0
    ws.task(shell_task(3), rel="Specs/other/tasks.md")
    assert ws.kiro("loop", "start", "--task", "Specs/other/tasks.md", "--task-id", "half",
                   "--max-iterations", "1").returncode == 4
    ws.task(shell_task(2, cmd="sleep 0.1"), rel="Specs/third/tasks.md")
    (ws.root / ".hooks" / "stop_autonomous_loop_held.md").write_text("stop\n")
    assert ws.kiro("loop", "start", "--task", "Specs/third/tasks.md", "--task-id", "held").returncode == 3
    checked(ws)
    return ws


READS = [
    ("loop", "status"), ("loop", "status", "--json"), ("loop", "status", "--task-id", "half"),
    ("loop", "status", "--task-id", "done1", "--json"), ("loop", "status", "--task-id=held"),
    ("loop", "state", "--task-id", "half"), ("loop", "state", "--task-id", "done1", "--json"),
    ("loop", "state", "--task", "Specs/other/tasks.md"),
    ("loop", "logs", "--task-id", "done1"), ("loop", "logs", "--task-id", "half", "--json"),
    ("loop", "logs", "--task-id", "done1", "--tail", "3"), ("loop", "logs", "--task-id", "done1", "-n", "1", "--json"),
    ("loop", "progress", "--task-id", "half"), ("loop", "progress", "--task-id", "held", "--json"),
    ("loop", "progress", "--task", "Specs/other/tasks.md"), ("loop", "progress", "--task-id", "done1"),
    ("loop", "logs", "--task-id", "done1", "--tail", "0"), ("loop", "logs", "--task-id", "done1", "--tail=100000"),
]


def test_every_read_command_prints_what_the_full_cli_prints_byte_for_byte(loops: Workspace) -> None:
    for args in READS:
        code, modules, _out = probe(loops, *args)
        assert code == 0, f"{args}: the fast path did not answer"
        heavy = [m for m in modules if m.split(".")[0] in FORBIDDEN]
        assert heavy == [], f"{args} imported {heavy[:5]}"
        assert_same(loops, *args)
    print(f"{len(READS)} read commands: fast path answered each, output identical, none imported "
          f"{'/'.join(FORBIDDEN)}")


def test_a_live_loop_and_an_interrupted_one_read_the_same(ws: Workspace) -> None:
    ws.task(shell_task(2, cmd="sleep 30"))
    proc = ws.spawn("loop", "start", "--task", TASK, "--task-id", "live")
    try:
        ws.wait_for(lambda: (ws.state("live").get("current_step") or {}).get("status") == "in_progress",
                    what="the step to start")
        checked(ws)
        for args in (("loop", "status", "--json"), ("loop", "status", "--task-id", "live", "--json")):
            fast, full = both(ws, *args)
            a, b = json.loads(fast.stdout), json.loads(full.stdout)
            for row in (a if isinstance(a, list) else [a]) + (b if isinstance(b, list) else [b]):
                assert row["status"] == "running" and row["alive"] is True
                row.pop("duration_seconds")  # the clock moved between the two
                row.pop("duration")
            assert a == b
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert json.loads(both(ws, "loop", "status", "--json")[0].stdout)[0]["status"] == "interrupted"
        assert_same(ws, "loop", "status")
        assert_same(ws, "loop", "status", "--task-id", "live")
    finally:
        proc.kill()
        proc.wait()


def test_a_scheduled_loop_reads_the_same(ws: Workspace) -> None:
    """A recurring task's schedule, runs and next run (SPEC §11) in status and state."""
    from datetime import timedelta

    from kiro import timeutil
    from kiro.state import LoopState, ScheduleInfo, StateStore
    from kiro.workspace import Workspace as KiroWorkspace

    store = StateStore(KiroWorkspace(ws.root))
    for tid, status, stateful in (("nightly", "paused", True), ("hourly", "sleeping", False),
                                  ("ended", "completed", True)):
        st = LoopState(task_id=tid, task_path=f"Specs/{tid}/tasks.md", status=status, runs=3,
                       last_run_at=timeutil.iso(), next_run_at=timeutil.iso(timeutil.now() + timedelta(seconds=3630)),
                       schedule=ScheduleInfo(expression="every 1h", stateful=stateful))
        store.save(st, fsync=False)
    checked(ws)
    for args in (("loop", "status"), ("loop", "status", "--json"), ("loop", "status", "--task-id", "nightly"),
                 ("loop", "status", "--task-id", "hourly", "--json"), ("loop", "state", "--task-id", "ended")):
        assert probe(ws, *args)[0] == 0, args
        assert_same(ws, *args)


def test_a_sleeping_loop_says_why_the_same_way(ws: Workspace) -> None:
    """A live loop sleeping (a backoff, a guardrail's wait): why and until when, from the state file
    and from the summary alike."""
    from kiro import timeutil
    from kiro.state import LoopState, StateStore
    from kiro.workspace import Workspace as KiroWorkspace

    store = StateStore(KiroWorkspace(ws.root))
    st = LoopState(task_id="napping", task_path="Specs/n/tasks.md", status="running", sleep_until=timeutil.iso())
    st.transition("sleeping", "max_cpu_percent")
    store.save(st, fsync=False)
    lock = store.acquire("napping")  # this process is the loop's live process
    try:
        checked(ws)
        for summary in (True, False):
            if not summary:
                (ws.root / ".state" / "autonomous_loop_napping.summary").unlink()
            for args in (("loop", "status", "--json"), ("loop", "status", "--task-id", "napping", "--json")):
                fast, full = both(ws, *args)
                assert probe(ws, *args)[0] == 0
                a, b = json.loads(fast.stdout), json.loads(full.stdout)
                for row in (a if isinstance(a, list) else [a]) + (b if isinstance(b, list) else [b]):
                    assert row["sleeping_because"] == "max_cpu_percent" and row["alive"] is True
                    row.pop("duration_seconds")
                    row.pop("duration")
                assert a == b
    finally:
        store.release("napping", lock)


def test_doubts_go_to_the_full_cli(loops: Workspace) -> None:
    """Whatever the fast path is unsure of, it leaves to the full CLI, before printing anything."""
    ws = loops
    state_file = ws.root / ".state" / "autonomous_loop_half.json"
    tried = []

    def falls_back(what: str, *args: str, **env: str) -> None:
        code, _modules, out = probe(ws, *args, **env)
        assert code is None and out == "", what
        assert_same(ws, *args)
        tried.append(what)

    falls_back("config set from the environment", "loop", "status", KIRO_MAX_ITERATIONS="5")
    falls_back("logs --follow", "loop", "logs", "--task-id", "done1", "--follow")
    falls_back("an unknown loop", "loop", "state", "--task-id", "nope")
    falls_back("several loops, none named", "loop", "state")
    falls_back("--help", "loop", "status", "--help")
    text = state_file.read_text()
    state = json.loads(text)
    state["iteration"] = "one"  # pydantic refuses it: the backup is shown, with a warning
    state_file.write_text(json.dumps(state, indent=2))
    falls_back("a state pydantic would refuse", "loop", "status", "--task-id", "half")
    # The table reads each loop's summary (kiro.journal writes it on every save), not its state file:
    # it shows the loop's last save, where the full path shows the newest backup and warns.
    code, _modules, out = probe(ws, "loop", "status", "--json")
    assert code == 0 and [r["iteration"] for r in json.loads(out) if r["task_id"] == "half"] == [1]
    del state["iteration"]
    state_file.write_text(json.dumps(state, indent=2))
    falls_back("a state missing a field (pydantic fills the default)", "loop", "state", "--task-id", "half")
    state_file.write_text(text[: len(text) // 2])
    falls_back("a torn state file", "loop", "state", "--task-id", "half")
    state_file.write_text(text)
    config = ws.root / "config" / "autonomous_loop.yaml"
    config.write_text(config.read_text() + "  failure_threshold: 4\n")
    falls_back("a config changed since it was checked", "loop", "status")
    assert probe(ws, "loop", "status")[0] == 0  # checked again by the full path: fast again
    config.write_text("autonomous_loop: [\n")
    falls_back("a broken config (the full path warns)", "loop", "status")
    print(f"{len(tried)} doubtful cases left to the full CLI, identical output: {'; '.join(tried)}")


def test_status_reads_the_summary_and_the_state_when_the_summary_is_torn(loops: Workspace) -> None:
    from kiro import journal

    ws = loops
    summary = ws.root / ".state" / "autonomous_loop_half.summary"
    data = journal.decode_summary(summary.read_bytes())
    assert data is not None and data["iteration"] == 1
    data["title"] = "FROM THE SUMMARY"
    summary.write_bytes(journal.encode_summary(data))
    rows = json.loads(ws.kiro("loop", "status", "--json", env=ws.env(KIRO_FAST_READ_STRICT="1")).stdout)
    assert [r["title"] for r in rows if r["task_id"] == "half"] == ["FROM THE SUMMARY"]
    summary.write_bytes(summary.read_bytes()[:40])  # torn: its CRC fails, the state file is read
    assert probe(ws, "loop", "status", "--json")[0] == 0
    assert_same(ws, "loop", "status", "--json")


def test_the_summary_decoder_is_the_journals() -> None:
    from kiro import journal

    good = journal.encode_summary({"task_id": "a", "status": "paused", "note": "é ⏎"})
    samples = [good, good[:-3], good[:20], b"", b"kiro-summary 1 zz 5\n{}", good.replace(b"paused", b"pausex"),
               journal.encode_summary({"x": 1}) + b"      ", b"kiro-summary 2 " + good[15:],
               journal.SUMMARY_MAGIC + b"%08x 2\n[]" % __import__("zlib").crc32(b"[]")]
    assert fastread.SUMMARY_MAGIC == journal.SUMMARY_MAGIC
    for data in samples:
        assert fastread.decode_summary(data) == journal.decode_summary(data), data


def test_logs_tail_reads_from_the_end_as_read_events_would(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Torn lines, blank lines, a line longer than the block, JSON that is not an object, no final
    newline: the last N events are those of kiro.events.read_events, at every block boundary."""
    from kiro.events import read_events

    lines = [json.dumps({"event": "e", "n": i}) for i in range(30)]
    lines[5] = '{"event": "torn'
    lines[9] = ""
    lines[12] = json.dumps({"event": "long", "text": "x" * 200})
    lines[15] = "[1, 2]"
    lines[20] = "   "
    cases = {"newline at the end": "\n".join(lines) + "\n", "no newline at the end": "\n".join(lines),
             "torn tail": "\n".join(lines) + '\n{"event": "half', "empty": ""}
    checked_count = 0
    for block in (1, 7, 64, 65536):
        monkeypatch.setattr(fastread, "TAIL_BLOCK", block)
        for name, text in cases.items():
            path = tmp_path / f"{block}_{name}.jsonl"
            path.write_text(text)
            every = list(read_events(path))
            for n in (0, 1, 2, 5, 13, 26, 40):
                fd = os.open(path, os.O_RDONLY)
                try:
                    got = fastread._tail_events(fd, n)
                finally:
                    os.close(fd)
                assert got == (every[-n:] if n else []), (block, name, n)
                checked_count += 1
    print(f"{checked_count} tails compared with read_events: all equal")


def test_the_state_shape_is_the_state_models(tmp_path: Path) -> None:
    """The field lists the fast path checks a state against are kiro.state's models, in order."""
    from pydantic import BaseModel

    from kiro import config, state

    for name, fields in fastread._MODELS.items():
        if name.startswith("Summary"):
            continue
        model: type[BaseModel] = getattr(state, name)
        want = [f.alias or n for n, f in model.model_fields.items()]
        assert [f for f, _kind in fields] == want, name
    assert fastread.CONFIG_ENV_KEYS == set(config.ENV_KEYS)


def test_progress_leaves_frontmatter_it_cannot_vouch_for_to_the_full_cli(loops: Workspace) -> None:
    """`progress` parses the task file without PyYAML only when its frontmatter is plain `key: word`
    lines (kiro.fastread._plain_frontmatter); anything YAML could read otherwise, or that kiro
    refuses, goes to the full path, which prints the same or its warning."""
    ws = loops
    task = ws.root / "Specs/other/tasks.md"
    body = task.read_text().split("---\n", 2)[2]
    cases = [  # (frontmatter lines, whether the fast path answers)
        ("title: Plain words here\nexecutor: shell\nmax_iterations: 5\n", True),
        ("title: v1.2 (draft) - part/two\n", True),
        ('title: "Quoted: with a colon"\n', False),
        ("title: yes\n", False),  # YAML 1.1 reads a boolean: kiro refuses it, with a warning
        ("title: 5\n", False),  # a number where kiro wants text
        ("title: Off\n", False),
        ("tags: [a, b]\n", False),
        ("title: x # a comment\n", False),
        ("title: Ünïcode\n", False),
    ]
    tried = []
    for frontmatter, answers in cases:
        task.write_text("---\n" + frontmatter + "---\n" + body)
        for args in (("loop", "progress", "--task-id", "half"), ("loop", "progress", "--task-id", "half", "--json")):
            code, modules, _out = probe(ws, *args)
            assert (code == 0) == answers, (frontmatter, code)
            if answers:
                assert not [m for m in modules if m.split(".")[0] in FORBIDDEN], frontmatter
            assert_same(ws, *args)
        tried.append(f"{frontmatter.splitlines()[0]!r}: {'fast' if answers else 'full'}")
    task.write_text("---\ntitle: never closed\n" + body)
    assert probe(ws, "loop", "progress", "--task-id", "half")[0] is None
    assert_same(ws, "loop", "progress", "--task-id", "half")
    task.write_bytes(("---\ntitle: Windows\n---\n" + body).replace("\n", "\r\n").encode())
    assert probe(ws, "loop", "progress", "--task-id", "half")[0] is None
    assert_same(ws, "loop", "progress", "--task-id", "half")
    task.rename(ws.root / "Done/other.md")  # not where the state says: the full path looks for it
    assert probe(ws, "loop", "progress", "--task-id", "half")[0] is None
    assert_same(ws, "loop", "progress", "--task-id", "half")
    print(f"{len(cases) + 3} task files: {'; '.join(tried)}; unclosed, CRLF and moved: full")


def test_progress_knows_kiros_text_keys() -> None:
    from kiro import tasks

    assert fastread._STRING_KEYS == tasks.KIRO_STRING_KEYS


def test_a_loop_run_into_a_pipe_prints_what_rich_prints_without_importing_it(ws: Workspace) -> None:
    """`kiro loop start` whose output is not a terminal prints each event's line as rich would
    (`console.event_plain`) and never imports rich (~30 ms of its start-up, issue #12)."""
    import io

    from rich.console import Console

    from kiro import console

    ws.write("Specs/a/tasks.md", shell_task(2, cmd="printf 'tab\\there \\a bell é ▶'"))
    code = ("import runpy, sys\nsys.argv = ['kiro', 'loop', 'start', '--task', 'Specs/a/tasks.md']\n"
            "try:\n    runpy.run_module('kiro', run_name='__main__')\n"
            "except SystemExit as e:\n    print('exit', e.code, 'rich' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ws.root, env=ws.env(), capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.splitlines()[-1] == "exit 0 False", out.stdout + out.stderr
    # the same lines as rich's, for every event of the run and a few awkward ones
    task_id = ws.only_task_id()
    records = ws.events(task_id) + [
        {"event": "step_failed", "ts": "2026-11-23T07:00:00.000+00:00", "iteration": 3, "step_id": "2",
         "attempt": 2, "error": "bell \a back\b ff\f cr\r vt\v [bold]not markup[/] é 漢 " + "x" * 300},
        {"event": "step_started", "ts": "2026-11-23T07:00:00.000+00:00", "iteration": 4, "step_id": "[x]",
         "description": "emoji 🎉 and :smile: and \x1b[31mansi\x1b[0m", "attempt": 1}]
    for with_task in (False, True):
        for e in records:
            plain = console.event_plain(e, with_task=with_task)
            rich_text = console.format_event(e, with_task=with_task)
            assert (plain is None) == (rich_text is None), e
            if rich_text is None:
                continue
            buf = io.StringIO()
            Console(file=buf, highlight=False, soft_wrap=True).print(rich_text)
            assert plain + "\n" == buf.getvalue(), e
    printed = [line for line in out.stdout.splitlines()[:-1] if not line.startswith(task_id + ":")]
    shown = [console.event_plain(e) for e in ws.events(task_id)
             if e["event"] not in ("tool_called", "model_called", "iteration_started", "reinjected",
                                   "report_written")]
    assert printed == [s for s in shown if s is not None]


def test_a_step_with_no_number_is_named_once_when_it_starts() -> None:
    """Its text is its id: `▶ Deploy it`, not `▶ Deploy it Deploy it`; a numbered step shows both."""
    from kiro import console

    base = {"event": "step_started", "ts": "2026-11-27T07:00:00.000+00:00", "iteration": 1, "attempt": 1}
    once = console.event_plain({**base, "step_id": "Deploy it", "description": "Deploy it"})
    assert once == "07:00:00 [1] ▶ Deploy it"
    assert console.event_plain({**base, "step_id": "2", "description": "Deploy it"}) == "07:00:00 [1] ▶ 2 Deploy it"
