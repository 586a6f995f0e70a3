"""The transcript's lines: what `Transcript.write` appends."""

from __future__ import annotations

import json
from pathlib import Path

from kiro.store.transcript import Redactor, Transcript, read


def test_a_line_is_the_records_json_as_json_dumps_writes_it_redacted(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    secret = "sk-" + "s" * 30
    transcript = Transcript(path, "t1", Redactor([secret]))
    transcript.write("response", iteration=2, attempt=1, step_id="1.2", content=f"déjà vu \u2014 {secret}",
                     seconds=0.25, path=Path("src/x.py"))
    [line] = path.read_text(encoding="utf-8").splitlines()
    record = {"ts": json.loads(line)["ts"], "task_id": "t1", "iteration": 2, "attempt": 1, "step_id": "1.2",
              "kind": "response", "content": "déjà vu \u2014 [REDACTED]", "seconds": 0.25, "path": "src/x.py"}
    assert line == json.dumps(record, ensure_ascii=False, default=str)  # not \u-escaped; a Path as its text
    assert read(path) == [record]
