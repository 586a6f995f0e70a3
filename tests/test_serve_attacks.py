"""`kiro serve` against what a hostile client or web page does: bad input, a stolen or blank token, a
foreign Host (DNS rebinding), a cross-origin WebSocket, clients that never finish their request. Each test
talks HTTP to a real `kiro serve` process, tells what it tried and how much held, then asserts all did."""

from __future__ import annotations

import json
import re
import selectors
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect
from websockets.typing import Origin

from tests.conftest import Workspace, shell_task
from tests.fake_openai import FakeOpenAI, call
from tests.serve_helpers import TOKEN, Served, start_server, stop_loops


@pytest.fixture
def served(ws: Workspace) -> Iterator[Served]:
    s = start_server(ws)
    yield s
    s.stop()
    stop_loops(ws.root)


def _port(served: Served) -> int:
    return int(served.base.rsplit(":", 1)[1])


def _raw(served: Served, request: bytes, timeout: float = 30) -> bytes:
    """Send a request as bytes and read the answer's head (the status line and headers)."""
    with socket.create_connection(("127.0.0.1", _port(served)), timeout=timeout) as s:
        s.sendall(request)
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        return got


def _status(head: bytes) -> int:
    m = re.match(rb"HTTP/1\.[01] (\d{3})", head)
    return int(m.group(1)) if m else 0


def _no_traceback(served: Served) -> bool:
    out = Workspace.output(served.proc)
    return "Traceback" not in out and "internal error" not in out.lower()


# -- bad input ---------------------------------------------------------------------------------

NESTED = '{"task": ' + "[" * 100_000 + "]" * 100_000 + "}"
LONG_PATH = "Specs/" + "a" * 5000 + "/tasks.md"


def test_bad_input_gets_a_4xx_json_error_never_a_traceback(ws: Workspace, served: Served) -> None:
    ws.task(shell_task(1))
    assert ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "one").returncode == 0
    c = served.client()
    rest: list[tuple[str, str, bytes]] = [
        ("POST", "/api/loops", NESTED.encode()),
        ("POST", "/api/loops/one/messages", ('{"content": ' + "[" * 50_000 + "]" * 50_000 + "}").encode()),
        ("POST", "/api/loops/one/stop", ("[" * 50_000 + "]" * 50_000).encode()),
        ("POST", "/api/loops", b'{"task": "Specs/\\ud800/tasks.md"}'),
        ("POST", "/api/loops/one/messages", b'{"content": "a lone \\ud800 surrogate"}'),
        ("POST", "/api/loops/one/stop", b'{"reason": "\\udfff"}'),
        ("POST", "/api/loops", json.dumps({"task": LONG_PATH}).encode()),
        ("POST", "/api/loops", json.dumps({"task": "a" * 5000}).encode()),
        ("POST", "/api/loops", json.dumps({"task": "Specs/feature\u0000/tasks.md"}).encode()),
        ("POST", "/api/loops", json.dumps({"task": "~nobody-such-user/tasks.md"}).encode()),
        ("GET", "/api/loops/" + "a" * 5000, b""),
        ("GET", "/api/loops/" + "a" * 5000 + "/events", b""),
        ("POST", "/api/loops/one/messages", b'{"content": "' + b"x" * 2_000_000 + b'"}'),
    ]
    tried = held = 0
    failed: list[Any] = []
    for method, path, body in rest:
        tried += 1
        try:
            r = c.request(method, path, content=body, headers=served.auth)
            ok = 400 <= r.status_code < 500 and r.headers.get("content-type") == "application/json" \
                and isinstance(r.json().get("error"), str)
            why = f"{r.status_code} {r.text[:200]}"
        except httpx.HTTPError as exc:  # the server dropped the connection
            ok, why = False, repr(exc)
        held += ok
        if not ok:
            failed.append((method, path[:60], body[:60], why))
    frames = [
        NESTED, json.dumps({"type": "loop_start_request", "task": LONG_PATH}),
        json.dumps({"type": "loop_start_request", "task": "a" * 5000}),
        '{"type": "loop_message", "task_id": "one", "content": "\\ud800"}', '{"type": "\\ud800"}',
        '{"type": "get_loop_state", "task_id": "\\udc00"}',
        json.dumps({"type": "get_loop_state", "task_id": "a" * 5000}),
    ]
    for frame in frames:  # each on its own connection: one frame must not cost the others theirs
        tried += 1
        try:
            with connect(served.ws_url + f"?token={TOKEN}", open_timeout=10, max_size=None) as sock:
                assert json.loads(sock.recv(10))["type"] == "hello"
                sock.send(frame)
                answer = json.loads(sock.recv(60))
                ok = answer.get("type") == "error" and "internal error" not in answer.get("message", "")
                sock.send(json.dumps({"type": "list_loops"}))
                ok = ok and json.loads(sock.recv(60)).get("type") == "loops"  # and the connection stays
        except Exception as exc:  # the server closed the connection, or answered garbage
            ok, answer = False, {"exception": repr(exc)[:200]}
        held += ok
        if not ok:
            failed.append((frame[:60], answer))
    tried += 1
    quiet = _no_traceback(served)
    held += quiet
    if not quiet:
        failed.append(("server output", Workspace.output(served.proc)[-600:]))
    print(f"bad inputs tried: {tried} ({len(rest)} REST, {len(frames)} WebSocket, 1 server log), held: {held}")
    assert held == tried, failed
    assert not list((ws.root / ".state").glob("autonomous_loop_*.json"))[1:], "no bad request started a loop"


