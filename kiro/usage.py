"""What model calls cost: one attempt's `StepUsage`. Executors fill it, the guardrails count it,
the state adds it to the loop's `usage`; a module of its own so that storage (`kiro.store.state`) does
not import the executors."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StepUsage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    api_calls: int = 0
    cost_usd: float = 0.0

    def add(self, other: StepUsage) -> None:
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.total_tokens += other.total_tokens
        self.api_calls += other.api_calls
        self.cost_usd += other.cost_usd
