"""kiro.plainyaml reads and writes the plain YAML of kiro's own files without PyYAML (issue #12).

Whatever it accepts it must read as PyYAML reads it (kiro's config loader, and the C safe loader a
task's frontmatter is read with) and write as libyaml writes it; whatever it is unsure of it leaves to
PyYAML. Generated documents mix the plain cases with the traps of YAML 1.1 (`on`, `012`, `1:30`,
`.5`, `a #b`, quotes, tabs, repeated keys, odd indents), and every one is compared.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from kiro import config, plainyaml
from kiro.errors import ConfigError

KEYS = ["title", "executor", "max_iterations", "llm", "model", "on", "yes", "Null", "gpt-4.1", "a-b", "_x",
        "x.y", "1a", "key", "a", "b"]
SCALARS = ["word", "Add login page", "a  b", "yes", "Yes", "yES", "on", "OFF", "y", "n", "null", "Null", "nUll", "~",
           "true", "FALSE", "0", "00", "012", "-0", "-5", "5", "+5", "1_000", "0x1F", "0o7", "1:30", "1.5", "1.",
           "-0.5", ".5", ".inf", "inf", "nan", "2026-01-01", "a # c", "a#c", "a, b", "(x)", "x.", ".", "..", "./src",
           "../x", '"q # r"', "'s'", "'it''s'", '"a\\"b"', '"é"', "é", "[a, b]", "[]", "[a,]", "[ a , 3 ]",
           '["x, y"]', "[--no-git]", "{}", "{a: 1}", "- x", "&a x", "*a", "!!str 5", "|", "a: b", "-x", "e5",
           "0.1e5", "12345678901234567890123", "gpt-4o-mini", "pytest -q", "notify-send done", '"pytest -q"',
           "# only a comment", "", "x\t", '"\x85"', "'\x07'", "http://127.0.0.1:8080/v1", "https://api.openai.com/v1",
           "http://x:", "http://x::", "http://a b", "http://x/#y", "http://x/a#b", "[http://x]", "mailto:x@y",
           "http://[::1]:8080/v1", "http://x?a=1&b=2", "h://x:80", "n://x", "on://x", "0://x", "http://x,y", "http://x'",
           "s3://b/k", "git+ssh://g@h:r.git", "http://x/%20", "http://x:8080/ #c", "http://x/{a}", "a-b://x"]


def _document(rng: random.Random) -> str:
    lines: list[str] = []
    indents = [0]
    for _ in range(rng.randint(1, 9)):
        roll = rng.random()
        if roll < 0.08:
            lines.append(rng.choice(["", "# a comment", "   # indented comment", "\t", "---", "- item"]))
            continue
        if roll < 0.25 and len(indents) < 4:  # open a mapping
            lines.append(" " * indents[-1] + rng.choice(KEYS) + ":" + rng.choice(["", "", " # c", "  "]))
            indents.append(indents[-1] + rng.choice([2, 2, 4, 1]))
            continue
        if roll < 0.35 and len(indents) > 1:
            indents.pop()
        indent = indents[-1] + (rng.choice([0, 0, 0, 1, -1]) if rng.random() < 0.1 else 0)
        value = rng.choice(SCALARS)
        comment = rng.choice(["", "", "", "  # why", " #no"])
        lines.append(" " * max(indent, 0) + rng.choice(KEYS) + ": " + value + comment)
    end = rng.choice(["\n", "\n", "", "\r\n"])
    return end.join(lines) + end


def _config_pyyaml(text: str) -> tuple[dict[str, Any], dict[str, int]] | None:
    """What kiro's config loader made of `text` with PyYAML (plainyaml bypassed), or None if it refused it."""
    real = plainyaml.load
    plainyaml.load = lambda _text: None  # type: ignore[assignment]
    try:
        return config._parse_config(text.encode(), "c.yaml")
    except ConfigError:
        return None
    finally:
        plainyaml.load = real  # type: ignore[assignment]


def _frontmatter_pyyaml(text: str) -> Any:
    try:
        return yaml.load(text, Loader=yaml.CSafeLoader)
    except yaml.YAMLError:
        return "refused"


def test_what_it_reads_it_reads_as_pyyaml_does() -> None:
    rng = random.Random(20261126)
    read = left = 0
    for _ in range(8000):
        text = _document(rng)
        got = plainyaml.load(text)
        if got is None:
            left += 1
            continue
        read += 1
        assert _config_pyyaml(text) == got, text
        assert (_frontmatter_pyyaml(text) or {}) == got[0], text
    print(f"8000 generated documents: {read} read without PyYAML, each as PyYAML reads it; {left} left to PyYAML")
    assert read > 600 and left > 600  # both ways exercised


