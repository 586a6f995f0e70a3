"""The loop and what runs it: the engine, stop conditions, guardrails, listeners and hooks, the runner,
the supervisor of `watch`, the file watcher, schedules and the pre-check."""
