"""Secrets never reach a file kiro writes, nor the model (issue #7, item 3 a-c).

Each test plants a canary secret where a real one would be (an environment variable named like
a token, the API key, a password in `llm.base_url`, a bearer token in an `on_event` command),
makes it flow through a step's output, verify's output, an agent CLI's output and the retry
prompt, and then reads every file under the workspace: the canary is in none of them.
"""

from __future__ import annotations

import json
import shlex
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from kiro.store.config import Config
from kiro.store.redact import REDACTED, Redactor
from tests.conftest import FAST_CONFIG, Workspace, shell_task
from tests.fake_openai import FakeOpenAI, call

TASK = "Specs/feature/tasks.md"


def canary(prefix: str = "canary") -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def files_holding(root: Path, secret: str) -> list[str]:
    """Every file under root whose bytes contain the secret, except the config the person wrote."""
    needle = secret.encode()
    found = []
    for p in sorted(root.rglob("*")):
        if p == root / "config" / "autonomous_loop.yaml":
            continue
        if p.is_file() and not p.is_symlink() and needle in p.read_bytes():
            found.append(str(p.relative_to(root)))
    return found


def test_canary_from_a_shell_step_and_verify_output_is_in_no_file(ws: Workspace) -> None:
    secret = canary()
    # Step 1 prints the token and fails once; verify prints it too and fails the first time.
    ws.task(textwrap.dedent("""\
        ---
        title: Leaky
        executor: shell
        verify: 'echo "verify sees $ACME_SERVICE_TOKEN"; test -e attempt2'
        ---
        - [ ] 1. Print the token
          ```sh
          echo "token is $ACME_SERVICE_TOKEN"; if [ -e attempt1 ]; then touch attempt2; else touch attempt1; exit 1; fi
          ```
        - [ ] 2. Print it again and succeed
          ```sh
          echo "again $ACME_SERVICE_TOKEN"
          ```
        """))
    # the person's grant: a shell step and verify get no secret-shaped variable of kiro's environment otherwise
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "agent_env: {pass: [ACME_SERVICE_TOKEN]}\n")
    r = ws.kiro("loop", "start", "--task", TASK, env=ws.env(ACME_SERVICE_TOKEN=secret))
    assert r.returncode == 0, r.stdout + r.stderr
    assert secret not in r.stdout + r.stderr
    assert files_holding(ws.root, secret) == []
    tid = ws.only_task_id()
    st = ws.state(tid)
    # It was really there: the failure was recorded, with the token cut.
    assert any(f"token is {REDACTED}" in f["error"] for f in st["failed_steps"])
    assert any(e["event"] == "step_failed" and REDACTED in e["error"] for e in ws.events(tid))


def test_agent_cli_output_and_retry_prompt_carry_no_canary(ws: Workspace, tmp_path: Path) -> None:
    secret = canary("sk-proj")
    seen = tmp_path / "seen"  # outside the workspace: what the agent was sent
    seen.mkdir()
    agent = tmp_path / "agent.py"
    agent.write_text(textwrap.dedent(f"""\
        import os, pathlib, re, sys
        seen = pathlib.Path({str(seen)!r})
        step, attempt = os.environ["KIRO_STEP_ID"], os.environ["KIRO_ATTEMPT"]
        (seen / f"prompt_{{step}}_{{attempt}}.txt").write_text(sys.stdin.read())
        print("my key is", os.environ["OPENAI_API_KEY"])
        if attempt == "1":
            sys.exit(2)
        if attempt == "3":
            pathlib.Path("ok").touch()
        task = pathlib.Path(os.environ["KIRO_TASK_FILE"])
        task.write_text(re.sub(r"- \\[[ -]\\] " + step + r"\\.", "- [x] " + step + ".", task.read_text(), count=1))
        """))
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(agent))}"
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + f"executor_command: {json.dumps(command)}\n"
             "verify: 'echo \"verify: $OPENAI_API_KEY\"; test -e ok'\n"
             f"sandbox_paths: {{rw: [{json.dumps(str(seen))}]}}\n"  # the step's box may write `seen`
             "agent_env: {pass: [OPENAI_API_KEY]}\n")  # the person's grant: a bare command gets no secret otherwise
    ws.task("---\ntitle: Agent\nexecutor: command\n---\n- [ ] 1. Do the thing\n")
    r = ws.kiro("loop", "start", "--task", TASK, "--failure-threshold", "5",
                env=ws.env(OPENAI_API_KEY=secret))
    # attempt 1: the agent exits 2; attempt 2: box checked, verify fails; attempt 3: verify passes
    assert r.returncode == 0, r.stdout + r.stderr
    assert secret not in r.stdout + r.stderr
    assert files_holding(ws.root, secret) == []
    prompts = sorted(seen.iterdir())
    assert len(prompts) >= 2
    retry = (seen / "prompt_1_2.txt").read_text()
    assert "my key is" in retry and REDACTED in retry  # the previous error is quoted, without the key
    assert all(secret not in p.read_text() for p in prompts)
    third = seen / "prompt_1_3.txt"
    assert third.exists() and "verify: " + REDACTED in third.read_text()


