"""The temporal backend (SPEC §12, docs/scale-out.md).

Every kind here is made on first use: `kiro.store.events` imports this module when one of its names
is asked for (`ev.X`, `from kiro.store.events import X`) or every kind is read (the log's reader)."""

from typing import Literal

from kiro.store.events import Event


class WorkerLost(Event):
    """A `kiro worker` died (or went silent) during this step's attempt; Temporal ran it again elsewhere.
    `tries`: the try that finished (1 = nothing was lost); `worker`: the one that finished it."""

    event: Literal["worker_lost"] = "worker_lost"
    step_id: str
    tries: int
    worker: str