# -- the token -----------------------------------------------------------------------------------

TWO_STEPS = "---\ntitle: Nightly tidy\n---\n- [ ] 1. Reformat the code\n- [ ] 2. Write the changelog\n"


def test_the_generated_token_reaches_no_inbox_and_no_prompt(ws: Workspace) -> None:
    ws.task(TWO_STEPS)
    with FakeOpenAI() as fake:
        ws.write("config/autonomous_loop.yaml",
                 f"executor: openai\nllm:\n  base_url: {fake.base_url}\n  model: fake-model\n  max_retries: 0\n"
                 f"autonomous_loop:\n  backoff_base_seconds: 0.01\n")
        fake.reply(call("sleep", {"seconds": 600, "reason": "waiting for a person's note"}))
        fake.reply(call("complete_step", {"summary": "done"}))
        fake.reply(call("complete_step", {"summary": "done"}))
        served = start_server(ws, token=None)  # the token is generated and printed
        try:
            token = served.token
            assert token and token != TOKEN
            proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "ai")
            fake.wait_for_requests(1, timeout=30)
            r = served.post("/api/loops/ai/messages", {"content": f"the server's token is {token}, use it"})
            assert r.status_code == 202, r.text
            inbox = "\n".join(p.read_text() for p in (ws.root / ".state/inbox").rglob("*") if p.is_file())
            assert proc.wait(timeout=60) == 0, ws.output(proc)
        finally:
            served.stop()
            stop_loops(ws.root)
        sent = json.dumps([req.messages for req in fake.chat_requests])
    checks = {"the inbox holds the message": "the server's token is" in inbox,
              "the inbox holds no token": token not in inbox,
              "the prompt carried the message": "the server's token is" in sent,
              "no prompt holds the token": token not in sent}
    print(f"token checks tried: {len(checks)}, held: {sum(checks.values())}")
    assert all(checks.values()), checks


def test_the_generated_token_typed_at_a_terminal_or_read_by_a_step_is_cut(ws: Workspace) -> None:
    """The generated token was cut only from what the server itself queued: `kiro loop tell` with the
    token (a person pasting it) put it in the inbox and the agent's prompt; a command line holding it
    (a task id, an extra argument) printed it back; a step that read `.state/serve.token` logged it
    (a boxed step no longer can: kiro.processes.sandbox hides `.state/serve/`).
    kiro knows the token from its file, as it knows `$KIRO_SERVE_TOKEN`."""
    ws.task(shell_task(1))
    served = start_server(ws, token=None)
    try:
        token = served.token
        assert token and token != TOKEN and (ws.root / ".state/serve/token").read_text().strip() == token
        ws.task(shell_task(1, cmd="cat .state/serve/token; echo \"token=$(cat .state/serve/token)\" >&2"),
                "Specs/reads/tasks.md")
        # with the box off: in it the token is out of reach (tests/test_seal_box.py); redaction is the rest
        ran = ws.kiro("loop", "start", "--task", "Specs/reads/tasks.md", "--task-id", "reads", "--sandbox", "off")
        assert ran.returncode == 0, ran.stdout + ran.stderr
        tries = {
            "kiro loop tell with the token": ws.run("loop", "tell", f"the server's token is {token}", "--task-id",
                                                     "reads"),
            "the token as a task id": ws.run("loop", "status", "--task-id", token),
            "the token as an extra argument": ws.run("loop", "status", token),
            "the token as a --token value": ws.run("loop", "stop", "--token", token),
            "a step that read the token file": ran,
        }
    finally:
        served.stop()
        stop_loops(ws.root)
    files = [p.relative_to(ws.root).as_posix() for p in ws.root.rglob("*")
             if p.is_file() and p.relative_to(ws.root).as_posix() != ".state/serve/token"
             and token.encode() in p.read_bytes()]
    held = 0
    for what, r in tries.items():
        ok = token not in r.stdout + r.stderr and "Traceback" not in r.stderr
        held += ok
        print(f"{'held' if ok else 'LEAKED'}: {what} -> exit {r.returncode}")
    inbox = "\n".join(p.read_text() for p in (ws.root / ".state/inbox").rglob("*") if p.is_file())
    print(f"files holding the token: {files}; generated-token checks: {held} of {len(tries)} held")
    assert "the server's token is [REDACTED]" in inbox
    assert held == len(tries) and files == []
    [done] = ws.state("reads")["completed_steps"]
    assert done["summary"] == "[REDACTED]\ntoken=[REDACTED]"  # the step's output is kept, cut


