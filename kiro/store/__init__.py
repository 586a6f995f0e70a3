"""What kiro keeps: the workspace's folders, task files, the config, loop state and its journal, event logs,
messages, approval, memory, history, transcripts and the redactor in front of all of them.

Imports fs/, processes/ and the leaf modules; nothing of executors, the engine or the CLI."""
