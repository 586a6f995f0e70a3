"""`kiro serve` end to end: a real server process, real loops run by other `kiro` processes, real
HTTP / SSE / WebSocket clients."""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.conftest import Workspace, shell_task
from tests.serve_helpers import TOKEN, Served, loops_alive, sse_stream, start_server, stop_loops

GATED = 'while [ ! -f "gate_$KIRO_STEP_ID" ]; do sleep 0.02; done'


@pytest.fixture
def served(ws: Workspace) -> Iterator[Served]:
    s = start_server(ws)
    yield s
    s.stop()
    stop_loops(ws.root)


def _collect_until(stream: Iterator[Any], done: Any, limit: int = 500) -> list[Any]:
    out = []
    for item in stream:
        out.append(item)
        if done(out) or len(out) >= limit:
            break
    return out


# -- auth --------------------------------------------------------------------------------------

ROUTES = [
    ("GET", "/"), ("GET", "/api/info"), ("GET", "/api/loops"), ("GET", "/api/loops/x"),
    ("GET", "/api/loops/x/progress"), ("GET", "/api/loops/x/events?after=0"), ("GET", "/api/events"),
    ("POST", "/api/loops"), ("POST", "/api/loops/x/stop"), ("POST", "/api/loops/x/resume"),
    ("POST", "/api/loops/x/messages"), ("GET", "/nope"),
]


def test_every_route_but_healthz_needs_the_token(served: Served) -> None:
    c = served.client()
    tried = held = 0
    for method, path in ROUTES:
        for headers, query in (({}, ""), ({"Authorization": "Bearer wrong-token-xxxxxxxx"}, ""),
                               ({}, "token=wrong"), ({"Authorization": f"Basic {TOKEN}"}, "")):
            url = path + (("&" if "?" in path else "?") + query if query else "")
            r = c.request(method, url, headers=headers, json={} if method == "POST" else None)
            tried += 1
            assert r.status_code == 401, (method, url, headers, r.status_code)
            if path == "/":  # a person at the door: a page that says where the token is, and nothing else
                assert "token needed" in r.text and ".state/serve/token" in r.text and "loops" not in r.text
            else:
                assert "token" in r.json()["message"]
            held += 1
    for query in ("", "?token=wrong"):
        tried += 1
        with pytest.raises(InvalidStatus) as info:
            connect(served.ws_url + query, open_timeout=10)
        assert info.value.response.status_code == 401
        held += 1
    print(f"unauthenticated requests tried: {tried}, refused with 401: {held}")
    assert c.get("/healthz").status_code == 200
    # the right token, as a header or as ?token=, opens every read route
    assert c.get("/api/loops", headers=served.auth).status_code == 200
    assert c.get(f"/api/loops?token={TOKEN}").status_code == 200
    page = c.get(f"/?token={TOKEN}")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    with connect(served.ws_url + f"?token={TOKEN}", open_timeout=10) as sock:
        assert json.loads(sock.recv(10))["type"] == "hello"


