"""Evidence for the morning (SPEC §14): a completed step's receipt, the test counts of a JUnit XML report,
and the protected paths a step may not touch.

- `Receipt`       what kiro saw when it counted a step done; kept on `completed_steps[].receipt` in the state,
                  so it is journaled and crash-safe like the rest of the state (kiro.store.journal)
- `read_report`   a JUnit XML report's counts (pytest, jest, go-junit-report, cargo nextest write one),
                  read with `junitparser`; `shrank` says when they went down
- `Protected`     the files the `protected_paths` globs match, hashed before a step, with a copy of each
                  in `.state/protected/<task_id>/` so that a step's change is put back (also after a kill)
- proposals       `Pending_Approval/protected_<task_id>_<n>.md`: a person moves one to `Approved/` to let
                  the step change those paths on its next attempt

This module knows no loop and no executor (kiro.core.evidence runs it beside the engine).
"""

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from kiro import timeutil
from kiro.fs.atomic import atomic_write
from kiro.store import frontmatter
from kiro.store.models import empty_list
from kiro.store.workspace import Workspace

OUTPUT_TAIL_CHARS = 1500  # of verify's output, in a receipt
NOT_PROTECTED = frozenset({".git", ".state", ".hooks"})  # kiro's own and git's folders: never a protected file


class StoredModel(BaseModel):
    """A record of a loop's state file (kiro.store.state's models and the receipts here).

    Forward compatible: a newer kiro's extra fields survive a round trip through an older one. No NaN or
    infinity: kiro never writes one, and one read back poisons every sum and average. An assignment is not
    checked: kiro's own code sets the fields as it runs. defer_build: the validators are built when a state
    is first read or made, not at import.

    No record keeps the set of the fields it was given (pydantic's `model_fields_set`, for
    `exclude_unset`): kiro never asks a record for it, every record is written whole, and a loop keeps
    every completed step and its receipt for its whole run; the set was 2.3 KB of a receipt's 2.9 KB in
    memory (its 19 names) and 0.7 KB of a completed step's 1.3 KB, 3 KB a step of a loop (issue #41)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, allow_inf_nan=False, defer_build=True)

    def model_post_init(self, context: Any, /) -> None:
        object.__setattr__(self, "__pydantic_fields_set__", set())


class TestCounts(StoredModel):
    """A JUnit report's test cases by result. A deselected test is not in the report: it shows as one
    passed fewer."""

    __test__ = False  # not a pytest test class

    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    xfailed: int = 0

    def describe(self) -> str:
        """"40 passed and 2 skipped"; "0 tests"."""
        parts = [f"{n} {name}" for name, n in (("passed", self.passed), ("failed", self.failed),
                                                ("errors", self.errors), ("skipped", self.skipped),
                                                ("xfailed", self.xfailed)) if n]
        if not parts:
            return "0 tests"
        return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


class VerifyRecord(StoredModel):
    """What a receipt keeps of the step's verify run."""

    command: str
    exit_code: int | None
    output_tail: str = ""
    report: str | None = None  # verify_report, as configured
    tests: TestCounts | None = None
    seconds: float | None = None  # how long verify ran


class VerifyRun(StoredModel):
    """One run of the `verify` command after a step (kiro.executors.verify.run_verify), where the step's work
    is: on the loop's host, or on the temporal backend's worker, which sends it back with the attempt's
    result. With `verify_report`, the report's test counts are read there too."""

    command: str
    exit_code: int | None  # None: timed out or cancelled
    output: str = ""  # its tail, redacted
    started: float = 0.0  # time.time() when it began (a report older than this is not its own)
    seconds: float = 0.0
    report: str | None = None  # verify_report, as configured
    tests: TestCounts | None = None  # the report's counts
    report_problem: str | None = None  # why the report could not be read (missing, stale, not JUnit XML)

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    def record(self) -> VerifyRecord:
        """The receipt's part."""
        tail = self.output[-OUTPUT_TAIL_CHARS:]
        return VerifyRecord(command=self.command, exit_code=self.exit_code, output_tail=tail, report=self.report,
                            tests=self.tests, seconds=round(self.seconds, 3))


