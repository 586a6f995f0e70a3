"""The box reaches nothing of the person's machine it was not given (issue #39 items 3, 8, 9; SPEC §15).

A real `kiro serve` runs over the workspace with a generated token; beside it the test runs a TCP
service on the host's 127.0.0.1 and a listener on an abstract unix socket. A boxed step (real bwrap,
a shell step, and a hostile "agent" given as `executor_command`) then tries, the way a prompt injection
would, each class of attack:

- **serve token**: read `kiro serve`'s token where kiro keeps it (`.state/serve.token`, `.state/serve/`);
- **serve**: reach the server on 127.0.0.1 and start a planted task with `POST /api/loops`;
- **host TCP**: connect to the test's own service on 127.0.0.1 (a database, say);
- **abstract socket**: connect to an abstract unix socket of the host (D-Bus, X11, a dev server);
- **secrets**: read `AWS_SECRET_ACCESS_KEY` / `GITHUB_TOKEN` from kiro's environment;
- **RAM**: fill `/tmp`, `/dev/shm` and `$HOME` (RAM) past any sane size, write into `/dev`.

Each attack is judged by its effect outside the box (the service's own count of connections, the
loops kiro has, the file the step left), never by what the step says; the test prints, per class,
what was tried and how many held.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiro.processes import sandbox
from tests.conftest import Workspace
from tests.serve_helpers import start_server, stop_loops

pytestmark = pytest.mark.skipif(sandbox.unusable() is not None, reason=f"no usable bwrap: {sandbox.unusable()}")

CANARY_AWS = "seal-canary-aws-" + uuid.uuid4().hex
CANARY_GH = "ghp_" + uuid.uuid4().hex  # shaped like a GitHub token
FILL_MB = 1100  # more than a box's RAM folder may hold (kiro.processes.sandbox.TMPFS_BYTES: 1 GiB at most)

# Run by the step in the project directory; each attack leaves what it got in a file, `|| true` lets it go on.
PROBE = r'''
import json, os, socket, sys, urllib.request
port, tcp_port, abstract = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
got = {}
token = ""
for path in (".state/serve.token", ".state/serve/token"):
    try:
        token = open(path).read().strip() or token
    except OSError:
        pass
got["token"] = token
try:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/loops", method="POST",
                                 data=json.dumps({"task": "Specs/planted/tasks.md",
                                                  "options": {"task_id": "planted"}}).encode(),
                                 headers={"Authorization": f"Bearer {token or 'none'}",
                                          "Content-Type": "application/json"})
    got["serve"] = urllib.request.urlopen(req, timeout=10).status
except urllib.error.HTTPError as exc:
    got["serve"] = exc.code
except OSError as exc:
    got["serve"] = str(exc)
try:
    with socket.create_connection(("127.0.0.1", tcp_port), timeout=10) as s:
        s.sendall(b"hello from the box\n")
    got["tcp"] = "connected"
except OSError as exc:
    got["tcp"] = str(exc)
try:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect("\0" + abstract)
        s.sendall(b"hello from the box\n")
    got["abstract"] = "connected"
except OSError as exc:
    got["abstract"] = str(exc)
got["env"] = dict(os.environ)
json.dump(got, open(sys.argv[4], "w"))
'''

FILL = f"""
for where in /tmp "$HOME" /dev/shm; do
    head -c {FILL_MB}M /dev/zero > "$where/fill" 2>/dev/null || true
    echo "$where $(stat -c %s "$where/fill" 2>/dev/null || echo 0)" >> filled
    rm -f "$where/fill"