def test_a_non_loopback_host_is_refused_without_the_token_env(ws: Workspace) -> None:
    for host in ("0.0.0.0", "192.0.2.10", "::"):
        r = ws.kiro("serve", "--host", host, "--port", "0", timeout=30)
        assert r.returncode == 1, (host, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "KIRO_SERVE_TOKEN" in lines[0] and host in lines[0], r.stderr
        assert "Traceback" not in r.stderr
    assert not (ws.root / ".state" / "serve" / "token").exists()
    short = ws.kiro("serve", "--port", "0", env=ws.env(KIRO_SERVE_TOKEN="short"), timeout=30)
    assert short.returncode == 1 and "too short" in short.stderr


def test_a_generated_token_is_printed_once_and_kept_mode_0600(ws: Workspace) -> None:
    s = start_server(ws, token=None)
    try:
        kept = ws.root / ".state" / "serve" / "token"
        assert kept.read_text().strip() == s.token
        assert stat.S_IMODE(kept.stat().st_mode) == 0o600
        out = ws.output(s.proc)
        assert out.count(s.token) == 1
        assert s.get("/api/loops").status_code == 200
    finally:
        s.stop()


# -- events ------------------------------------------------------------------------------------

def test_sse_streams_events_of_loops_run_by_other_processes(ws: Workspace, served: Served) -> None:
    ws.task(shell_task(3, cmd="sleep 0.1", title="A"), "Specs/a/tasks.md")
    ws.task(shell_task(2, cmd="sleep 0.1", title="B"), "Specs/b/tasks.md")
    stream = sse_stream(served)
    hello = next(stream)
    assert hello.event == "hello"
    procs = [ws.spawn("loop", "start", "--task", "Specs/a/tasks.md", "--task-id", "la"),
             ws.spawn("loop", "start", "--task", "Specs/b/tasks.md", "--task-id", "lb")]
    got = _collect_until(stream, lambda out: sum(1 for e in out if e.json()["event"] == "loop_finished") == 2)
    for p in procs:
        assert p.wait(60) == 0, ws.output(p)
    ids = [int(e.id) for e in got]
    assert ids == list(range(ids[0], ids[0] + len(ids))), "cursors are consecutive"
    for tid in ("la", "lb"):
        seen = [e.json() for e in got if e.json()["task_id"] == tid]
        assert seen == ws.events(tid), f"{tid}: every event of its log, once, in order"
    kinds = [e["event"] for e in ws.events("la")]
    assert kinds.count("step_completed") == 3 and kinds[-1] == "loop_finished"


def test_last_event_id_resumes_without_loss_or_duplicates_across_a_restart(ws: Workspace) -> None:
    ws.task(shell_task(4, cmd=GATED))
    served = start_server(ws)
    try:
        stream = sse_stream(served)
        assert next(stream).event == "hello"
        loop = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "gated")
        (ws.root / "gate_1").touch()
        first = _collect_until(stream, lambda out: out[-1].json()["event"] == "step_completed")
        stream.close()  # the client goes away
        (ws.root / "gate_2").touch()
        (ws.root / "gate_3").touch()
        ws.wait_for(lambda: [e for e in ws.events("gated") if e["event"] == "step_completed"][2:], what="step 3")
        served.stop()  # and the server restarts while events keep being appended
        served = start_server(ws)
        resumed = sse_stream(served, last_event_id=first[-1].id)
        hello = next(resumed)
        assert hello.event == "hello" and hello.json()["cursor"] == int(first[-1].id)
        (ws.root / "gate_4").touch()
        second = _collect_until(resumed, lambda out: out[-1].json()["event"] == "loop_finished")
        resumed.close()
        assert loop.wait(60) == 0, ws.output(loop)
    finally:
        served.stop()
        stop_loops(ws.root)
    both = first + second
    ids = [int(e.id) for e in both]
    assert ids == list(range(1, len(both) + 1)), f"one gap-free sequence: {ids}"
    assert [e.json() for e in both] == ws.events("gated")
    print(f"events before the disconnect: {len(first)}, after resuming: {len(second)}, log: {len(ws.events('gated'))}")


def test_sse_filter_and_query_cursor(ws: Workspace, served: Served) -> None:
    ws.task(shell_task(1, title="A"), "Specs/a/tasks.md")
    ws.task(shell_task(1, title="B"), "Specs/b/tasks.md")
    assert ws.kiro("loop", "start", "--task", "Specs/a/tasks.md", "--task-id", "fa").returncode == 0
    assert ws.kiro("loop", "start", "--task", "Specs/b/tasks.md", "--task-id", "fb").returncode == 0
    served.get("/healthz")
    ws.wait_for(lambda: served.client().get("/healthz").json()["events"] == len(ws.events("fa")) + len(ws.events("fb")),
                what="indexed")
    stream = sse_stream(served, query="?after=0&task_id=fb")
    assert next(stream).event == "hello"
    got = _collect_until(stream, lambda out: out[-1].json()["event"] == "loop_finished")
    stream.close()
    assert [e.json() for e in got] == ws.events("fb")


# -- REST --------------------------------------------------------------------------------------