class ProtectedCheck(StoredModel):
    globs: list[str] = Field(default_factory=empty_list)
    files: int = 0  # protected files there were before the step
    changed: list[str] = Field(default_factory=empty_list)  # "changed: tests/test_a.py" etc., put back (or approved)
    approved: list[str] = Field(default_factory=empty_list)  # paths a person let this step change
    ok: bool = True


class ReviewRound(StoredModel):
    """One review of a step (SPEC §14 `review:`, kiro.core.review): what the reviewer answered."""

    round: int  # 1 for the step's first review
    verdict: str  # "approve" | "changes" | "invalid" (an answer without a REVIEW: line, or a reviewer that failed)
    reasons: str = ""
    agent: str | None = None  # the preset, or "command"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0
    log: str | None = None  # the reviewer's output, workspace-relative
    at: str | None = None


class Receipt(StoredModel):
    """What kiro saw when it counted a step done (SPEC §14)."""

    step_id: str
    title: str
    executor: str | None = None
    agent: str | None = None
    model: str | None = None
    attempts: int = 1
    started_at: str | None = None
    finished_at: str
    duration_seconds: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cost_usd: float = 0.0
    verify: VerifyRecord | None = None  # None: no verify command is set
    checkpoint: str | None = None
    checkpoint_note: str | None = None
    diff_stat: str | None = None
    protected: ProtectedCheck | None = None  # None: no protected_paths
    recovered: bool = False  # counted on the run after a kill: verified and checked then
    reviews: list[ReviewRound] = Field(default_factory=empty_list)  # each review round (SPEC §14 `review:`)


# -- test counts -----------------------------------------------------------------------------------


class ReportError(Exception):
    """verify_report is missing, stale or not JUnit XML."""


def read_report(path: Path) -> TestCounts:
    """The counts of the JUnit XML report at `path` (every test case of every suite)."""
    from junitparser import Error, Failure, JUnitXml, JUnitXmlError, Skipped, TestSuite

    try:
        xml = JUnitXml.fromfile(str(path))
    except FileNotFoundError:
        raise ReportError(f"verify did not write its report {path.name}") from None
    except (JUnitXmlError, OSError, ValueError, SyntaxError) as exc:
        raise ReportError(f"the report {path.name} is not JUnit XML ({type(exc).__name__}: {exc})") from None
    counts = TestCounts()
    suites = [xml] if isinstance(xml, TestSuite) else list(xml)
    for suite in suites:
        for case in suite:
            results = case.result
            if any(isinstance(r, Error) for r in results):
                counts.errors += 1
            elif any(isinstance(r, Failure) for r in results):
                counts.failed += 1
            elif any(isinstance(r, Skipped) for r in results):
                if any("xfail" in (r.type or "") or "xfail" in (r.message or "") for r in results):
                    counts.xfailed += 1
                else:
                    counts.skipped += 1
            else:
                counts.passed += 1
    return counts


REPORT_CLOCK_SLACK = 2.0  # seconds: a report written this long before verify began is still its own (clock steps)


def report_counts(project: Path, report: str, started: float) -> tuple[TestCounts | None, str | None]:
    """The counts of the report `verify_report` names (relative to `project`), written by the verify run that
    began at `started`: (counts, None), or (None, why not)."""
    path = project / report
    try:
        written = os.stat(path).st_mtime
    except OSError:
        return None, f"verify did not write its report {report} (verify_report)"
    if written < started - REPORT_CLOCK_SLACK:
        return None, f"verify did not write its report {report} this time (the file there is older than the verify run)"
    try:
        return read_report(path), None
    except ReportError as exc:
        return None, f"{exc} (verify_report)"


def shrank(before: TestCounts | None, after: TestCounts) -> str | None:
    """Why `after` is worse than `before` (fewer passed, or more skipped or xfailed), or None."""
    if before is None:
        return None
    if after.passed < before.passed or after.skipped > before.skipped or after.xfailed > before.xfailed:
        return f"tests went from {before.describe()} to {after.describe()}"
    return None


# -- protected paths -------------------------------------------------------------------------------