def test_password_in_base_url_and_openai_key_reach_no_file(ws: Workspace) -> None:
    password = canary("pw")
    key = canary("sk-live")
    with FakeOpenAI() as fake:
        fake.reply(tool_calls=[call("write_file", {"path": "notes.txt", "content": "hello"})])
        fake.reply(tool_calls=[call("complete_step", {"summary": "wrote notes"})])
        url = fake.base_url.replace("http://", f"http://kiro:{password}@")
        ws.write("config/autonomous_loop.yaml", FAST_CONFIG + f"llm:\n  base_url: {json.dumps(url)}\n")
        ws.task("---\ntitle: Model\nexecutor: openai\n---\n- [ ] 1. Write notes\n")
        r = ws.kiro("loop", "start", "--task", TASK, env=ws.env(OPENAI_API_KEY=key))
        assert r.returncode == 0, r.stdout + r.stderr
        assert len(fake.chat_requests) == 2
    assert (ws.root / "notes.txt").read_text() == "hello"
    for secret in (password, key):
        assert secret not in r.stdout + r.stderr
        assert files_holding(ws.root, secret) == []
    transcript = next((ws.root / ".state" / "transcripts").glob("*.jsonl")).read_text()
    assert f"kiro:{REDACTED}@" in transcript or "[REDACTED]" in transcript


def test_on_event_command_text_and_output_are_not_logged(ws: Workspace) -> None:
    token = canary("tok")
    notifier = f"echo 'Authorization: Bearer {token}'; exit 3"
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + f"on_event:\n  finished: {json.dumps(notifier)}\n")
    ws.task(shell_task(1))
    r = ws.kiro("loop", "start", "--task", TASK)
    assert r.returncode == 0, r.stdout + r.stderr
    tid = ws.only_task_id()
    failed = [e for e in ws.events(tid) if e["event"] == "notifier_failed"]
    assert len(failed) == 1 and "exit status 3" in failed[0]["error"] and REDACTED in failed[0]["error"]
    assert files_holding(ws.root, token) == []


def test_redactor_knows_env_names_formats_urls_commands_and_configured_names() -> None:
    env = {
        "GITHUB_TOKEN": "ghp_" + "a" * 36,
        "INNOCENT_NAME": "sk-" + "b" * 40,  # an OpenAI-style key under a harmless name
        "DATABASE_URL": "postgres://app:db-pass-123@db/app",
        "MY_LLM": "x-key-value-1234",  # named by llm.api_key_env
        "CUSTOM": "custom-secret-value",  # named by secret_env
        "SHORT_KEY": "abc",  # too short to redact
        "HOME": "/root",
    }
    cfg = Config.model_validate({
        "llm": {"api_key_env": "MY_LLM", "base_url": "https://user:hunter2@proxy.example/v1?api_key=qk-999999999"},
        "secret_env": ["CUSTOM"],
        "on_event": {"failed": "curl -H 'Authorization: Bearer bt-77777777' --password=pp-88888888 x"},
    })
    r = Redactor.for_run(cfg, env)
    text = " | ".join([*env.values(), "user:hunter2@proxy", "qk-999999999", "bt-77777777", "pp-88888888",
                       json.dumps("sk-" + "b" * 40)])
    out = r.text(text)
    for leaked in ("ghp_", "sk-bbb", "db-pass-123", "x-key-value", "custom-secret", "hunter2", "qk-999",
                   "bt-777", "pp-888"):
        assert leaked not in out, (leaked, out)
    assert "abc" in out and "/root" in out  # short values and ordinary ones stay
    assert r.data({"a": ["ghp_" + "a" * 36, 3]}) == {"a": [REDACTED, 3]}


# The credential formats as one pattern each, spelled as before the formats were split into the text each starts
# with and the pattern of the rest (kiro.store.redact._FORMATS): what is a token must not change.
_FORMATS_BEFORE = (r"sk-[A-Za-z0-9_\-]{16,}+", r"sk_(?:live|test)_[A-Za-z0-9]{16,}+", r"gh[pousr]_[A-Za-z0-9]{20,}+",
                   r"github_pat_[A-Za-z0-9_]{20,}+", r"xox[abposr]-[A-Za-z0-9\-]{10,}+", r"AKIA[0-9A-Z]{16}",
                   r"glpat-[A-Za-z0-9_\-]{16,}+", r"AIza[0-9A-Za-z_\-]{30,}+",
                   r"eyJ[A-Za-z0-9_\-]{8,}+\.[A-Za-z0-9_\-]{8,}+\.[A-Za-z0-9_\-]{8,}+")