def _wait_status(served: Served, tid: str, want: set[str], timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    row: dict[str, Any] = {}
    while time.monotonic() < deadline:
        r = served.get(f"/api/loops/{tid}")
        if r.status_code == 200:
            row = r.json()
            if row["effective_status"] in want and not served.get("/api/loops").json()[0]["alive"]:
                return row
        time.sleep(0.1)
    raise AssertionError(f"{tid} never reached {want}: {row.get('effective_status')}")


def test_rest_start_state_progress_events_stop_resume_message(ws: Workspace, served: Served) -> None:
    ws.task(shell_task(4, cmd=GATED))
    (ws.root / "gate_1").touch()
    r = served.post("/api/loops", {"task": "Specs/feature/tasks.md", "options": {"max_iterations": 40}})
    assert r.status_code == 201, r.text
    tid = r.json()["task_id"]
    rows = served.get("/api/loops").json()
    assert [row["task_id"] for row in rows] == [tid] and rows[0]["max_iterations"] == 40
    ws.wait_for(lambda: [e for e in ws.events(tid) if e["event"] == "step_completed"], what="a step")
    assert served.get(f"/api/loops/{tid}").json()["task_id"] == tid
    prog = served.get(f"/api/loops/{tid}/progress").json()
    assert prog["steps_total"] == 4 and prog["steps"][0]["status"] == "done"
    evs = served.get(f"/api/loops/{tid}/events?after=2").json()
    assert evs["events"][0]["n"] == 3 and evs["events"][0] == {**ws.events(tid)[2], "n": 3}
    tail = served.get(f"/api/loops/{tid}/events?tail=2").json()["events"]
    assert len(tail) == 2
    m = served.post(f"/api/loops/{tid}/messages", {"content": "please use tabs"})
    assert m.status_code == 202 and m.json()["queued"] is True and m.json()["delivered"] is False
    assert served.post(f"/api/loops/{tid}/messages", {"content": f"the token is {TOKEN}"}).status_code == 202
    inbox = [json.loads(x) for x in (ws.root / ".state" / "inbox" / f"{tid}.jsonl").read_text().splitlines()]
    assert [m["content"] for m in inbox] == ["please use tabs", "the token is [REDACTED]"]
    assert served.post(f"/api/loops/{tid}/stop", {"reason": "lunch"}).status_code == 202
    (ws.root / "gate_2").touch()  # the running step ends; the loop pauses before the next one
    paused = _wait_status(served, tid, {"paused"})
    assert paused["stop_reason"] == "stop_hook"
    # the state says paused a moment before the loop's last event is written (the state is saved first: the
    # archive that loop_finished's listeners make is a copy of it)
    finished = ws.wait_for(lambda: [e for e in ws.events(tid) if e["event"] == "loop_finished"], 30,
                           "the loop_finished event after the pause")
    assert finished[-1]["exit_code"] == 3
    assert "lunch" in (ws.root / ".hooks" / f"stop_autonomous_loop_{tid}.md").read_text()
    assert paused["steps_done"] == 2
    (ws.root / "gate_3").touch()
    (ws.root / "gate_4").touch()
    assert served.post(f"/api/loops/{tid}/resume").status_code == 202
    done = _wait_status(served, tid, {"completed"})
    assert done["steps_done"] == 4


def test_rest_bad_requests_answer_a_clear_error(ws: Workspace, served: Served) -> None:
    ws.task(shell_task(1))
    c = served.client()
    cases = [
        ("POST", "/api/loops", b"not json", 400, "not JSON"),
        ("POST", "/api/loops", b"[]", 400, "object"),
        ("POST", "/api/loops", b"{}", 400, "task"),
        ("POST", "/api/loops", json.dumps({"task": "Specs/nope.md"}).encode(), 404, "not found"),
        ("POST", "/api/loops", json.dumps({"task": "/etc/hostname"}).encode(), 400, "outside the workspace"),
        ("POST", "/api/loops", json.dumps({"task": "Specs/feature/tasks.md", "options": {"max_iters": 3}}).encode(),
         400, "max_iters"),
        ("POST", "/api/loops", json.dumps({"task": "Specs/feature/tasks.md", "extra": 1}).encode(), 400, "extra"),
        ("GET", "/api/loops/nope", b"", 404, "no loop"),
        ("GET", "/api/loops/..%2F..%2Fetc/progress", b"", 404, ""),
        ("POST", "/api/loops/nope/stop", b"{}", 404, "no loop"),
        ("POST", "/api/loops/nope/messages", b'{"content": "x"}', 404, "no loop"),
    ]
    for method, path, body, status, text in cases:
        r = c.request(method, path, content=body, headers=served.auth)
        assert r.status_code == status, (path, body, r.status_code, r.text)
        assert text in r.text, (path, r.text)
    print(f"bad requests tried: {len(cases)}, answered with the expected error: {len(cases)}")
    assert not list((ws.root / ".state").glob("autonomous_loop_*.json")), "no bad request started a loop"


# -- WebSocket ---------------------------------------------------------------------------------

def _ask(sock: ClientConnection, msg: dict[str, Any], events: list[dict[str, Any]] | None = None,
         updates: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Send one control message and return its answer; pushed loop events met meanwhile go to `events`."""
    sock.send(json.dumps(msg) if not isinstance(msg, str) else msg)
    while True:
        got = json.loads(sock.recv(60))
        if got["type"] == "loop_state_update":
            if updates is not None:
                updates.append(got)
            continue
        if got["type"] == "loop_event":
            if events is not None:
                events.append(got)
            continue
        return got  # type: ignore[no-any-return]


def _wait_event(sock: ClientConnection, events: list[dict[str, Any]], pred: Any,
                updates: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    updates = [] if updates is None else updates
    for e in events:
        if pred(e["event"]):
            return e
    while True:
        got = json.loads(sock.recv(60))
        if got["type"] == "loop_state_update":
            updates.append(got)
        if got["type"] == "loop_event":
            events.append(got)
            if pred(got["event"]):
                return got


def test_websocket_start_state_message_stop_resume_round_trips(ws: Workspace, served: Served) -> None:
    ws.task(shell_task(3, cmd=GATED))
    (ws.root / "gate_1").touch()
    events: list[dict[str, Any]] = []
    with connect(served.ws_url + f"?token={TOKEN}", open_timeout=10) as sock:
        assert json.loads(sock.recv(10))["type"] == "hello"
        started = _ask(sock, {"type": "loop_start_request", "task": "Specs/feature/tasks.md",
                              "options": {"max_iterations": 30}, "request_id": "r1"}, events)
        assert started["type"] == "loop_started" and started["request_id"] == "r1", started
        tid = started["task_id"]
        _wait_event(sock, events, lambda e: e["event"] == "step_completed")
        state = _ask(sock, {"type": "get_loop_state", "task_id": tid}, events)
        assert state["type"] == "loop_state" and state["status"] == "running" and state["state"]["max_iterations"] == 30
        msg = _ask(sock, {"type": "loop_message", "task_id": tid, "content": "hello loop"}, events)
        assert msg["type"] == "loop_message_queued" and msg["delivered"] is False
        assert "hello loop" in (ws.root / msg["inbox"]).read_text()
        stop = _ask(sock, {"type": "loop_stop_request", "task_id": tid, "reason": "from ws"}, events)
        assert stop["type"] == "loop_stop_requested", stop
        (ws.root / "gate_2").touch()
        fin = _wait_event(sock, events, lambda e: e["event"] == "loop_finished")
        assert fin["event"]["status"] == "paused" and fin["event"]["exit_code"] == 3
        ws.wait_for(lambda: not loops_alive(ws.root), what="the loop's process to end")
        state = _ask(sock, {"type": "get_loop_state", "task_id": tid}, events)
        assert state["status"] == "paused"
        (ws.root / "gate_3").touch()
        updates: list[dict[str, Any]] = []
        resumed = _ask(sock, {"type": "loop_resume_request", "task_id": tid}, events, updates)
        assert resumed["type"] == "loop_resumed", resumed
        fin2 = _wait_event(sock, events, lambda e: e["event"] == "loop_finished" and e["status"] == "completed",
                           updates)
        assert ("running", "completed") in [(u["previous"], u["state"]) for u in updates if u["task_id"] == tid]
        assert fin2["event"]["exit_code"] == 0
        ws.wait_for(lambda: not loops_alive(ws.root), what="the loop's process to end")
        assert _ask(sock, {"type": "get_loop_state", "task_id": tid}, events)["status"] == "completed"
    pushed = [e["event"] for e in events if e["task_id"] == tid]
    assert pushed == ws.events(tid), "the socket carried every event of the loop, once, in order"


def test_websocket_bad_messages_get_an_error_and_the_connection_stays(ws: Workspace, served: Served) -> None:
    ws.task(shell_task(1))
    assert ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "one").returncode == 0
    bad: list[Any] = [
        "not json", "[1, 2]", "42", '"text"', "{}", '{"type": 5}', '{"type": "launch_missiles"}',
        {"type": "get_loop_state"}, {"type": "get_loop_state", "task_id": "../../etc"},
        {"type": "get_loop_state", "task_id": "missing"}, {"type": "loop_start_request"},
        {"type": "loop_start_request", "task": "Specs/feature/tasks.md", "options": {"max_iterations": "many"}},
        {"type": "loop_start_request", "task": "Specs/feature/tasks.md", "options": "fast"},
        {"type": "loop_stop_request", "task_id": 7}, {"type": "loop_message", "task_id": "one"},
        {"type": "loop_message", "task_id": "one", "content": "   "}, {"type": "loop_resume_request", "task_id": "one"},
        "\u0000" * 10, "{" * 5000,
    ]
    held = 0
    with connect(served.ws_url + f"?token={TOKEN}", open_timeout=10) as sock:
        assert json.loads(sock.recv(10))["type"] == "hello"
        for msg in bad:
            answer = _ask(sock, msg if isinstance(msg, str) else json.dumps(msg))
            assert answer["type"] == "error" and answer["message"], (msg, answer)
            held += 1
        for frame in (b"\xff\xfe not utf-8", b"{}", json.dumps({"type": "get_loop_state"}).encode()):
            sock.send(frame)  # binary frames
            answer = json.loads(sock.recv(60))
            assert answer["type"] == "error", (frame, answer)
            held += 1
        ok = _ask(sock, {"type": "get_loop_state", "task_id": "one"})
        assert ok["type"] == "loop_state" and ok["status"] == "completed"
    print(f"malformed WebSocket messages tried: {len(bad) + 3} (3 as binary frames), answered with an error on a "
          f"live connection: {held}")


def test_serve_without_a_workspace_state_dir_still_starts(tmp_path: Any) -> None:
    root = tmp_path / "empty"
    root.mkdir()
    ws = Workspace(root)
    s = start_server(ws)
    try:
        assert s.get("/api/loops").json() == []
        assert httpx.get(s.base + "/healthz").json()["ok"] is True
    finally:
        s.stop()
    assert os.path.isdir(root / "Logs")


def _line(tid: str, n: int) -> str:
    return json.dumps({"ts": f"2026-11-22T08:00:{n:02d}.000+00:00", "task_id": tid, "iteration": n,
                       "event": "warning", "message": f"line {n}"}) + "\n"


def test_torn_and_broken_lines_are_skipped_and_a_completed_line_is_delivered(ws: Workspace, served: Served) -> None:
    log = ws.root / "Logs" / "hand.jsonl"
    stream = sse_stream(served)
    assert next(stream).event == "hello"
    whole, torn = _line("hand", 1), _line("hand", 2)
    log.write_text(whole + "this is not json\n" + "[1, 2]\n" + torn[:25])
    got = [next(stream)]
    assert got[0].json()["message"] == "line 1"
    with open(log, "a") as fh:  # the writer finishes its line, then writes another
        fh.write(torn[25:] + _line("hand", 3))
    got += [next(stream), next(stream)]
    stream.close()
    assert [e.json()["message"] for e in got] == ["line 1", "line 2", "line 3"]
    assert [e.id for e in got] == ["1", "2", "3"]


def test_two_servers_over_one_workspace_number_events_alike(ws: Workspace, served: Served) -> None:
    other = start_server(ws)
    try:
        s1, s2 = sse_stream(served, query="?after=0"), sse_stream(other, query="?after=0")
        assert next(s1).event == "hello" and next(s2).event == "hello"
        for tid in ("a", "b", "c"):
            with open(ws.root / "Logs" / f"{tid}.jsonl", "a") as fh:
                for n in range(5):
                    fh.write(_line(tid, n))
                    fh.flush()
        written = time.monotonic()
        one = [(e.id, e.data) for e in _collect_until(s1, lambda out: len(out) == 15)]
        two = [(e.id, e.data) for e in _collect_until(s2, lambda out: len(out) == 15)]
        late = time.monotonic() - written
        s1.close()
        s2.close()
    finally:
        other.stop()
    # at once on both: a server that read the events from the other's index without waking its clients sent
    # them with its next keepalive (KEEPALIVE_SECONDS, 15 s)
    assert late < 10, f"the events came {late:.1f} s after they were written"
    assert one == two
    assert [int(i) for i, _ in one] == list(range(1, 16))
    assert sorted(d for _, d in one) == sorted(_line(t, n).strip() for t in "abc" for n in range(5))


def test_a_replaced_log_is_read_again_from_the_top(ws: Workspace, served: Served) -> None:
    log = ws.root / "Logs" / "rot.jsonl"
    stream = sse_stream(served)
    assert next(stream).event == "hello"
    log.write_text(_line("rot", 1) + _line("rot", 2))
    first = [next(stream), next(stream)]
    log.write_text(_line("rot", 3))  # shorter than before: e.g. rotated
    third = next(stream)
    stream.close()
    assert [e.json()["message"] for e in [*first, third]] == ["line 1", "line 2", "line 3"]


def test_while_serving_dashboard_md_shows_a_killed_loop_as_interrupted(ws: Workspace, served: Served) -> None:
    ws.task(shell_task(3, cmd=GATED, title="Auth feature"))
    loop = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "doomed")
    dash = ws.root / "Dashboard.md"
    ws.wait_for(lambda: "🟢 RUNNING" in dash.read_text(), what="the loop to show as running")
    loop.kill()  # SIGKILL: the loop cannot write anything more
    loop.wait(10)
    text = ws.wait_for(lambda: "INTERRUPTED" in dash.read_text() and dash.read_text(), what="interrupted")
    assert "## Active Loops (0)" in text and "## Paused (1)" in text
    assert "🟠 INTERRUPTED (process" in text and "kiro loop resume --task-id doomed" in text
    assert ws.state("doomed")["status"] == "running", "the state file still says running: only the lock tells"


def test_rest_force_stop_ends_the_process_now(ws: Workspace, served: Served) -> None:
    ws.task(shell_task(2, cmd=GATED))
    loop = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "stuck")
    ws.wait_for(lambda: [e for e in ws.events("stuck") if e["event"] == "step_started"], what="step 1 to start")
    r = served.post("/api/loops/stuck/stop", {"force": True, "reason": "runaway"})
    assert r.status_code == 202 and r.json()["force"] is True, r.text
    assert loop.wait(30) == 3, ws.output(loop)  # no gate was ever opened: only the signal ended it
    st = served.get("/api/loops/stuck").json()
    assert st["status"] == "stopped" and st["effective_status"] == "stopped"
    assert not (ws.root / "gate_1").exists()


def test_a_taken_port_is_one_line_and_exit_1(ws: Workspace) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = ws.kiro("serve", "--port", str(port), env=ws.env(KIRO_SERVE_TOKEN=TOKEN), timeout=60)
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and f"127.0.0.1:{port}" in r.stderr and "in use" in r.stderr, r.stderr


def test_websocket_resumes_from_a_cursor(ws: Workspace, served: Served) -> None:
    (ws.root / "Logs" / "w.jsonl").write_text("".join(_line("w", n) for n in range(1, 6)))
    ws.wait_for(lambda: served.client().get("/healthz").json()["events"] == 5, what="indexed")
    with connect(served.ws_url + f"?token={TOKEN}&last_event_id=2", open_timeout=10) as sock:
        assert json.loads(sock.recv(10)) == {"type": "hello", "cursor": 2}
        got = [json.loads(sock.recv(10)) for _ in range(3)]
    assert [(m["type"], m["id"], m["event"]["message"]) for m in got] == [
        ("loop_event", 3, "line 3"), ("loop_event", 4, "line 4"), ("loop_event", 5, "line 5")]


def test_the_start_field_takes_a_kiro_specs_name(ws: Workspace, served: Served) -> None:
    """Issue #38 item 16: the dashboard's Start took a task file's path only; `kiro loop start --spec` takes a name."""
    ws.write(".kiro/specs/admin-orders/tasks.md", shell_task(1, cmd="echo orders >> orders.log"))
    r = served.post("/api/loops", {"task": "admin-orders"})
    print(r.status_code, r.text)
    assert r.status_code == 201, r.text
    assert r.json()["task_path"] == ".kiro/specs/admin-orders/tasks.md"
    ws.wait_for(lambda: (ws.root / "orders.log").exists(), what="the spec's step")
    missing = served.post("/api/loops", {"task": "no-such-spec"})
    assert missing.status_code == 404, missing.text