def _digest(path: Path) -> str | None:
    """sha256 of a regular file's bytes (of a symlink: of its target's name); None: not there."""
    try:
        if path.is_symlink():
            return "link:" + hashlib.sha256(os.readlink(path).encode("utf-8", "surrogateescape")).hexdigest()
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def bytecode(root: Path, sources: Iterable[str]) -> list[str]:
    """The bytecode Python and pytest keep of these Python files, relative: `D/__pycache__/NAME.*.pyc` of
    `D/NAME.py` (`NAME.cpython-311.pyc`, pytest's `NAME.cpython-311-pytest-9.0.3.pyc`). Python (and pytest)
    loads such a file in place of its source when the hash or time and size it records match the source's,
    so a protected Python file's bytecode is protected with it."""
    stems: dict[str, set[str]] = {}
    for rel in sources:
        folder, _, name = rel.rpartition("/")
        if name.endswith(".py") and len(name) > 3:
            stems.setdefault(folder, set()).add(name[:-3] + ".")
    found: list[str] = []
    for folder, prefixes in stems.items():
        cache = root / folder / "__pycache__"
        try:
            names = os.listdir(cache)
        except OSError:
            continue
        prefix = f"{folder}/__pycache__/" if folder else "__pycache__/"
        found += [prefix + n for n in names if n.endswith(".pyc") and n.startswith(tuple(prefixes))]
    return found


def matching(root: Path, globs: list[str]) -> list[str]:
    """The files under `root` that the globs match (a glob naming a folder: every file in it), and the
    bytecode of the Python files among them (`bytecode`), relative."""
    found: set[str] = set()
    for pattern in globs:
        pattern = pattern.strip().lstrip("/")
        if not pattern:
            continue
        for hit in root.glob(pattern):
            candidates = [hit] if hit.is_symlink() or not hit.is_dir() else \
                [p for p in hit.rglob("*") if p.is_symlink() or p.is_file()]
            for p in candidates:
                rel = p.relative_to(root)
                if not NOT_PROTECTED.intersection(rel.parts):
                    found.add(rel.as_posix())
    found.update(bytecode(root, list(found)))
    return sorted(found)


class Change(NamedTuple):  # (a NamedTuple, as kiro.store.tasks' TaskCounts)
    path: str
    kind: str  # created | changed | deleted

    def __str__(self) -> str:
        return f"{self.kind} {self.path}"