def test_a_token_is_what_the_credential_formats_match_and_text_without_their_starts_is_not_searched() -> None:
    import re

    from kiro.store import redact

    whole = re.compile(r"^(?:" + "|".join(_FORMATS_BEFORE) + r")$")
    words = re.compile(r"(?<![A-Za-z0-9_\-])(?:" + "|".join(_FORMATS_BEFORE) + r")(?![A-Za-z0-9_\-])")
    tokens = ["sk-" + "a1_-" * 5, "sk_live_" + "A1" * 8, "sk_test_" + "z" * 16, "github_pat_" + "a_" * 10,
              "xoxb-" + "1-" * 5, "AKIA" + "A1" * 8, "glpat-" + "x" * 16, "AIza" + "-_a" * 10,
              "eyJ" + "a" * 8 + "." + "b" * 8 + "." + "c" * 8, *(f"gh{kind}_" + "a1" * 10 for kind in "pousrx")]
    values = [*tokens, *(t[:-1] for t in tokens), *(" " + t + "\n" for t in tokens), *(t + "!" for t in tokens),
              "sk_live_short", "AKIA" + "a" * 16, "eyJ.x.y", "through", "-sk-" + "a" * 20, "", "ghp_"]
    texts = [*values, *(f"key={t}, then x{t} and ({t}) -{t} {t}_ {t}." for t in tokens), "loop t1 completed",
             "Bearer " + tokens[0] + "\n" + tokens[-2] + " " + tokens[3], "loop task_20261130_2255 (disk-1, sk_x)"]
    for value in values:
        assert redact.looks_like_token(value) == bool(whole.match(value.strip())), value
    assert sum(map(redact.looks_like_token, values)) > len(tokens)  # (not a list of non-tokens only)
    for text in texts:
        found = words.findall(text)
        own = redact.written_in(text)
        assert (own is None) == (not found), text
        assert own is None or own.text(text) == Redactor(found).text(text), text


def test_the_run_redactor_made_once_for_many_loops_still_learns_a_new_secret() -> None:
    """Loops of one config in one environment share one redactor (1,000 loops started together);
    a secret added to the environment or the config since is known to the next loop's."""
    cfg = Config.model_validate({"secret_env": ["CUSTOM"]})
    env = {"CUSTOM": "custom-secret-value-1"}
    first = Redactor.for_run(cfg, env)
    assert Redactor.for_run(cfg, dict(env)) is first  # the same facts: the same redactor
    later = Redactor.for_run(cfg, {**env, "GITHUB_TOKEN": "ghp_" + "c" * 36})
    assert REDACTED == later.text("ghp_" + "c" * 36)
    cfg.secret_env.append("OTHER")
    other = Redactor.for_run(cfg, {**env, "OTHER": "other-secret-value-2"})
    assert other.text("custom-secret-value-1 other-secret-value-2") == f"{REDACTED} {REDACTED}"
    assert first.text("other-secret-value-2") == "other-secret-value-2"


def test_the_run_redactor_learns_a_secret_set_in_this_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = Config()
    before = Redactor.for_run(cfg)
    assert Redactor.for_run(cfg) is before
    monkeypatch.setenv("DEPLOY_TOKEN", "deploy-token-value-3")
    assert Redactor.for_run(cfg).text("deploy-token-value-3") == REDACTED
    monkeypatch.delenv("DEPLOY_TOKEN")
    assert Redactor.for_run(cfg).text("deploy-token-value-3") == "deploy-token-value-3"


def test_a_failing_step_leaks_nothing_into_the_escalation_or_progress_reports(ws: Workspace) -> None:
    secret = canary("sk-fail")
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "  progress_report_every_n_iterations: 1\n"
             "agent_env: {pass: [DEPLOY_SECRET]}\n")  # the person's grant: the shell step prints the secret
    ws.task(shell_task(1, cmd='echo "bad $DEPLOY_SECRET"; exit 1'))
    r = ws.kiro("loop", "start", "--task", TASK, "--failure-threshold", "2", env=ws.env(DEPLOY_SECRET=secret))
    assert r.returncode == 5, r.stdout + r.stderr
    tid = ws.only_task_id()
    escalation = (ws.root / "Needs_Action" / f"escalation_{tid}.md").read_text()
    assert f"bad {REDACTED}" in escalation
    assert list((ws.root / "Logs" / "progress_reports").glob("*.md"))
    assert files_holding(ws.root, secret) == []
    assert secret not in r.stdout + r.stderr


