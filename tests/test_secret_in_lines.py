"""Secrets kiro knows of, planted where the lines it prints for a person echo them (issue #27 item 3):
a password in `llm.base_url` with an endpoint answering 401, 403 and 404, the same URL with no API key,
an `executor_command` holding a token that cannot be split into words, and a config error that echoes a
secret value. Each runs in the foreground and with `--detach` (whose lines go to `Logs/<id>.out`); its
stdout, stderr, those of `kiro loop status` and `kiro loop logs` afterwards, and every file of the
workspace (but the person's config) are searched for the secret.
The test prints what was tried and how many held; before 2026-11-27 the outcome line and the config
error printed them (10 leaks, 6 into files).

And the redactor's scans are linear in their input (item 12): a 1 MB value is scanned and cut at once
(an 80 KB `executor_command` once made `kiro loop status` take 15 s).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import cli_inprocess
from tests.conftest import Workspace

PASSWORD = "pw-planted-" + "7" * 12
TOKEN = "planted-opaque-" + "4" * 16  # in no well-known format: known only from where the config puts it
ENV_SECRET = "acme-planted-" + "5" * 16
TASK = "---\ntitle: t\n---\n- [ ] 1. one\n"


def _url(port: int) -> str:
    return f"http://kiro:{PASSWORD}@127.0.0.1:{port}/v1"


def _files_holding(root: Path, secret: str) -> list[str]:
    return [p.relative_to(root).as_posix() for p in sorted(root.rglob("*"))
            if p.is_file() and p.relative_to(root).as_posix() != "config/autonomous_loop.yaml"
            and secret.encode() in p.read_bytes()]


def _try(ws: Workspace, secret: str, *, detach: bool, env: dict[str, str]) -> tuple[list[str], bool]:
    """Run one loop: where the secret was found (stdout, stderr, files), and whether its lines showed
    the secret's place cut (the message that echoes it was printed)."""
    tid = "bg" if detach else "fg"
    r = ws.kiro("loop", "start", "--task", "Specs/s/tasks.md", "--task-id", tid, *(["--detach"] if detach else []),
                env=env)
    out = ws.root / "Logs" / f"{tid}.out"
    if detach and r.returncode == 0:
        ws.wait_for(lambda: f"{tid}: " in out.read_text(), what="the loop's last line")
    printed = r.stdout + r.stderr + (out.read_text() if out.exists() else "")
    found = [where for where, text in (("stdout", r.stdout), ("stderr", r.stderr)) if secret in text]
    for read in (("loop", "status"), ("loop", "logs", "--task-id", tid)):  # and what a person reads afterwards
        shown = ws.run(*read, env=env)
        found += [" ".join(read)] if secret in shown.stdout + shown.stderr else []
    return found + _files_holding(ws.root, secret), "[REDACTED]" in printed


def _cases(port: int) -> list[tuple[str, str, str, dict[str, str]]]:
    """(what, config, secret, environment)."""
    key = {"OPENAI_API_KEY": "k" * 12}
    return [
        *[(f"password in llm.base_url, endpoint answers {status}",
           f"executor: openai\nllm:\n  base_url: {_url(port)}\n  max_retries: 0\n", PASSWORD, key)
          for status in (401, 403, 404)],
        ("password in llm.base_url, no API key",
         f"executor: openai\nllm:\n  base_url: http://kiro:{PASSWORD}@llm.invalid/v1\n"  # not local: a key is needed
         "  api_key_env: KIRO_TEST_NO_SUCH_KEY\n", PASSWORD, {}),
        ("executor_command --token that cannot be split",
         f"executor: command\nexecutor_command: {json.dumps(f'agent --token {TOKEN} ' + chr(39))}\n", TOKEN, {}),
        ("config error echoing a secret value",
         f"executor: command\nllm:\n  max_retries: {ENV_SECRET}\n", ENV_SECRET,
         {"ACME_DEPLOY_TOKEN": ENV_SECRET}),
    ]