class Protected:
    """The protected files of one loop: their hashes before the step (`manifest.json`) and a copy of each
    version (`blobs/<sha256>`), in `.state/protected/<task_id>/`."""

    def __init__(self, ws: Workspace, task_id: str, root: Path, globs: list[str], *,
                 files: Callable[[], list[str]] | None = None, area: str = "protected") -> None:
        """`files`: lists the files to keep (relative to `root`) in place of the globs (a reviewer's run:
        the project's files git knows, kiro.core.review), kept in `.state/<area>/<task_id>/`."""
        self.root = root
        self.globs = globs
        self.by_globs = files is None
        self.files = files or (lambda: matching(self.root, self.globs))
        self.folder = ws.state_dir / area / task_id
        self.manifest_path = self.folder / "manifest.json"

    def snapshot(self) -> dict[str, str]:
        """Hash the protected files now and keep a copy of each version not kept yet; the manifest is on
        disk (atomically) before this returns, so a kill during the step still finds it."""
        blobs = self.folder / "blobs"
        blobs.mkdir(parents=True, exist_ok=True)
        manifest: dict[str, str] = {}
        for rel in self.files():
            path = self.root / rel
            digest = _digest(path)
            if digest is None:
                continue
            manifest[rel] = digest
            blob = blobs / digest.replace(":", "_")
            if not blob.exists():
                data = os.readlink(path).encode("utf-8", "surrogateescape") if path.is_symlink() else path.read_bytes()
                atomic_write(blob, data)
        atomic_write(self.manifest_path, json.dumps(manifest, sort_keys=True))
        return manifest

    def manifest(self) -> dict[str, str] | None:
        try:
            data = json.loads(self.manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else None

    def changes(self, manifest: dict[str, str]) -> list[Change]:
        """What differs from `manifest` now: files created, changed or deleted. The bytecode of a protected
        Python file the step deleted counts too: the file is put back, and what Python would load for it with it."""
        files = self.files()
        if self.by_globs:
            files += bytecode(self.root, set(manifest).difference(files))
        now = {rel: d for rel in files if (d := _digest(self.root / rel)) is not None}
        out = [Change(rel, "deleted") for rel in manifest if rel not in now]
        out += [Change(rel, "changed") for rel, d in now.items() if rel in manifest and manifest[rel] != d]
        out += [Change(rel, "created") for rel in now if rel not in manifest]
        return sorted(out, key=lambda c: c.path)

    def put_back(self, manifest: dict[str, str], changes: list[Change]) -> list[str]:
        """Undo `changes`: a created file is removed, a changed or deleted one written back from its
        copy. Returns what could not be put back."""
        problems = []
        for c in changes:
            path = self.root / c.path
            try:
                if c.kind == "created":
                    path.unlink()
                    continue
                digest = manifest[c.path]
                blob = (self.folder / "blobs" / digest.replace(":", "_")).read_bytes()
                if path.is_symlink() or path.is_dir():
                    path.unlink()
                path.parent.mkdir(parents=True, exist_ok=True)
                if digest.startswith("link:"):
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                    os.symlink(blob.decode("utf-8", "surrogateescape"), path)
                else:
                    atomic_write(path, blob)
            except OSError as exc:
                problems.append(f"{c.path}: {exc.strerror or exc}")
        return problems


# -- approving a change to protected paths --------------------------------------------------------

PENDING, APPROVED = "Pending_Approval", "Approved"


def _proposal_re(task_id: str) -> re.Pattern[str]:
    return re.compile(rf"^protected_{re.escape(task_id)}_(\d+)\.md$")


def propose_change(ws: Workspace, task_id: str, step_id: str, changes: list[Change]) -> Path:
    """Write `Pending_Approval/protected_<task_id>_<n>.md`: the step changed protected paths; a person who
    moves the file to `Approved/` lets the step's next attempt change them."""
    rx = _proposal_re(task_id)
    numbers = [int(m.group(1)) for area in (PENDING, APPROVED, "Rejected") if (ws.root / area).is_dir()
               for p in (ws.root / area).iterdir() if (m := rx.match(p.name))]
    path = ws.root / PENDING / f"protected_{task_id}_{max(numbers, default=0) + 1}.md"
    meta = {"type": "protected_change", "task_id": task_id, "step_id": step_id,
            "paths": [c.path for c in changes], "created": timeutil.iso(), "status": "pending"}
    listed = "\n".join(f"- {c}" for c in changes)
    body = (f"# Step {step_id} of loop {task_id} changed protected paths\n\nkiro put them back and failed the "
            f"attempt. Move this file to `Approved/` to let the step's next attempt make these changes; leave it, "
            f"or move it to `Rejected/`, to keep them protected.\n\n## Paths\n{listed}\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    (ws.root / APPROVED).mkdir(exist_ok=True)
    atomic_write(path, frontmatter.write(meta) + body)
    return path


def changed_reason(step_id: str, changes: list[str], proposal: str) -> str:
    """Why the attempt failed: `changes` ("changed tests/a.py") put back; `proposal` says where a person approves."""
    return (f"step {step_id} {'; '.join(changes)}, which protected_paths protects; kiro put it back. A person can "
            f"let the change through: see {proposal}")


def approved_paths(ws: Workspace, task_id: str, step_id: str) -> list[str]:
    """The paths a person approved changing in step `step_id` (proposals in `Approved/`)."""
    folder = ws.root / APPROVED
    if not folder.is_dir():
        return []
    rx = _proposal_re(task_id)
    out: list[str] = []
    for p in folder.iterdir():
        if not rx.match(p.name):
            continue
        try:
            meta = frontmatter.read(p.read_text(encoding="utf-8")).data
        except (OSError, UnicodeDecodeError, frontmatter.FrontmatterError):
            continue
        if str(meta.get("step_id")) == step_id and isinstance(meta.get("paths"), list):
            out += [str(x) for x in meta["paths"]]
    return out