def test_kiros_own_files_are_read_without_pyyaml() -> None:
    """The commented defaults `kiro init` writes, and the frontmatter of the corpus's task files."""
    text = config.default_config_yaml()
    assert plainyaml.load(text) == config._parse_config(text.encode(), "c.yaml") == _config_pyyaml(text)
    corpus = Path(__file__).resolve().parent.parent.parent / "shared/corpus/kiro-tasks"
    plain = total = 0
    for path in sorted(corpus.rglob("*.md")) if corpus.is_dir() else []:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        if not lines or lines[0].rstrip() != "---":
            continue
        close = next((i for i in range(1, len(lines)) if lines[i].rstrip() in ("---", "...")), None)
        if close is None:
            continue
        total += 1
        body = "\n".join(lines[1:close])
        got = plainyaml.load(body)
        if got is not None:
            plain += 1
            assert (_frontmatter_pyyaml(body) or {}) == got[0], path
    print(f"corpus frontmatter read without PyYAML: {plain} of {total}")


def test_what_it_writes_it_writes_as_libyaml_does() -> None:
    values = [None, True, False, 0, -5, 10**20, 1.5, 0.1, 1e20, 1e-7, float("inf"), "", "a", "yes", "Off", "null",
              "~", "x y", "dashboard", "2026-11-26T19:40:00.123+00:00", "2026-11-26", "123", "1.5", "0x1F", "a:b",
              "a: b", "a #b", "a#b", "-x", "x-", "a.b", "(x)", "x/y", "a+b", "é", "it's", "a,b", "a b ", " a", ".",
              "e5", "1_000", "12:30", "x" * 200, "a  b", "Specs/a/tasks.md", "<<", "=", "+1", "1e5", ".5",
              "Add login page (v2) - part/two", "x" * 70 + " y", "A " * 40]
    rng = random.Random(7)
    written = left = 0
    for _ in range(3000):
        data = {k: rng.choice(values) for k in rng.sample(["type", "created", "title", "a", "b_c", "on"], 3)}
        for width in (80, 1000):
            text = plainyaml.dump(data, sort_keys=False, width=width)
            if text is None:
                left += 1
                continue
            written += 1
            assert text == yaml.dump(data, Dumper=yaml.CSafeDumper, sort_keys=False, allow_unicode=True,
                                     default_flow_style=False, width=width), data
    print(f"6000 mappings: {written} written without PyYAML, as libyaml writes them; {left} left to PyYAML")
    assert written > 500 and left > 1000


def test_a_plain_start_imports_no_pyyaml(tmp_path: Path) -> None:
    """A workspace whose config and task frontmatter are plain runs a loop with no PyYAML to import."""
    shadow = tmp_path / "shadow" / "yaml"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('PyYAML imported on a plain start')\n")
    root = tmp_path / "vault"
    (root / "Specs/a").mkdir(parents=True)
    steps = "- [ ] 1. One\n  ```sh\n  true\n  ```\n- [ ] 2. Two\n  ```sh\n  true\n  ```\n"
    (root / "Specs/a/tasks.md").write_text("---\ntitle: Two steps\nexecutor: shell\nmax_iterations: 5\n---\n" + steps)
    (root / "config").mkdir()
    (root / "config/autonomous_loop.yaml").write_text(
        "# mine\nautonomous_loop:\n  failure_threshold: 2  # fewer\nllm:\n  model: gpt-4o-mini\n"
        "  base_url: http://127.0.0.1:8080/v1  # a server of my own\nverify:\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow.parent), *sys.path]), "KIRO_WORKSPACE": str(root)}
    r = subprocess.run([sys.executable, "-m", "kiro", "loop", "start", "--task", "Specs/a/tasks.md"], cwd=root,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (root / "Done/a/tasks.md").read_text().count("- [x]") == 2
    assert (root / "Dashboard.md").read_text().startswith("---\ntype: dashboard\ncreated: '")


def test_a_url_is_read_as_pyyaml_reads_it() -> None:
    """`base_url: http://...` is in nearly every config that names a server: read without PyYAML
    (it cost a start PyYAML's import and two parses), and as PyYAML reads it."""
    urls = ["http://127.0.0.1:8080/v1", "https://api.openai.com/v1", "s3://b/k", "git+ssh://g@h:r.git",
            "http://x?a=1&b=2", "http://x/%20", "on://x", "n://x", "http://x'"]
    for url in urls:
        text = f"llm:\n  base_url: {url}\n"
        got = plainyaml.load(text)
        assert got is not None and got[0] == {"llm": {"base_url": url}} == _config_pyyaml(text)[0], url
    for doubtful in ["http://x:", "[http://x]", "http://x/a#b", "http://[::1]:80/v1", "http://x,y"]:
        assert plainyaml.load(f"u: {doubtful}\n") is None, doubtful