PLANTED = "acme-served-" + "8" * 20  # an environment value named like a token: a secret kiro knows of


def test_what_an_agent_writes_into_the_served_files_reaches_no_client_with_a_secret(ws: Workspace) -> None:
    """The server sent the event logs, the state and the task file as they are on disk. kiro writes no
    secret there, but an agent or a step may append to `Logs/<id>.jsonl` (an event with the environment's
    token in it) and the task file is the person's: the REST routes, the SSE stream and the WebSocket
    passed the token to every client. Everything sent is cut as `kiro loop logs` cuts what it prints."""
    ws.task(f"---\ntitle: t\n---\n- [ ] 1. Deploy with {PLANTED}\n  ```sh\n  true\n  ```\n"
            f"- [ ] 2. Then\n  ```sh\n  sleep 600\n  ```\n")
    served = start_server(ws, extra_env={"ACME_DEPLOY_TOKEN": PLANTED})
    try:
        proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "leak",
                        env=ws.env(ACME_DEPLOY_TOKEN=PLANTED))
        ws.wait_for(lambda: any(e["event"] == "step_completed" for e in ws.events("leak")), what="step 1 done")
        hostile = {"ts": "2026-11-27T00:00:00+00:00", "task_id": "leak", "event": "warning",
                   "message": f"the agent says {PLANTED}"}
        with open(ws.root / "Logs/leak.jsonl", "a") as fh:
            fh.write(json.dumps(hostile) + "\n")
        answers = {route: served.get(route).text for route in (
            "/api/loops", "/api/loops/leak", "/api/loops/leak/progress", "/api/loops/leak/events")}
        with httpx.stream("GET", f"{served.base}/api/events?after=0", headers=served.auth, timeout=30) as r:
            got = ""
            for chunk in r.iter_text():
                got += chunk
                if "the agent says" in got:
                    break
        answers["/api/events (SSE)"] = got
        with connect(f"{served.ws_url}?token={served.token}&last_event_id=0", open_timeout=10) as sock:
            frames = ""
            while "the agent says" not in frames:
                frames += str(sock.recv(timeout=30))
        answers["/api/ws"] = frames
    finally:
        served.stop()
        stop_loops(ws.root)
    assert proc.wait(timeout=60) is not None
    held = 0
    for route, text in answers.items():
        ok = PLANTED not in text
        held += ok
        print(f"{'held' if ok else 'LEAKED'}: {route}")
    print(f"served routes holding a planted secret: {len(answers) - held} of {len(answers)}")
    assert held == len(answers)
    assert all("the agent says [REDACTED]" in answers[r] for r in ("/api/loops/leak/events", "/api/events (SSE)",
                                                                   "/api/ws"))


def test_a_blank_token_is_refused_at_start(ws: Workspace) -> None:
    held = 0
    blanks = (" " * 16, "\t" * 20, " \n " * 8)
    for blank in blanks:
        proc = ws.spawn("serve", "--port", "0", env=ws.env(KIRO_SERVE_TOKEN=blank))
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # it started and serves with that token
            proc.kill()
            proc.wait(10)
            code = None
        out = ws.output(proc)
        if code == 1 and "KIRO_SERVE_TOKEN" in out and "Traceback" not in out and len(out.strip().splitlines()) == 1:
            held += 1
    print(f"blank tokens tried: {len(blanks)}, refused with one line and exit 1: {held}")
    assert held == len(blanks)


# -- Host and Origin -----------------------------------------------------------------------------

ROUTES = [
    ("GET", "/healthz"), ("GET", "/"), ("GET", "/api/info"), ("GET", "/api/loops"), ("GET", "/api/loops/x"),
    ("GET", "/api/loops/x/progress"), ("GET", "/api/loops/x/events?after=0"), ("GET", "/api/events"),
    ("POST", "/api/loops"), ("POST", "/api/loops/x/stop"), ("POST", "/api/loops/x/resume"),
    ("POST", "/api/loops/x/messages"), ("GET", "/nope"),
]
WS_UPGRADE = ("GET /api/ws?token={token} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{more}\r\n")


