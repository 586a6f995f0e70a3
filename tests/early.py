"""The process that makes the test run's `made_early` runs (tests/agent_clis.py), begun by each xdist worker once
it has collected the tests (tests/conftest.py `pytest_collection_finish`): `python -m tests.early MODULE:KEY ...`,
in the tests' order. One such process a test run makes them (the first to take the run folder's `early.lock`;
the others end at once), one after another: each mostly waits, and one agent starts up at a time. A process
of its own, not a thread of the worker's: the tests that run meanwhile change the worker's environment
(monkeypatch: PATH, HOME, GIT_DIR), which a run begun in it would read."""

from __future__ import annotations

import importlib
import sys
import traceback

from kiro.fs.locks import Flock, Timeout
from tests.agent_clis import EARLY, run_folder


def main(specs: list[str]) -> int:
    with Flock(run_folder() / "early.lock") as lock:
        try:
            lock.acquire()
        except Timeout:
            return 0  # another worker's process makes them
        for spec in specs:
            module, key = spec.split(":", 1)
            try:
                importlib.import_module(module)
                EARLY[key]()
            except BaseException:  # the test makes it itself, and fails as it fails
                print(f"{spec}:\n{traceback.format_exc()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
