"""What the pre-check gate and the resource waits cost kiro itself, besides the pre-check model call.

    python bench/precheck_gate.py [--files 1000 --files 10000] [--repeat 5]

For a project of N files: the snapshot (`kiro.core.precheck.take`: the task file, a walk of the project with
one stat per file, the memory and inbox counts; taken after every turn with `every_iteration`, after
every run of a scheduled task) and the digest of 10 changed files (`describe`), median of --repeat runs;
the baseline's size on disk. Then one `resource_wait()` check with both CPU and disk limits on (two
getrusage calls; made before every iteration, model call and writing tool call). Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kiro.core import precheck  # noqa: E402
from kiro.core.guardrails import LoopGuardrails, SharedLimits  # noqa: E402
from kiro.store.config import Config  # noqa: E402
from kiro.store.redact import Redactor  # noqa: E402
from kiro.store.state import LoopState  # noqa: E402
from kiro.store.workspace import Workspace  # noqa: E402


def make_project(root: Path, files: int) -> None:
    (root / "Specs" / "t").mkdir(parents=True)
    (root / "Specs" / "t" / "tasks.md").write_text("- [x] 1. one\n- [ ] 2. two\n")
    per_dir = 100
    for i in range(files):
        d = root / "src" / f"pkg{i // per_dir}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"m{i}.py").write_text(f"x = {i}\n")


def fake_loop(root: Path) -> SimpleNamespace:
    ws = Workspace(root)
    cfg = Config.model_validate({"llm": {"precheck_model": "cheap"}})
    state = LoopState(task_id="t", task_path="Specs/t/tasks.md")
    return SimpleNamespace(ws=ws, cfg=cfg, state=state, task_path=root / "Specs/t/tasks.md", project_dir=root,
                           redact=Redactor())


def median_ms(fn: object, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, action="append")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    sizes = args.files or [1000, 10000]
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            make_project(root, n)
            loop = fake_loop(root)
            take_ms = median_ms(lambda: precheck.take(loop), args.repeat)  # noqa: B023
            before = precheck.take(loop)
            precheck.save(loop, before)  # type: ignore[arg-type]
            size = os.path.getsize(root / ".state" / "precheck" / "t.json")
            for i in range(10):
                (root / "src" / "pkg0" / f"m{i}.py").write_text("changed = True\n")
            now = precheck.take(loop)
            describe_ms = median_ms(lambda: precheck.describe(loop, before, now, None), args.repeat)  # noqa: B023
            digest, summary = precheck.describe(loop, before, now, None)  # type: ignore[arg-type]
            print(f"precheck {n:>6} files: snapshot {take_ms:7.1f} ms, digest of 10 changes {describe_ms:5.2f} ms, "
                  f"baseline {size / 1024:7.0f} KiB, digest {len(digest)} chars ({summary})")
    cfg = Config.model_validate({"resource_limits": {"max_cpu_percent": 80, "max_disk_writes_per_minute": 100}})
    g = LoopGuardrails(cfg, LoopState(task_id="t", task_path="x"), SharedLimits(cfg))
    calls = 20000
    t0 = time.perf_counter()
    for _ in range(calls):
        g.resource_wait()
    per = (time.perf_counter() - t0) / calls * 1e6
    print(f"resource_wait (cpu + disk limits on): {per:.1f} µs per check")


if __name__ == "__main__":
    main()