def test_a_foreign_host_is_refused_on_every_route(served: Served) -> None:
    c = served.client()
    tried = held = 0
    port = _port(served)
    for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1.evil.example:{port}", ""):
        for method, path in ROUTES:
            tried += 1
            try:
                r = c.request(method, path, headers={**served.auth, "Host": host},
                              json={} if method == "POST" else None, timeout=httpx.Timeout(10.0))
                held += r.status_code in (400, 403)
            except httpx.ReadTimeout:  # the route answered: an event stream
                pass
        tried += 1
        head = _raw(served, WS_UPGRADE.format(token=TOKEN, host=host, more="").encode())
        held += _status(head) in (400, 403)
    print(f"requests with a foreign Host tried: {tried}, refused: {held}")
    assert held == tried
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost"):  # the server's own names still work
        assert c.get("/healthz", headers={"Host": host}).status_code == 200
        assert c.get("/api/loops", headers={**served.auth, "Host": host}).status_code == 200


def test_allow_host_admits_a_name_the_person_gives(ws: Workspace) -> None:
    proc = ws.spawn("serve", "--port", "0", "--allow-host", "kiro.test", env=ws.env(KIRO_SERVE_TOKEN=TOKEN))
    try:
        started = ws.wait_for(lambda: re.search(r"kiro serve: (http://127\.0\.0\.1:\d+)/", ws.output(proc)),
                              what="the server to start")
        base = started.group(1)
        with httpx.Client(base_url=base, timeout=30) as c:
            assert c.get("/healthz", headers={"Host": "kiro.test:80"}).status_code == 200
            r = c.get("/api/loops", headers={"Host": "kiro.test", "Authorization": f"Bearer {TOKEN}"})
            assert r.status_code == 200
            assert c.get("/healthz", headers={"Host": "other.test"}).status_code == 403
    finally:
        proc.terminate()
        proc.wait(10)
    assert "--allow-host" in ws.kiro("serve", "--help").stdout


def test_a_cross_origin_websocket_or_post_with_the_token_is_refused(ws: Workspace, served: Served) -> None:
    c = served.client()
    tried = held = 0
    port = _port(served)
    foreign = ("http://evil.example", f"http://evil.example:{port}", "null", f"http://localhost:{port + 1}",
               f"https://127.0.0.1:{port}.evil.example")
    for origin in foreign:
        tried += 1
        try:
            with connect(served.ws_url + f"?token={TOKEN}", origin=Origin(origin), open_timeout=10) as sock:
                sock.recv(10)
        except InvalidStatus as exc:
            held += exc.response.status_code == 403
        for method, path in ROUTES:
            if method != "POST":
                continue
            tried += 1
            r = c.post(path, json={}, headers={**served.auth, "Origin": origin})
            held += r.status_code == 403
    print(f"cross-origin requests with the token tried: {tried}, refused with 403: {held}")
    assert held == tried
    # the server's own page (same origin) still opens the socket and posts
    with connect(served.ws_url + f"?token={TOKEN}", origin=Origin(served.base), open_timeout=10) as sock:
        assert json.loads(sock.recv(10))["type"] == "hello"
    r = c.post("/api/loops", json={}, headers={**served.auth, "Origin": served.base})
    assert r.status_code == 400 and "task" in r.json()["error"]


# -- slow clients --------------------------------------------------------------------------------

def test_clients_that_never_finish_their_request_are_dropped_while_others_are_served(served: Served) -> None:
    port = _port(served)
    slow: list[socket.socket] = []
    partial = [b"", b"G", b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n",
               f"POST /api/loops HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
               f"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"task\"".encode()]
    for i in range(120):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(partial[i % len(partial)])
        slow.append(s)
    c = served.client()
    for _ in range(10):  # others are served meanwhile
        assert c.get("/api/loops", headers=served.auth).status_code == 200
    sel = selectors.DefaultSelector()
    for s in slow:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    closed = 0
    deadline = time.monotonic() + 60  # the server's bound is 10 s; this only ends the test when it has none
    while sel.get_map() and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=1):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(65536)
            except ConnectionError:
                data = b""
            if not data:
                sel.unregister(sock)
                closed += 1
    for s in slow:
        s.close()
    print(f"slow clients tried: {len(slow)}, dropped by the server: {closed}")
    assert closed == len(slow)
    assert c.get("/api/loops", headers=served.auth).status_code == 200
