"""Files, safely: crash-safe writes, reads of untrusted files, locks, the disk-full reserve, the write queue.

Imports only kiro's leaf modules (errors, status, timeutil, usage, shared)."""
