"""What a review (SPEC §14 `review:`) costs per step: seconds and tokens, with the real CLIs against the scripted
API servers of the tests (tests/fakes).

    python bench/review.py [--steps 3]

Claude Code does a task of N steps (each: write a file, check its box: 4 model calls) in a fresh git project,
three ways: no review; `review: {agent: codex}` (the real Codex CLI, whose fake model approves at once: 1 model
call); `review: {command: ...}` (a Python script that reads the prompt and approves). Prints, per way: wall
seconds per step (kiro loop start to exit, over N), the loop's tokens per step, and from the receipts the review
rounds' own seconds and tokens per step. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.agent_clis import CODEX_PRICE, Claude, Codex, task_text  # noqa: E402
from tests.fakes import Recorded  # noqa: E402
from tests.fakes import responses as fr  # noqa: E402

APPROVER = "import sys; sys.stdin.read(); print('Read it.'); print('REVIEW: APPROVE')\n"


class ApprovingCodex(Codex):
    def brain(self, rec: Recorded) -> fr.Reply:
        return fr.Reply([fr.message("Looks done.\nREVIEW: APPROVE")], input_tokens=self.input_tokens,
                        output_tokens=self.output_tokens)


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=B", "-c", "user.email=b@example.com", *args], cwd=cwd, check=True,
                   capture_output=True)


def one_run(way: str, steps: int, homes: Path) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="kiro-bench-review-") as tmp, \
            tempfile.TemporaryDirectory(dir=homes) as home:
        root = Path(tmp) / "ws"
        for folder in ("Specs/feature", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
            (root / folder).mkdir(parents=True)
        (root / "Specs/feature/tasks.md").write_text(task_text(steps))
        git(root, "init", "-q", "-b", "main")
        git(root, "add", "-A")
        git(root, "commit", "-qm", "plan")
        claude = Claude(Path(home) / "claude")
        codex = ApprovingCodex(Path(home) / "codex")
        for cli in (claude, codex):
            cli.tmp.mkdir()
        claude.extra = [("Write", {"file_path": str(root / "NOTES.md"), "content": "hello\n"})]
        claude.start()
        codex.start()
        review = ""
        if way == "codex":
            review = "review:\n  agent: codex\n"
        elif way == "command":
            script = Path(tmp) / "approve.py"
            script.write_text(APPROVER)
            review = f"review:\n  command: {json.dumps(shlex.join([sys.executable, str(script)]))}\n"
        (root / "config/autonomous_loop.yaml").write_text("agent: claude\n" + review + CODEX_PRICE)
        try:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("KIRO_", "OPENAI_", "ANTHROPIC_"))}
            env.update({**codex.env(), **claude.env()})
            env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
            began = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "kiro", "loop", "start", "--task", "Specs/feature/tasks.md",
                                   "--task-id", "bench"], cwd=root, env=env, capture_output=True, text=True,
                                  timeout=900)
            wall = time.perf_counter() - began
        finally:
            claude.close()
            codex.close()
        assert proc.returncode == 0, proc.stdout + proc.stderr
        state_file = next(p for p in (root / ".state" / "autonomous_loop_bench.json",
                                      root / ".state" / "archive" / "autonomous_loop_bench.json") if p.exists())
        state: dict[str, Any] = json.loads(state_file.read_text())
        rounds = [rv for c in state["completed_steps"] for rv in (c.get("receipt") or {}).get("reviews", [])]
        return {"wall": wall / steps, "tokens": state["usage"]["total_tokens"] / steps,
                "review_seconds": sum(r["seconds"] for r in rounds) / steps,
                "review_tokens": sum(r["total_tokens"] for r in rounds) / steps, "rounds": len(rounds)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    for program in ("claude", "codex"):
        if shutil.which(program) is None:
            sys.exit(f"{program} is not installed (.ci/install-agent-clis)")
    homes = Path(os.environ.get("KIRO_TEST_HOMES") or Path.home() / ".cache" / "kiro-test-homes")
    homes.mkdir(parents=True, exist_ok=True)  # codex's sandbox helper is refused under the temp directory
    base = None
    for way in ("none", "codex", "command"):
        r = one_run(way, a.steps, homes)
        base = base or r
        print(f"review {way:8} {a.steps} steps: {r['wall']:.2f} s/step (+{r['wall'] - base['wall']:.2f}), "
              f"{r['tokens']:.0f} tokens/step (+{r['tokens'] - base['tokens']:.0f}); review rounds {r['rounds']}: "
              f"{r['review_seconds']:.2f} s and {r['review_tokens']:.0f} tokens per step")


if __name__ == "__main__":
    main()
