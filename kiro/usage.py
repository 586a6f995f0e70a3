"""What model calls cost: `Usage`, one tally of tokens, API calls and dollars. An attempt's (an
executor fills it, the guardrails count it) and a loop's (`LoopState.usage`, which adds up its
attempts') are the same record; a leaf module, so that storage (`kiro.store.state`) does not import
the executors."""

from pydantic import BaseModel, ConfigDict


class Usage(BaseModel):
    # Kept in the state: a newer kiro's extra fields survive a round trip; no NaN or infinity (kiro
    # never writes one, and one read back poisons every sum). Validators are built on first use.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, defer_build=True)

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    api_calls: int = 0
    cost_usd: float = 0.0

    def add(self, other: "Usage") -> None:
        """Add another tally (an attempt's to a loop's, a model call's to an attempt's)."""
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.total_tokens += other.total_tokens
        self.api_calls += other.api_calls
        self.cost_usd = round(self.cost_usd + other.cost_usd, 8)


def dollars(usd: float | None) -> str:
    """A cost as every view prints it (`$0.0018`, never `0.0018000000000000002`); `-` for none."""
    return "-" if usd is None else f"${usd:.4f}"
