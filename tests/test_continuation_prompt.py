"""The continuation prompt never nests the previous one (issue 7 item 14): "Recent Context" holds the
previous step prompt without the continuation context it carried, however many reinjections in a row."""

from __future__ import annotations

from typing import Any

from kiro.executors import prompts
from kiro.executors.base import ExecutorBase, StepContext, StepResult
from kiro.store.state import LoopState
from tests.conftest import Workspace
from tests.test_guardrails import _config, _run

HEADING = "# Task Continuation Context"


class PromptRecorder(ExecutorBase):
    name = "shell"

    def __init__(self) -> None:
        self.prompts: list[str] = []

    async def run_step(self, ctx: StepContext) -> StepResult:
        self.prompts.append(ctx.prompt)
        return StepResult("completed", summary=f"did {ctx.step.id}")


def test_every_iteration_reinjected_carries_one_continuation_context(ws: Workspace) -> None:
    ws.task("".join(f"- [ ] {i}. Step {i}\n" for i in range(1, 7)))
    _config(ws, "  reinject_every_n_iterations: 1\n")
    ex = PromptRecorder()
    outcome, _st, _events = _run(ws, ex)
    assert outcome.exit_code == 0
    assert len(ex.prompts) == 6
    for i, prompt in enumerate(ex.prompts, 1):
        assert prompt.count(HEADING) == 1, f"iteration {i}: {prompt.count(HEADING)} continuation contexts"
    # Recent Context is the previous step's own prompt
    last = ex.prompts[-1]
    recent = last[last.index("## Recent Context"):last.index("## Last Response")]
    assert "# Current step: 5" in recent and "did 5" in last


def test_a_state_saved_with_a_nested_prompt_renders_flat(ws: Workspace) -> None:
    nested = f"{HEADING}\n## Recent Context\n{HEADING}\nold\nPlease continue from where you left off.\n\n" \
             f"Please continue from where you left off.\n\n# Current step: 3 — Step 3\nbody\n"
    st = LoopState(task_id="t", task_path="Specs/x/tasks.md")
    st.context.last_prompt = nested
    text: Any = prompts.continuation_context(st)
    assert text.count(HEADING) == 1 and "# Current step: 3" in text


def test_the_step_template_fills_its_placeholders() -> None:
    """The packaged step template names the step; a name not given stays as written (`safe_substitute`)."""
    from kiro.executors.prompts import _packaged, _template

    step = _packaged("step.md")
    assert "$step_id" in step and "$step_id" not in _template(step).safe_substitute(step_id="7")
    assert _template("$a and $b").safe_substitute(a=1) == "1 and $b"
