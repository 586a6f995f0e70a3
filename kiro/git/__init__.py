"""kiro's own git: checkpoints, rollback and isolated worktrees (SPEC §9), beside the engine."""
