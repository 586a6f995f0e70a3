"""The temporal backend (SPEC §12, docs/scale-out.md): each loop a Temporal workflow, each step attempt an
activity on a `kiro worker` with its own git clone. Imported only when `backend.kind` is `temporal`: the local
path never loads temporalio."""

from __future__ import annotations

from kiro.core.backends import TEMPORAL_MISSING as MISSING

__all__ = ["MISSING"]
