"""Following a loop that runs in the workspace worker (`kiro loop start` in the foreground on the temporal
backend): every event of the run is printed, also one half-written when the follower first looked. No
server needed: the follower reads the event log."""

from __future__ import annotations

import json

from kiro.store.workspace import Workspace as KiroWorkspace
from kiro.temporal.client import LogFollower
from tests.conftest import Workspace


def _line(event: str, **fields: object) -> bytes:
    return (json.dumps({"event": event, **fields}) + "\n").encode()


def test_a_line_half_written_when_the_follower_looks_is_printed_whole(ws: Workspace) -> None:
    log = ws.root / "Logs" / "t.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    before = _line("loop_finished", n=1)  # the run before: not printed again
    half = _line("loop_resumed", n=2)
    log.write_bytes(before + half[:7])  # the worker is writing its first event of this run
    shown: list[dict[str, object]] = []
    follower = LogFollower(KiroWorkspace(ws.root), "t", shown.append)
    follower.poll()
    assert shown == []
    with open(log, "ab") as fh:
        fh.write(half[7:] + _line("step_started", n=3))
    follower.poll()
    assert [e["n"] for e in shown] == [2, 3]


def test_a_follower_made_before_the_log_exists_prints_it_from_the_top(ws: Workspace) -> None:
    shown: list[dict[str, object]] = []
    follower = LogFollower(KiroWorkspace(ws.root), "new", shown.append)
    log = ws.root / "Logs" / "new.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(_line("loop_started", n=1) + _line("step_started", n=2))
    follower.poll()
    assert [e["n"] for e in shown] == [1, 2]
