"""`kiro serve`: an HTTP server over one workspace (SPEC §10). REST for the loops' state, Server-Sent
Events and a WebSocket for their events as they are appended (by any process), control messages in
seed 003's style, and a live dashboard page at `/`.

Everything here reads the same files the CLI reads (state files, `Logs/<task_id>.jsonl`) and steers
loops the way a person does (`kiro loop start --detach`, stop hooks, `kiro loop resume --detach`), so a
loop started by the server, by a terminal or by `kiro loop watch` looks the same from every side.
Needs the `serve` extra: `pip install 'kiro-loop[serve]'` (in a checkout: `pip install -e '.[serve]'`).
"""
