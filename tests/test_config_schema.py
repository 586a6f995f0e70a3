"""`kiro config schema`: the JSON Schema editors check config/autonomous_loop.yaml with, made from the config
model. Every example config in the repository (the one `kiro init` writes, config/, each ```yaml block of the
README and docs/) is valid under it, and so is every task file's frontmatter under `--frontmatter`; a typo or a
wrong type is not; `kiro init` writes the schema beside the config and names it on the config's first line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from markdown_it import MarkdownIt

from kiro.store import config, frontmatter
from tests.conftest import Workspace

ROOT = Path(__file__).resolve().parent.parent


def schema_from_kiro(ws: Workspace, *args: str) -> dict[str, Any]:
    r = ws.run("config", "schema", *args)
    assert r.returncode == 0, r.stdout + r.stderr
    found: dict[str, Any] = json.loads(r.stdout)
    jsonschema.Draft202012Validator.check_schema(found)
    return found


def as_kiro_reads(text: str) -> Any:
    return yaml.load(text, Loader=config._loader())  # YAML 1.1, as kiro reads a config (`off` is false)


def fences(page: Path, info: str) -> list[tuple[str, str]]:
    return [(f"{page.relative_to(ROOT)}:{t.map[0] + 1 if t.map else 0}", t.content)
            for t in MarkdownIt("commonmark").parse(page.read_text(encoding="utf-8"))
            if t.type == "fence" and t.info.strip() == info]


def example_configs() -> list[tuple[str, Any]]:
    """Every config in the repository: the files, and each ```yaml block of the README and docs/ whose keys
    are config keys (the others are task frontmatter, checked below)."""
    found = [(name, as_kiro_reads((ROOT / name).read_text())) for name in
             ("kiro/default_config.yaml", "config/autonomous_loop.yaml")]
    keys = set(config.Config.model_fields) | {"agent_env"}
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for where, text in fences(page, "yaml"):
            data = as_kiro_reads(text)
            if isinstance(data, dict) and set(data) <= keys:
                found.append((where, data))
    return found


def example_frontmatters() -> list[tuple[str, dict[str, Any]]]:
    """The frontmatter of every task file in the repository: the bundled example, the 24 public Kiro files of
    tests/data/kiro-tasks/, and the task files the README and docs/ show."""
    files = [*sorted((ROOT / "kiro/examples").rglob("tasks.md")), *sorted((ROOT / "tests/data/kiro-tasks").glob("*"))]
    texts = [(str(p.relative_to(ROOT)), p.read_text(encoding="utf-8")) for p in files]
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        texts += fences(page, "markdown")
    return [(where, fm.data) for where, text in texts if (fm := frontmatter.read(text.lstrip("\ufeff"))).data]


def test_every_example_config_in_the_repository_is_valid_under_the_schema(ws: Workspace) -> None:
    validator = jsonschema.Draft202012Validator(schema_from_kiro(ws))
    examples = example_configs()
    held = 0
    for where, data in examples:
        errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(data)]
        config.Config.model_validate(data)  # and kiro itself takes it
        print(f"{where}: {'valid' if not errors else errors}")
        held += not errors
    assert len(examples) >= 6, examples
    assert held == len(examples)


def test_every_task_file_frontmatter_is_valid_under_the_frontmatter_schema(ws: Workspace) -> None:
    validator = jsonschema.Draft202012Validator(schema_from_kiro(ws, "--frontmatter"))
    examples = example_frontmatters()
    for where, data in examples:
        errors = [e.message for e in validator.iter_errors(data)]
        print(f"{where}: {sorted(data)} {'valid' if not errors else errors}")
        assert not errors, (where, errors)
    assert len(examples) >= 3, examples


def test_a_typo_or_a_wrong_type_is_what_the_schema_refuses(ws: Workspace) -> None:
    validator = jsonschema.Draft202012Validator(schema_from_kiro(ws))
    fm = jsonschema.Draft202012Validator(schema_from_kiro(ws, "--frontmatter"))
    for bad in ("max_iteration: 5\n", "autonomous_loop: {max_iterations: many}\n", "sandbox_network: wide\n",
                "parallel: 0\n", "guardrails: {active_hours: {start: '9am', end: '17:00'}}\n",
                "backend: {kind: temporal, heartbeat_seconds: 600}\n"):
        assert not validator.is_valid(as_kiro_reads(bad)), bad
    # YAML 1.1 spellings kiro reads are valid: `off` is false to PyYAML, a bare backend name is its kind
    for good in ("sandbox: off\n", "sandbox_network: on\n", "checkpoints: off\n", "backend: temporal\n",
                 "llm: {prices: {gpt-5: {input_per_1m: 1.25, output_per_1m: 10}}}\n"):
        assert validator.is_valid(as_kiro_reads(good)), good
    assert not fm.is_valid({"max_iterations": "many"}) and not fm.is_valid({"agent": "clade"})
    assert fm.is_valid({"my_own_key": 1, "schedule": {"every": "30m"}, "agent": "claude"})


def test_kiro_init_writes_the_schema_beside_the_config_and_names_it_on_the_first_line(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "fresh")
    ws.root.mkdir()
    r = ws.run("init", ".")
    assert r.returncode == 0, r.stdout + r.stderr
    text = (ws.root / "config/autonomous_loop.yaml").read_text()
    assert text.splitlines()[0] == "# yaml-language-server: $schema=autonomous_loop.schema.json"
    written = json.loads((ws.root / "config" / config.SCHEMA_FILE).read_text())
    assert written == schema_from_kiro(ws)
    described = written["$defs"]["LoopSettings"]["properties"]["max_iterations"]
    assert described["default"] == 100 and "iterations" in described["description"]


def test_config_show_says_where_each_value_came_from_and_shows_no_secret(ws: Workspace) -> None:
    secret = "sk-docs0123456789abcdefghij"
    ws.write("config/autonomous_loop.yaml", "autonomous_loop:\n  max_iterations: 7\n  failure_threshold: 2\n"
                                            f"agent: claude\nexecutor_command: my-agent --key {secret}\n")
    ws.task("---\nfailure_threshold: 4\n---\n- [ ] 1. a step\n", "Specs/x/tasks.md")
    r = ws.run("config", "show", "--json", "--task", "Specs/x/tasks.md", env=ws.env(KIRO_AGENT="codex"))
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {row["key"]: (row["value"], row["from"]) for row in json.loads(r.stdout)}
    print("\n".join(f"{k}: {v}" for k, v in rows.items() if v[1] != "default"))
    assert rows["autonomous_loop.max_iterations"] == (7, "config/autonomous_loop.yaml:2")
    assert rows["autonomous_loop.failure_threshold"] == (4, "Specs/x/tasks.md:2")  # the frontmatter wins
    assert rows["agent"] == ("codex", "environment KIRO_AGENT")  # and the environment over both
    assert rows["autonomous_loop.timeout_seconds"] == (43200.0, "default")
    assert secret not in r.stdout and "[REDACTED]" in rows["executor_command"][0]
    plain = ws.run("config", "show")
    assert plain.returncode == 0 and "(config/autonomous_loop.yaml:2)" in plain.stdout and secret not in plain.stdout
    missing = ws.run("config", "show", "--task", "Specs/none/tasks.md")
    assert missing.returncode == 1 and len(missing.stderr.strip().splitlines()) == 1, missing.stderr
    assert "Traceback" not in missing.stderr