def test_no_line_kiro_prints_in_the_foreground_or_detached_echoes_a_known_secret(tmp_path: Path) -> None:
    from tests.conftest import FAST_CONFIG
    from tests.fake_openai import FakeOpenAI

    tried, leaks = 0, []
    with FakeOpenAI() as fake:
        for n, (what, config, secret, extra) in enumerate(_cases(fake.port)):
            for detach in (False, True):
                status = (401, 403, 404)[n] if n < 3 else 200
                fake.responder = lambda body, status=status: {"status": status, "message": f"fake error {status}"}
                root = tmp_path / f"case{n}{'d' if detach else 'f'}" / "vault"
                for name in ("Specs", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
                    (root / name).mkdir(parents=True)
                ws = Workspace(root)
                ws.write("config/autonomous_loop.yaml", FAST_CONFIG + config)
                ws.task(TASK, rel="Specs/s/tasks.md")
                found, cut = _try(ws, secret, detach=detach, env=ws.env(**extra))
                tried += 1
                assert cut or found, f"{what}: the message that echoes the secret was not printed"
                if found:
                    leaks.append(f"{what} ({'detached' if detach else 'foreground'}): {', '.join(found)}")
    print(f"tried {tried} (6 plantings, foreground and detached): {tried - len(leaks)} held; leaks: {leaks}")
    assert leaks == []


@pytest.mark.timeout(60)
def test_a_one_megabyte_value_is_scanned_and_cut_in_linear_time() -> None:
    """Values that made the old scans quadratic or worse (a run of scheme characters with no `://`, a run of
    dashes, `token` repeated), 1 MB each, in a command and the environment: the scans end, and the
    credential after them is still found and cut."""
    from kiro.store.redact import Redactor, command_secrets, url_secrets

    size = 1_000_000
    for filler in ("a" * size, "-" * size, "token" * (size // 5), "a@" * (size // 2), "ab:/" * (size // 4)):
        value = f"{filler} --token {TOKEN} https://kiro:{PASSWORD}@example.com/"
        assert TOKEN in command_secrets(value) and PASSWORD in url_secrets(value)[0]
        redactor = Redactor.from_environment(None, {"ACME_HOOK": value, "ACME_DEPLOY_TOKEN": ENV_SECRET})
        assert PASSWORD not in redactor.text(value) and redactor.text(ENV_SECRET) == "[REDACTED]"


FORMAT_TOKEN = "sk-ant-planted" + "6" * 20  # a credential format: known as secret wherever it is written
USAGE_ERRORS = [  # (what, arguments): each a complaint of the command line's parser that quotes what was typed
    ("an unknown option that is a token", ("loop", "start", "-t", "x", f"--{FORMAT_TOKEN}")),
    ("an unknown option with a token value", ("loop", "status", f"--{FORMAT_TOKEN}=1")),
    ("an extra argument that is a token", ("loop", "start", "-t", "x", FORMAT_TOKEN)),
    ("an extra argument that is the environment's key", ("loop", "status", ENV_SECRET)),
    ("a bad value that is a token", ("loop", "start", "-t", "x", "--max-iterations", FORMAT_TOKEN)),
    ("a bad value that is the environment's key", ("serve", "--port", ENV_SECRET)),
    ("an unknown command that is a token", ("loop", FORMAT_TOKEN)),
    ("a token after an unknown --token", ("loop", "stop", "--token", TOKEN, "--password", TOKEN)),
]


def test_a_usage_error_is_one_line_without_the_secret_it_quotes(ws: Workspace) -> None:
    """Typer printed its parser's complaints in a box of several lines (exit 2), quoting what was typed
    as it was: a token typed as an option, an extra argument or a bad value reached the terminal. A
    usage error is now one line through the redactor, exit 1 (SPEC §6: 1 for bad input)."""
    env = ws.env(OPENAI_API_KEY=ENV_SECRET)
    held = 0
    for what, args in USAGE_ERRORS:
        r = (ws.kiro if cli_inprocess.needs_a_process(args) else ws.run)(*args, env=env)
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        leaked = [s for s in (FORMAT_TOKEN, ENV_SECRET, TOKEN) if s in r.stdout + r.stderr]
        ok = r.returncode == 1 and len(lines) == 1 and lines[0].startswith("kiro: ") and not leaked
        held += ok
        print(f"{'held' if ok else 'LEAKED' if leaked else 'FAILED'}: {what} -> exit {r.returncode}, "
              f"{len(lines)} line(s): {lines[:1]}")
    print(f"usage errors: {held} of {len(USAGE_ERRORS)} held")
    assert held == len(USAGE_ERRORS)
    r = ws.run("loop", "rollback", "--task-id", "x")
    assert r.returncode == 1 and r.stderr.startswith("kiro: Missing option '--to-step'; `"), r.stderr
    assert r.stderr.endswith(" loop rollback -h` shows the usage\n"), r.stderr


def _holding(root: Path, secret: str) -> list[str]:
    """Files of the workspace whose name or bytes hold `secret` (the task files are the person's)."""
    return [p.relative_to(root).as_posix() for p in sorted(root.rglob("*"))
            if secret in p.name or (p.is_file() and "tasks.md" not in p.name and secret.encode() in p.read_bytes())]


def test_a_secret_a_person_types_or_a_task_file_holds_reaches_no_file_or_line(ws: Workspace) -> None:
    """Three ways past the redactor found on 06884f8: `loop stop --reason` wrote the reason into the hook
    file as typed; `loop progress` printed the task file's step titles as they are (a step naming a
    token); and a `--task-id` holding a secret was cut inside the loop's own state file, which then named
    another id and could not be read again (the loop was lost). Now the reason is cut, the progress view
    is cleaned, and such an id is refused in one line before anything is made."""
    env = ws.env(ACME_DEPLOY_TOKEN=ENV_SECRET, COLUMNS="300")  # wide: no line folded in the secret's middle
    ws.write("Specs/s/tasks.md", f"---\ntitle: t\nexecutor: shell\n---\n- [ ] 1. Deploy with {ENV_SECRET}\n"
             f"  ```sh\n  exit 1\n  ```\n")
    ran = ws.kiro("loop", "start", "--task", "Specs/s/tasks.md", "--task-id", "s", "--failure-threshold", "1",
                  env=env)
    assert ran.returncode == 5, ran.stdout + ran.stderr
    ws.write("Specs/o/tasks.md", "---\ntitle: o\nexecutor: shell\n---\n- [ ] 1. One\n  ```sh\n  true\n  ```\n")
    tries = {
        "stop --reason": ws.run("loop", "stop", "--task-id", "s", "--reason", f"rotating {ENV_SECRET}", env=env),
        "progress": ws.run("loop", "progress", "--task-id", "s", env=env),
        "start --task-id <secret>": ws.kiro("loop", "start", "--task", "Specs/o/tasks.md", "--task-id",
                                            f"x-{ENV_SECRET}", env=env),
        "start --detach --task-id <secret>": ws.kiro("loop", "start", "--task", "Specs/o/tasks.md", "--detach",
                                                     "--task-id", ENV_SECRET, env=env),
    }
    held = 0
    for what, r in tries.items():
        ok = ENV_SECRET not in r.stdout + r.stderr and "Traceback" not in r.stderr
        held += ok
        print(f"{'held' if ok else 'LEAKED'}: {what} -> exit {r.returncode}")
    files = _holding(ws.root, ENV_SECRET)
    print(f"typed or written secrets: {held} of {len(tries)} commands held; files holding it: {files}")
    assert held == len(tries) and files == []
    assert "rotating [REDACTED]" in (ws.root / ".hooks/stop_autonomous_loop_s.md").read_text()
    assert "Deploy with [REDACTED]" in tries["progress"].stdout
    for what in ("start --task-id <secret>", "start --detach --task-id <secret>"):
        r = tries[what]
        assert r.returncode == 1 and "holds a secret kiro knows of" in r.stderr, (what, r.stdout, r.stderr)
    assert ws.run("loop", "status", "--json", env=env).stdout.count('"task_id"') == 1  # only the loop `s`


@pytest.mark.parametrize("written", [
    'executor_command: [my-agent, --token, "{t}"]',
    'executor_command: {{run: my-agent, auth: "Bearer {t}"}}',
    'verify: [curl, -H, "Authorization: Bearer {t}", http://x]',
], ids=["list", "mapping", "verify-list"])
def test_a_refused_command_in_the_config_is_quoted_without_its_credential(ws: Workspace, written: str) -> None:
    """A command written as a list or a mapping is refused (it must be one line); the error quotes the value,
    and before this it quoted the token too."""
    ws.task(TASK)
    ws.write("config/autonomous_loop.yaml", written.format(t=TOKEN) + "\n")
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "config/autonomous_loop.yaml" in r.stderr, r.stderr
    assert TOKEN not in r.stdout + r.stderr, r.stderr
    assert TOKEN[:12] not in r.stdout + r.stderr, r.stderr  # no clipped half either
