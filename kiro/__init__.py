"""kiro: run an AI agent through a Kiro-style task list, one verified step per iteration."""

__version__ = "0.1.0"