def test_the_union_of_two_redactors_cuts_what_either_cuts() -> None:
    a = Redactor(["secret-aaaa-1111"], ["user:pw@"])
    b = Redactor(["secret-bbbb-2222"])
    both = a | b
    assert both.text("secret-aaaa-1111 secret-bbbb-2222 user:pw@host") == f"{REDACTED} {REDACTED} {REDACTED}host"
    assert (both | a) is both and (a | both) is both  # nothing new: no new pattern per attempt
    assert (a | None) is a and (Redactor() | a) is a


def test_an_event_record_is_dumped_once_and_its_line_is_clean(tmp_path: Path) -> None:
    """`Redactor.record` hands back the JSON it searched when it found no secret, and the event log
    writes that line as is; a record that holds a secret (in a value or a key) is redacted, and the
    log writes the redacted record."""
    from kiro.store.events import EventLog
    from kiro.store.logread import read_events

    r = Redactor(["tok-123456789"])
    record = {"event": "step_failed", "error": "é ok", "n": 3}
    same, line = r.record(record)
    assert same is record and line is not None and json.loads(line) == record
    dirty = {"event": "step_failed", "error": "used tok-123456789", "tok-123456789": 1}
    clean, none = r.record(dirty)
    assert none is None and clean == {"event": "step_failed", "error": f"used {REDACTED}", REDACTED: 1}
    assert Redactor().record(dirty) == (dirty, None)  # nothing to look for: nothing dumped
    log = EventLog(tmp_path / "log.jsonl", r)
    log.append_record(record, clean_json=line)
    log.append_record(clean)
    log.close()
    assert list(read_events(tmp_path / "log.jsonl")) == [record, clean]
    assert "tok-123456789" not in (tmp_path / "log.jsonl").read_text()


def test_a_secret_in_the_task_title_reaches_no_summary_nor_state(ws: Workspace) -> None:
    """A known secret in the title (the task file is the person's: kiro leaves it as written) is cut
    from every file kiro writes: the state, and the summary `status` reads, also once the loop is
    archived (its summary was made from the state before the redactor saw it)."""
    secret = canary("sk")
    ws.task(f"---\ntitle: Deploy with {secret}\nexecutor: shell\n---\n- [ ] 1. Quick\n  ```sh\n  true\n  ```\n",
            rel="Specs/keyed/tasks.md")
    r = ws.kiro("loop", "start", "--task", "Specs/keyed/tasks.md", "--task-id", "keyed",
                env=ws.env(ACME_DEPLOY_TOKEN=secret))
    assert r.returncode == 0, r.stdout + r.stderr
    assert files_holding(ws.root, secret) == ["Done/keyed/tasks.md"]
    [summary] = (ws.root / ".state").rglob("autonomous_loop_keyed.summary")
    assert f"Deploy with {REDACTED}".encode() in summary.read_bytes()


def test_a_secret_set_between_two_loops_of_one_process_reaches_neither_step(
        ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step's environment without kiro's secrets is worked out once per environment, not per step (issue
    #41); what changes in kiro's environment after the first loop reaches the second loop's steps as it
    is: a plain variable's new value, not the first one's; a secret set meanwhile (a token an embedding program
    sets) is still kept from them, and given where `agent_env.pass` grants it."""
    import asyncio

    from kiro.core.runner import prepare_start, run_loops
    from kiro.store.workspace import Workspace as Ws

    first, second = canary("first"), canary("second")
    monkeypatch.setenv("ACME_API_TOKEN", first)
    monkeypatch.setenv("ACME_PLAIN", "plain")
    cmd = 'echo "$KIRO_TASK_ID ${ACME_API_TOKEN:-none} ${LATER_SECRET_KEY:-none} $ACME_PLAIN" >> env.txt'
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "sandbox: off\n")
    ws.task(shell_task(2, cmd=cmd), "Specs/one/tasks.md")
    ws.task(shell_task(2, cmd=cmd), "Specs/two/tasks.md")
    [done] = asyncio.run(run_loops([prepare_start(Ws(ws.root), "Specs/one/tasks.md", task_id="one")]))
    assert done.exit_code == 0
    monkeypatch.setenv("LATER_SECRET_KEY", second)
    monkeypatch.setenv("ACME_PLAIN", "changed")
    [done] = asyncio.run(run_loops([prepare_start(Ws(ws.root), "Specs/two/tasks.md", task_id="two")]))
    assert done.exit_code == 0
    seen = (ws.root / "env.txt").read_text().splitlines()
    print("what the steps saw:", seen)
    assert seen == ["one none none plain"] * 2 + ["two none none changed"] * 2
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "sandbox: off\nagent_env: {pass: [LATER_SECRET_KEY]}\n")
    ws.task(shell_task(1, cmd=cmd), "Specs/three/tasks.md")
    [done] = asyncio.run(run_loops([prepare_start(Ws(ws.root), "Specs/three/tasks.md", task_id="three")]))
    assert done.exit_code == 0
    assert (ws.root / "env.txt").read_text().splitlines()[-1] == f"three none {second} changed"
