"""Every ```sh block of the docs runs, as printed: a guide that drifts from the code fails here.

The blocks of one page run in order, each with `bash -e -u -o pipefail`, in one fresh empty folder of their
own (a page is one session: a later block sees what an earlier one made), with the `kiro` of this checkout
first on PATH. What cannot run here (it needs a real subscription, a server left running, a second machine)
is a ```text block, which is shown and never run. The fences are found by a Markdown parser (markdown-it-py),
so a ```sh block inside a ````markdown example (a task file's step command) is the example's text, not a
command of the page.

A page that runs agents says which with a comment, `<!-- docs-test: codex claude=limited -->`: its blocks then
run with each real CLI pointed at its scripted server on 127.0.0.1 (tests/agent_clis.py: a model that checks the
box the prompt names), their homes outside /tmp (`cli_home`; HOME is the last one's); `=limited` answers every
call as the service does when a subscription's usage window is used up (tests/test_usage_limits.py). Without
the CLI installed the page is skipped, saying so.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from tests.agent_clis import CLIS, Cli
from tests.conftest import Workspace
from tests.test_usage_limits import env_of, limit_window

DOCS = Path(__file__).resolve().parent.parent / "docs"
SHELLS = ("sh", "bash", "shell")


def shell_blocks(page: Path) -> list[tuple[int, str]]:
    """(line, source) of each top-level ```sh block of a page."""
    tokens = MarkdownIt("commonmark").parse(page.read_text(encoding="utf-8"))
    return [(t.map[0] + 1 if t.map else 0, t.content) for t in tokens
            if t.type == "fence" and t.info.strip().split(" ")[0] in SHELLS]


PAGES = sorted(p for p in DOCS.rglob("*.md") if "_gen" not in p.parts and shell_blocks(p))


def test_the_guides_have_commands_to_run() -> None:
    """The suite below cannot pass by finding nothing: the first night's guide has blocks that run."""
    assert DOCS / "guides" / "first-night.md" in PAGES, [str(p) for p in PAGES]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_every_shell_block_of_the_page_runs(page: Path, tmp_path: Path, cli_home: Path) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    (tmp_path / "home").mkdir()
    env = Workspace(folder).env(
        PATH=f"{Path(sys.executable).parent}:{Workspace(folder).env()['PATH']}",
        HOME=str(tmp_path / "home"),
        GIT_AUTHOR_NAME="Docs", GIT_AUTHOR_EMAIL="docs@example.invalid",
        GIT_COMMITTER_NAME="Docs", GIT_COMMITTER_EMAIL="docs@example.invalid",
    )
    agents: list[Cli] = []
    marker = re.search(r"<!-- docs-test: ([^>]*?) -->", page.read_text(encoding="utf-8"))
    for word in marker[1].split() if marker else []:
        name, _, how = word.partition("=")
        (cli_home / name).mkdir()
        cli = CLIS[name](cli_home / name)
        if not cli.installed:
            pytest.skip(cli.skip_reason())
        cli.start()
        agents.append(cli)
        if how == "limited":
            limit_window(cli, 3600)
        env.update(env_of(cli))
    try:
        run_blocks(page, folder, env)
    finally:
        for cli in agents:
            cli.close()
    for cli in agents:
        print(f"{cli.name}: {cli.calls()} model calls answered by its scripted server")
        assert cli.calls() > 0


def run_blocks(page: Path, folder: Path, env: dict[str, str]) -> None:
    for line, source in shell_blocks(page):
        print(f"--- {page.relative_to(DOCS)}:{line}\n{source}")
        done = subprocess.run(["bash", "-e", "-u", "-o", "pipefail", "-c", source], cwd=folder, env=env,
                              capture_output=True, text=True, timeout=600)
        print(done.stdout + done.stderr)
        assert done.returncode == 0, (
            f"{page.relative_to(DOCS)}:{line}: the block exited {done.returncode}\n{done.stdout}{done.stderr}")


def test_the_site_s_set_up_commands_are_the_readme_s() -> None:
    """The two set-up commands are run from the README (```sh) and shown on the site's first page (```text, not
    run twice): the same bytes, so the site cannot drift from what the checks run."""
    def commands(page: Path, info: str) -> list[str]:
        tokens = MarkdownIt("commonmark").parse(page.read_text(encoding="utf-8"))
        return [t.content for t in tokens if t.type == "fence" and t.info.strip() == info]

    readme = commands(DOCS.parent / "README.md", "sh")[:2]
    assert len(readme) == 2 and all(command in commands(DOCS / "index.md", "text") for command in readme), readme
