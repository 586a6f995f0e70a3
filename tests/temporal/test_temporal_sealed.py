"""What kiro sends a Temporal server is sealed (kiro.temporal.codec): a loop runs on a real dev server with a real
`kiro worker`, its task text and its config's `llm.base_url` password each carrying a canary, and then the
workflows' histories are read back through the server, as anyone with access to it would (the SDK's
fetch_history, no key): no canary is in them, in any event's bytes."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

from temporalio.client import Client

from tests.conftest import Workspace, shell_task
from tests.temporal.conftest import Project, TemporalServer, Workers

TASK_CANARY = "TASKCANARY-5d1e9b"
PASSWORD_CANARY = "PWCANARY-83c2aa"


async def _histories(address: str, prefix: str) -> dict[str, bytes]:
    """Every workflow of this workspace (its ids start with `prefix`): its whole history, as the server keeps it."""
    client = await Client.connect(address)  # no kiro codec: what anyone reading the server gets
    found = {}
    async for wf in client.list_workflows():
        if wf.id.startswith(prefix):
            history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
            found[wf.id] = b"".join(event.SerializeToString() for event in history.events)
    return found


def test_no_task_text_nor_config_password_reaches_the_servers_history_in_clear(
        tws: Workspace, project: Project, workers: Workers, temporal_server: TemporalServer) -> None:
    config = tws.root / "config" / "autonomous_loop.yaml"
    config.write_text(config.read_text() + f"llm:\n  base_url: http://kiro:{PASSWORD_CANARY}@127.0.0.1:9/v1\n")
    workers.start_workspace()
    workers.start("w1")
    tws.task(shell_task(2, cmd='echo "step $KIRO_STEP_ID" >> work.txt').replace(
        "# Plan\n", f"# Plan\n\nNotes: {TASK_CANARY}\n"))
    assert TASK_CANARY in (tws.root / "Specs/feature/tasks.md").read_text()
    r = tws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "sealed", timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert tws.state("sealed")["total_successes"] == 2
    wsid = (tws.root / ".state" / "workspace_id").read_text().strip()
    histories = asyncio.run(_histories(temporal_server.address, f"kiro.{wsid}."))
    steps = [w for w in histories if ".step." in w]
    assert len(histories) >= 3 and steps, sorted(histories)  # the loop and each step's workflow
    leaks = [(w, c) for w, data in histories.items() for c in (TASK_CANARY, PASSWORD_CANARY) if c.encode() in data]
    print(f"{len(histories)} workflow histories read through the server ({len(steps)} steps), "
          f"{sum(map(len, histories.values()))} bytes: canaries found {len(leaks)} {leaks}")
    assert not leaks
    from kiro.temporal import codec

    assert codec.ENCODING in b"".join(histories.values())  # kiro's sealed payloads are what the server holds
    key = codec.key_file()
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and not key.is_relative_to(tws.root)
    print(f"the key: {key} (0600, outside the project, under the $HOME kiro's box hides)")

def test_the_key_is_private_and_a_payload_sealed_with_another_key_says_so(tmp_path: Path) -> None:
    from temporalio.api.common.v1 import Payload

    from kiro.temporal import codec

    key = codec.load_key(tmp_path / "kiro" / "temporal.key")
    assert stat.S_IMODE((tmp_path / "kiro" / "temporal.key").stat().st_mode) == 0o600
    assert codec.load_key(tmp_path / "kiro" / "temporal.key") == key  # made once, then kept
    mine, other = codec.SealedPayloads(key), codec.SealedPayloads(os.urandom(32))
    plain = Payload(metadata={"encoding": b"json/plain"}, data=b'{"task_text": "secret"}')
    sealed = asyncio.run(mine.encode([plain]))
    assert b"secret" not in sealed[0].SerializeToString()
    assert asyncio.run(mine.decode(sealed)) == [plain]
    try:
        asyncio.run(other.decode(sealed))
    except ValueError as exc:
        assert "another kiro key" in str(exc)
    else:
        raise AssertionError("a payload sealed with another key was opened")