done
echo x > /dev/kiro-seal 2>/dev/null && echo "/dev written" >> filled || true
"""


class Listener:
    """A service of the host that counts who reached it: TCP on 127.0.0.1, or an abstract unix socket."""

    def __init__(self, family: int, address: str | tuple[str, int]) -> None:
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind(address)
        self.sock.listen(16)
        self.reached = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.reached += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def services() -> Iterator[tuple[Listener, Listener, str]]:
    tcp = Listener(socket.AF_INET, ("127.0.0.1", 0))
    name = f"kiro-seal-{uuid.uuid4().hex[:12]}"
    abstract = Listener(socket.AF_UNIX, "\0" + name)
    yield tcp, abstract, name
    tcp.close()
    abstract.close()


def _step(cmd: str) -> str:
    return f"---\ntitle: Attack\nexecutor: shell\n---\n- [ ] 1. Attack\n  ```sh\n  {cmd}\n  ```\n"


def test_a_boxed_step_reaches_nothing_of_the_machine_it_was_not_given(
        ws: Workspace, tmp_path: Path, services: tuple[Listener, Listener, str]) -> None:
    tcp, abstract, name = services
    (ws.root / "probe.py").write_text(PROBE)  # in the project: the box's /tmp is its own
    ws.task(_step("touch planted-ran"), "Specs/planted/tasks.md")  # what a boxed step would start through serve
    served = start_server(ws, token=None)
    results: dict[str, dict[str, bool]] = {}
    try:
        port = int(served.base.rsplit(":", 1)[1])
        secrets = {"AWS_SECRET_ACCESS_KEY": CANARY_AWS, "GITHUB_TOKEN": CANARY_GH}
        env = ws.env(HOME=str(tmp_path / "home"), **secrets)
        (tmp_path / "home").mkdir()
        # a shell step, and a hostile agent CLI (`executor_command`: a script kiro knows nothing of)
        agent = tmp_path / "agent.sh"
        agent.write_text(f"#!/bin/sh\ncat > /dev/null\npython3 probe.py {port} "
                         f"{tcp.sock.getsockname()[1]} {name} agent.json\n")
        agent.chmod(0o755)
        ws.task(_step(f"python3 probe.py {port} {tcp.sock.getsockname()[1]} {name} shell.json"
                      f"\n  {FILL.strip().replace(chr(10), chr(10) + '  ')}"), "Specs/shell/tasks.md")
        ws.task("---\ntitle: Agent\n---\n- [ ] 1. Attack\n", "Specs/agent/tasks.md")
        r = ws.kiro("loop", "start", "--task", "Specs/shell/tasks.md", "--task-id", "shell", env=env, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        print(r.stderr.strip().splitlines()[0:3])
        r = ws.kiro("loop", "start", "--task", "Specs/agent/tasks.md", "--task-id", "agent", "--executor", "command",
                    env={**env, "KIRO_EXECUTOR_COMMAND": str(agent)}, timeout=300)
        print(r.stderr.strip().splitlines()[0:4])
        token = served.token
        planted = (ws.root / ".state" / "autonomous_loop_planted.json").exists() or \
            (ws.root / "planted-ran").exists()
        for who in ("shell", "agent"):
            got = json.loads((ws.root / f"{who}.json").read_text())
            seen = json.dumps(got["env"])
            results[who] = {
                "serve token read": token not in got["token"],
                "serve reached (POST /api/loops)": not isinstance(got["serve"], int),
                "planted task started through serve": not planted,
                "host 127.0.0.1 TCP service": got["tcp"] != "connected",
                "abstract unix socket": got["abstract"] != "connected",
                "AWS_SECRET_ACCESS_KEY": CANARY_AWS not in seen,
                "GITHUB_TOKEN": CANARY_GH not in seen,
            }
        filled = dict(line.rsplit(" ", 1) for line in (ws.root / "filled").read_text().splitlines()
                      if " " in line and not line.startswith("/dev written"))
        cap = FILL_MB << 20
        results["RAM"] = {f"fill {where} with {FILL_MB} MiB": int(size) < cap for where, size in filled.items()}
        results["RAM"]["write into /dev"] = "/dev written" not in (ws.root / "filled").read_text()
    finally:
        served.stop()
        stop_loops(ws.root)
    # judged outside the box too: the host's services counted who reached them
    results["host services"] = {"TCP service accepted nobody": tcp.reached == 0,
                                "abstract socket accepted nobody": abstract.reached == 0}
    tried = held = 0
    for group, checks in results.items():
        for what, ok in checks.items():
            tried += 1
            held += ok
            print(f"{'held' if ok else 'BROKEN'}: {group}: {what}")
    print(f"attacks tried: {tried}, held: {held}")
    assert held == tried, results


def test_the_step_start_line_names_the_network_and_what_an_agent_was_not_given(ws: Workspace,
                                                                               tmp_path: Path) -> None:
    """The person sees at start what the box reaches (its own network, the model endpoint's port) and
    which of their variables an agent CLI does not get."""
    home = tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    ws.task("---\ntitle: Plan\n---\n- [ ] 1. One\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "claude").write_text("#!/bin/sh\ncat >/dev/null\nexit 1\n")
    (bin_dir / "claude").chmod(0o755)
    env = ws.env(HOME=str(home), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", AWS_SECRET_ACCESS_KEY=CANARY_AWS,
                 ANTHROPIC_BASE_URL="http://127.0.0.1:43211", ANTHROPIC_API_KEY="sk-ant-seal-test-key-0000")
    ws.write("config/autonomous_loop.yaml", "autonomous_loop:\n  failure_threshold: 1\n")
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--agent", "claude", env=env, timeout=120)
    said = r.stdout + r.stderr
    print(said)
    assert "network: its own (pasta)" in said or "pasta is not installed" in said
    if sandbox.pasta_path():
        assert "127.0.0.1:43211 (the model endpoint)" in said
    assert "withheld from it" in said and "AWS_SECRET_ACCESS_KEY" in said and CANARY_AWS not in said


def test_a_refused_second_serve_leaves_the_running_servers_token(ws: Workspace) -> None:
    """Issue #38 item 7: a second `kiro serve` on the port the first one holds is refused, and the token
    the first one printed and kept still opens it (a refused start used to rewrite the kept token)."""
    served = start_server(ws, token=None)
    try:
        kept = [p for p in (ws.root / ".state/serve/token", ws.root / ".state/serve.token") if p.exists()]
        before = kept[0].read_text()
        port = served.base.rsplit(":", 1)[1]
        second = ws.kiro("serve", "--port", port, timeout=60)
        print(f"second serve: exit {second.returncode}: {second.stderr.strip()}")
        assert second.returncode == 1 and "cannot listen" in second.stderr, second.stdout + second.stderr
        assert kept[0].read_text() == before, "the refused server rewrote the running server's token"
        assert served.get("/api/loops").status_code == 200  # the kept token still opens the running server
    finally:
        served.stop()
