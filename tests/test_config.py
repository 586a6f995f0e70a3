"""Config: the layered resolve (SPEC §7) and errors a person can act on, each one line with file and line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from kiro.errors import ConfigError
from kiro.store.config import Config, _validation_error, default_config_yaml, load_config_file, resolve_config

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "config" / "autonomous_loop.yaml"


def write_config(root: Path, text: str) -> Path:
    path = root / "config" / "autonomous_loop.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def resolve(root: Path, **kwargs: Any) -> Config:
    """resolve_config with an empty environment unless a test gives one: the real one must not leak in."""
    kwargs.setdefault("env", {})
    return resolve_config(workspace_root=root, **kwargs)


def config_error(root: Path, **kwargs: Any) -> str:
    with pytest.raises(ConfigError) as info:
        resolve(root, **kwargs)
    message = str(info.value)
    assert "\n" not in message, message
    return message


# -- defaults and the shipped file ---------------------------------------------------------------


def test_defaults_without_a_config_file(tmp_path: Path) -> None:
    config = resolve(tmp_path)
    assert config == Config()
    assert config.autonomous_loop.max_iterations == 100
    assert config.llm.model == "gpt-4o-mini"


def test_shipped_yaml_is_exactly_the_defaults() -> None:
    data, _ = load_config_file(SHIPPED)
    assert Config.model_validate(data) == Config()
    # Every key is written out, not just left to its default.
    assert data == Config().model_dump()


def test_shipped_yaml_resolves_to_the_defaults(tmp_path: Path) -> None:
    write_config(tmp_path, SHIPPED.read_text(encoding="utf-8"))
    assert resolve(tmp_path) == Config()


def test_packaged_default_is_the_shipped_yaml() -> None:
    packaged = REPO / "kiro" / "default_config.yaml"
    assert packaged.read_bytes() == SHIPPED.read_bytes()
    assert default_config_yaml() == SHIPPED.read_text(encoding="utf-8")


# -- layers --------------------------------------------------------------------------------------


def test_file_overrides_defaults_and_merges_sections(tmp_path: Path) -> None:
    write_config(tmp_path, "autonomous_loop:\n  max_iterations: 7\nllm:\n  model: local\n")
    config = resolve(tmp_path)
    assert config.autonomous_loop.max_iterations == 7
    assert config.autonomous_loop.failure_threshold == 3
    assert config.llm.model == "local"
    assert config.llm.max_turns_per_step == 15


def test_explicit_config_file_replaces_the_workspace_one(tmp_path: Path) -> None:
    write_config(tmp_path, "max_parallel_loops: 2\n")
    custom = tmp_path / "custom.yaml"
    custom.write_text("max_parallel_loops: 9\n", encoding="utf-8")
    assert resolve(tmp_path, config_file=custom).max_parallel_loops == 9


def test_frontmatter_over_file(tmp_path: Path) -> None:
    write_config(tmp_path, "autonomous_loop:\n  max_iterations: 7\nverify: make test\n")
    config = resolve(tmp_path, frontmatter={"max_iterations": 3, "verify": "pytest -q", "model": "m1",
                                            "title": "Auth", "owner": "sam"})
    assert config.autonomous_loop.max_iterations == 3
    assert config.verify == "pytest -q"
    assert config.llm.model == "m1"


def test_person_frontmatter_keys_are_ignored(tmp_path: Path) -> None:
    config = resolve(tmp_path, frontmatter={"title": "x", "schedule": "daily", "anything": {"a": 1}})
    assert config == Config()


def test_env_over_frontmatter(tmp_path: Path) -> None:
    write_config(tmp_path, "autonomous_loop:\n  max_iterations: 7\n")
    config = resolve(tmp_path, frontmatter={"max_iterations": 3, "executor": "shell"},
                     env={"KIRO_MAX_ITERATIONS": "5", "KIRO_EXECUTOR": "command",
                          "KIRO_EXECUTOR_COMMAND": "claude -p", "KIRO_INCLUDE_OPTIONAL": "true"})
    assert config.autonomous_loop.max_iterations == 5
    assert config.executor == "command"
    assert config.executor_command == "claude -p"
    assert config.include_optional is True


def test_overrides_over_env_and_none_means_not_given(tmp_path: Path) -> None:
    config = resolve(
        tmp_path,
        env={"KIRO_MAX_ITERATIONS": "5", "KIRO_MODEL": "from-env"},
        overrides={"autonomous_loop.max_iterations": 9, "llm.model": None, "executor": "shell"},
    )
    assert config.autonomous_loop.max_iterations == 9
    assert config.llm.model == "from-env"
    assert config.executor == "shell"


def test_empty_section_means_defaults(tmp_path: Path) -> None:
    write_config(tmp_path, "llm:\n  # model: local\nguardrails:\n")
    assert resolve(tmp_path) == Config()


# -- environment ---------------------------------------------------------------------------------


def test_env_general_form(tmp_path: Path) -> None:
    config = resolve(tmp_path, env={
        "KIRO_LLM__MAX_TURNS_PER_STEP": "5",
        "KIRO_AUTONOMOUS_LOOP__MAX_STEP_RETRIES": "1",
        "KIRO_GUARDRAILS__MAX_COST_USD": "2.5",
        "kiro_tools__shell__allow": "[ls, wc]",
        "KIRO_GUARDRAILS__ACTIVE_HOURS": "{start: 09:00, end: 17:30}",
    })
    assert config.llm.max_turns_per_step == 5
    assert config.autonomous_loop.max_step_retries == 1
    assert config.guardrails.max_cost_usd == 2.5
    assert config.tools.shell.allow == ["ls", "wc"]
    assert config.guardrails.active_hours is not None
    assert config.guardrails.active_hours.end == "17:30"


def test_env_text_keys_stay_text_and_null_clears(tmp_path: Path) -> None:
    write_config(tmp_path, "verify: make test\nexecutor: shell\n")
    config = resolve(tmp_path, env={"KIRO_EXECUTOR_COMMAND": "pytest -k 'a: b'", "KIRO_VERIFY": "null",
                                    "KIRO_EXECUTOR": "~", "KIRO_MODEL": "123"})
    assert config.executor_command == "pytest -k 'a: b'"
    assert config.verify is None
    assert config.executor is None
    assert config.llm.model == "123"


def test_env_other_kiro_variables_and_empty_values_are_ignored(tmp_path: Path) -> None:
    config = resolve(tmp_path, env={"KIRO_WORKSPACE": "/x", "KIRO_DEBUG": "1", "KIRO_TASK_ID": "t",
                                    "KIRO_MAX_ITERATIONS": "", "HOME": "/root"})
    assert config == Config()


def test_short_env_name_wins_over_general_form(tmp_path: Path) -> None:
    config = resolve(tmp_path, env={"KIRO_AUTONOMOUS_LOOP__MAX_ITERATIONS": "8", "KIRO_MAX_ITERATIONS": "9"})
    assert config.autonomous_loop.max_iterations == 9


def test_openai_base_url_fills_a_null_base_url(tmp_path: Path) -> None:
    assert resolve(tmp_path, env={"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}).llm.base_url == (
        "http://127.0.0.1:9/v1"
    )
    write_config(tmp_path, "llm:\n  base_url: http://file/v1\n")
    assert resolve(tmp_path, env={"OPENAI_BASE_URL": "http://env/v1"}).llm.base_url == "http://file/v1"
    both = {"OPENAI_BASE_URL": "http://env/v1", "KIRO_BASE_URL": "http://kiro/v1"}
    assert resolve(tmp_path, env=both).llm.base_url == "http://kiro/v1"


# -- errors: where the bad value came from -------------------------------------------------------


def test_wrong_type_names_file_line_and_key(tmp_path: Path) -> None:
    write_config(tmp_path, "# comment\n\nautonomous_loop:\n  failure_threshold: 3\n  max_iterations: lots\n")
    assert config_error(tmp_path) == (
        "config/autonomous_loop.yaml:5: autonomous_loop.max_iterations: "
        "Input should be a valid integer (got 'lots')"
    )


def test_unknown_key_names_line_and_suggests(tmp_path: Path) -> None:
    write_config(tmp_path, "autonomous_loop:\n  max_iterations: 5\n  max_iteration: 5\n")
    assert config_error(tmp_path) == (
        "config/autonomous_loop.yaml:3: unknown key 'autonomous_loop.max_iteration' "
        "(did you mean 'max_iterations'?)"
    )


def test_nested_unknown_key(tmp_path: Path) -> None:
    write_config(tmp_path, "llm:\n  base_url: null\n  modle: gpt-4o\n")
    assert config_error(tmp_path) == (
        "config/autonomous_loop.yaml:3: unknown key 'llm.modle' (did you mean 'model'?)"
    )


def test_key_in_the_wrong_section_points_to_the_right_one(tmp_path: Path) -> None:
    write_config(tmp_path, "max_iterations: 5\n")
    assert "did you mean 'autonomous_loop.max_iterations'?" in config_error(tmp_path)


def test_unknown_key_without_a_close_match_lists_valid_keys(tmp_path: Path) -> None:
    write_config(tmp_path, "resource_limits:\n  zzz: 1\n")
    message = config_error(tmp_path)
    assert message.startswith("config/autonomous_loop.yaml:2: unknown key 'resource_limits.zzz'")
    assert "max_memory_mb, max_cpu_percent" in message


def test_missing_nested_key_points_at_its_parent(tmp_path: Path) -> None:
    write_config(tmp_path, "llm:\n  prices:\n    gpt-4o:\n      input_per_1m: 2.5\n")
    assert config_error(tmp_path) == (
        "config/autonomous_loop.yaml:3: llm.prices.gpt-4o.output_per_1m: required key missing"
    )


def test_frontmatter_error_names_task_file_and_line(tmp_path: Path) -> None:
    task = tmp_path / "Specs" / "a" / "tasks.md"
    message = config_error(tmp_path, frontmatter={"max_iterations": "lots"}, task_path=task,
                           frontmatter_lines={"max_iterations": 3})
    assert message == (
        "Specs/a/tasks.md:3: frontmatter key 'max_iterations': Input should be a valid integer (got 'lots')"
    )


def test_env_error_names_the_variable(tmp_path: Path) -> None:
    assert config_error(tmp_path, env={"KIRO_MAX_ITERATIONS": "lots"}) == (
        "environment KIRO_MAX_ITERATIONS: Input should be a valid integer (got 'lots')"
    )
    assert config_error(tmp_path, env={"KIRO_EXECUTOR": "bash"}).startswith("environment KIRO_EXECUTOR: ")


def test_env_unknown_general_key(tmp_path: Path) -> None:
    assert config_error(tmp_path, env={"KIRO_LLM__MODLE": "x"}) == (
        "environment KIRO_LLM__MODLE: unknown key 'llm.modle' (did you mean 'model'?)"
    )
    assert config_error(tmp_path, env={"KIRO_NOPE__X": "1"}).startswith(
        "environment KIRO_NOPE__X: unknown key 'nope' (valid keys here: autonomous_loop,"
    )


def test_flag_error_names_the_flag(tmp_path: Path) -> None:
    assert config_error(tmp_path, overrides={"autonomous_loop.max_iterations": 0}) == (
        "--max-iterations: Input should be greater than or equal to 1 (got 0)"
    )


def test_error_names_the_layer_that_set_the_bad_value(tmp_path: Path) -> None:
    write_config(tmp_path, "autonomous_loop:\n  max_iterations: lots\n")
    # A later layer replaces the file's bad value: no error.
    assert resolve(tmp_path, env={"KIRO_MAX_ITERATIONS": "4"}).autonomous_loop.max_iterations == 4
    write_config(tmp_path, "autonomous_loop:\n  max_iterations: 4\n")
    message = config_error(tmp_path, env={"KIRO_MAX_ITERATIONS": "0"})
    assert message.startswith("environment KIRO_MAX_ITERATIONS: ")


def test_several_errors_stay_on_one_line(tmp_path: Path) -> None:
    write_config(tmp_path, "autonomous_loop:\n  max_iterations: x\n  failure_threshold: y\nexecutor: z\n")
    message = config_error(tmp_path)
    assert message.startswith("config/autonomous_loop.yaml:2: autonomous_loop.max_iterations: ")
    assert "(and 2 more: autonomous_loop.failure_threshold, executor)" in message


def test_config_flag_file_missing(tmp_path: Path) -> None:
    message = config_error(tmp_path, config_file=tmp_path / "custom.yaml")
    assert message == "custom.yaml: config file not found"


def test_path_outside_the_workspace_is_named_as_given(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.yaml"
    outside.write_text("max_parallel_loops: 0\n", encoding="utf-8")
    root = tmp_path / "ws"
    root.mkdir()
    assert config_error(root, config_file=outside).startswith(f"{outside}:1: max_parallel_loops: ")


# -- reading the file ----------------------------------------------------------------------------


def test_malformed_yaml_names_the_line(tmp_path: Path) -> None:
    write_config(tmp_path, "autonomous_loop:\n  max_iterations: 5\n  bad: value: here\n")
    message = config_error(tmp_path)
    assert message.startswith("config/autonomous_loop.yaml:3: invalid YAML: mapping values are not allowed")


def test_top_level_not_a_mapping(tmp_path: Path) -> None:
    write_config(tmp_path, "- max_iterations: 5\n")
    assert config_error(tmp_path) == (
        "config/autonomous_loop.yaml:1: the top level must be a mapping of keys (like `autonomous_loop:`), "
        "not a list"
    )


@pytest.mark.parametrize("text", ["", "# nothing set\n", "---\n"])
def test_empty_file_is_the_defaults(tmp_path: Path, text: str) -> None:
    path = write_config(tmp_path, text)
    assert load_config_file(path) == ({}, {})
    assert resolve(tmp_path) == Config()


def test_not_utf8(tmp_path: Path) -> None:
    write_config(tmp_path, "").write_bytes(b"verify: make\nproject_dir: caf\xe9\n")
    assert config_error(tmp_path).startswith("config/autonomous_loop.yaml:2: not UTF-8 text (byte 0xe9)")


def test_duplicate_key(tmp_path: Path) -> None:
    write_config(tmp_path, "llm:\n  model: a\n  model: b\n")
    assert config_error(tmp_path) == "config/autonomous_loop.yaml:3: duplicate key 'model' (first on line 2)"


def test_line_map_uses_dotted_paths(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        "autonomous_loop:\n  max_iterations: 5\nllm:\n  prices:\n    gpt-4o:\n"
        "      input_per_1m: 2.5\n      output_per_1m: 10\n",
    )
    data, lines = load_config_file(path)
    assert data["llm"]["prices"]["gpt-4o"] == {"input_per_1m": 2.5, "output_per_1m": 10}
    assert lines == {
        "autonomous_loop": 1, "autonomous_loop.max_iterations": 2, "llm": 3, "llm.prices": 4,
        "llm.prices.gpt-4o": 5, "llm.prices.gpt-4o.input_per_1m": 6, "llm.prices.gpt-4o.output_per_1m": 7,
    }


def test_comments_urls_and_yaml_spellings_read_as_a_person_means_them(tmp_path: Path) -> None:
    """What used to be read by a hand-written YAML subset (kiro.plainyaml) reads the same through
    PyYAML's safe loader: comments after values, a URL with a port, YAML 1.1's yes/null spellings."""
    path = write_config(
        tmp_path,
        "# mine\nautonomous_loop:\n  failure_threshold: 2  # fewer\n  retry_failed_steps: yes\nllm:\n"
        "  model: gpt-4.1\n  base_url: http://127.0.0.1:8080/v1  # a server of my own\nverify:\n"
        "project_dir: ./src\n",
    )
    data, lines = load_config_file(path)
    assert data == {"autonomous_loop": {"failure_threshold": 2, "retry_failed_steps": True},
                    "llm": {"model": "gpt-4.1", "base_url": "http://127.0.0.1:8080/v1"}, "verify": None,
                    "project_dir": "./src"}
    assert lines == {"autonomous_loop": 2, "autonomous_loop.failure_threshold": 3,
                     "autonomous_loop.retry_failed_steps": 4, "llm": 5, "llm.model": 6, "llm.base_url": 7,
                     "verify": 8, "project_dir": 9}


@pytest.mark.parametrize(("text", "words"), [
    ("llm:\n\tmodel: x\n", "2: invalid YAML: found character '\\t' that cannot start any token"),
    ("llm: *models\n", "1: invalid YAML: found undefined alias 'models'"),
])
def test_a_yaml_mistake_is_named_with_what_was_found(tmp_path: Path, text: str, words: str) -> None:
    """libyaml (the loader kiro uses) words these without the character or the name; the message
    says them, as PyYAML's own parser does."""
    write_config(tmp_path, text)
    assert config_error(tmp_path).startswith(f"config/autonomous_loop.yaml:{words}")


def test_a_control_character_names_its_line(tmp_path: Path) -> None:
    """libyaml counts the bytes up to it, not the characters: the line is right after text that is not ASCII."""
    write_config(tmp_path, "llm:\n  model: café\nverify: make\x07\n")
    message = config_error(tmp_path)
    assert message.startswith("config/autonomous_loop.yaml:3: invalid YAML: unacceptable character #x0007")


def test_an_environment_value_with_an_undecodable_byte_is_a_config_error(tmp_path: Path) -> None:
    """A byte that is not UTF-8 in a `KIRO_*` value reaches kiro as a lone surrogate: refused in one
    line naming the variable, not an internal error."""
    message = config_error(tmp_path, env={"KIRO_MAX_ITERATIONS": "5\udcff"})
    assert "KIRO_MAX_ITERATIONS" in message and "not a valid value" in message


def test_clock_times_need_no_quotes(tmp_path: Path) -> None:
    # YAML 1.1 reads an unquoted 17:30 as the base-60 number 1050.
    write_config(tmp_path, "guardrails:\n  active_hours: {start: 09:00, end: 17:30}\n")
    hours = resolve(tmp_path).guardrails.active_hours
    assert hours is not None and (hours.start, hours.end) == ("09:00", "17:30")


def test_bad_clock_time_is_explained(tmp_path: Path) -> None:
    write_config(tmp_path, "guardrails:\n  active_hours:\n    start: '9'\n    end: '17:30'\n")
    assert config_error(tmp_path) == (
        "config/autonomous_loop.yaml:3: guardrails.active_hours.start: "
        "should be a 24-hour time like \"09:00\" (got '9')"
    )


@pytest.mark.parametrize("depth", [1_001, 5_000])
def test_yaml_nested_deeper_than_libyaml_allows_is_refused_in_one_line_not_a_recursion_error(
        tmp_path: Path, depth: int) -> None:
    """The libyaml of PyYAML 6.0.4 (not 6.0.3) calls more than 1,000 levels a syntax error, so kiro's
    depth check found no depth; PyYAML's own loader, which kiro's config and frontmatter readers use
    for line numbers, then recursed on the text until Python's stack ran out ("internal error")."""
    from kiro.errors import TaskFileError
    from kiro.store import tasks

    deep = "a: " + "[" * depth + "]" * depth + "\n"
    path = write_config(tmp_path, deep)
    with pytest.raises(ConfigError, match="nested more than 64 levels deep"):
        load_config_file(path)
    with pytest.raises(TaskFileError, match="nested more than 64 levels deep"):
        tasks.parse("---\n" + deep + "---\n- [ ] 1. a\n", tmp_path / "tasks.md")


# -- what a person reads of a config kiro refuses ------------------------------------------------

# (a merged config, the one line kiro says of it); kiro's messages are built on pydantic's words, and
# these lines are the ones kiro has printed since the config was first a set of pydantic models
REFUSED: list[tuple[dict[Any, Any], str]] = [
    ({'autonomous_loop': {'max_iterations': 'lots'}},
     "autonomous_loop.max_iterations: Input should be a valid integer (got 'lots')"),
    ({'autonomous_loop': {'max_iterations': 0}},
     "autonomous_loop.max_iterations: Input should be greater than or equal to 1 (got 0)"),
    ({'autonomous_loop': {'max_iterations': 5.5}},
     "autonomous_loop.max_iterations: Input should be a valid integer, got a number with a "
     "fractional part (got 5.5)"),
    ({'autonomous_loop': {'max_iterations': None}},
     "autonomous_loop.max_iterations: Input should be a valid integer (got None)"),
    ({'autonomous_loop': {'max_iterations': [1]}},
     "autonomous_loop.max_iterations: Input should be a valid integer (got [1])"),
    ({'autonomous_loop': {'timeout_seconds': 0}},
     "autonomous_loop.timeout_seconds: Input should be greater than 0 (got 0)"),
    ({'autonomous_loop': {'timeout_seconds': 'x'}},
     "autonomous_loop.timeout_seconds: Input should be a valid number (got 'x')"),
    ({'autonomous_loop': {'timeout_seconds': float("nan")}},
     "autonomous_loop.timeout_seconds: Input should be a finite number (got nan)"),
    ({'autonomous_loop': {'timeout_seconds': float("inf")}},
     "autonomous_loop.timeout_seconds: Input should be a finite number (got inf)"),
    ({'autonomous_loop': {'timeout_seconds': -1.5}},
     "autonomous_loop.timeout_seconds: Input should be greater than 0 (got -1.5)"),
    ({'autonomous_loop': {'save_state_every_iteration': False}},
     "autonomous_loop.save_state_every_iteration: false is not supported: kiro saves the state at "
     "every step boundary, which its crash safety depends on; set it to true or remove the key (got "
     "False)"),
    ({'autonomous_loop': {'check_done_folder': 2}},
     "autonomous_loop.check_done_folder: Input should be a valid boolean (got 2)"),
    ({'autonomous_loop': {'check_done_folder': 'maybe'}},
     "autonomous_loop.check_done_folder: Input should be a valid boolean (got 'maybe')"),
    ({'autonomous_loop': {'max_iteration': 5}},
     "unknown key 'autonomous_loop.max_iteration' (did you mean 'max_iterations'?)"),
    ({'autonomous_loop': {'max_iterations': 0, 'failure_threshold': 0}, 'executor': 'x'},
     "autonomous_loop.max_iterations: Input should be greater than or equal to 1 (got 0) (and 2 "
     "more: autonomous_loop.failure_threshold, executor)"),
    ({'autonomous_loop': 5},
     "autonomous_loop: should be a mapping of keys (got 5)"),
    ({'autonomous_loop': 'x'},
     "autonomous_loop: should be a mapping of keys (got 'x')"),
    ({'autonomous_loop': [1]},
     "autonomous_loop: should be a mapping of keys (got [1])"),
    ({'resource_limits': {'max_cpu_percent': 0}},
     "resource_limits.max_cpu_percent: Input should be greater than 0 (got 0)"),
    ({'resource_limits': {'zzz': 1}},
     "unknown key 'resource_limits.zzz' (valid keys here: max_memory_mb, max_cpu_percent, "
     "max_disk_writes_per_minute, max_api_calls_per_minute)"),
    ({'llm': {'model': 4}},
     "llm.model: Input should be a valid string (got 4)"),
    ({'llm': {'model': None}},
     "llm.model: Input should be a valid string (got None)"),
    ({'llm': {'wrap_up_threshold': 1.5}},
     "llm.wrap_up_threshold: Input should be less than or equal to 1 (got 1.5)"),
    ({'llm': {'wrap_up_threshold': 0}},
     "llm.wrap_up_threshold: Input should be greater than 0 (got 0)"),
    ({'llm': {'precheck': 'never'}},
     "llm.precheck: Input should be 'scheduled_runs' or 'every_iteration' (got 'never')"),
    ({'llm': {'prices': {'gpt': {'input_per_1m': 1}}}},
     "llm.prices.gpt.output_per_1m: required key missing"),
    ({'llm': {'prices': {'gpt': {'input_per_1m': 1, 'output_per_1m': -1}}}},
     "llm.prices.gpt.output_per_1m: Input should be greater than or equal to 0 (got -1)"),
    ({'llm': {'prices': {'gpt': 5}}},
     "llm.prices.gpt: should be a mapping of keys (got 5)"),
    ({'llm': {'prices': [1]}},
     "llm.prices: should be a mapping of keys (got [1])"),
    ({'llm': {'modle': 'x'}},
     "unknown key 'llm.modle' (did you mean 'model'?)"),
    ({'llm': {'base_url': 5}},
     "llm.base_url: Input should be a valid string (got 5)"),
    ({'tools': {'shell': {'enabled': True, 'allow': ['git status', 'python']}}},
     "tools.shell.allow: 'python': python is an interpreter: runs code from its arguments or from "
     "files the agent writes; remove it, or set tools.shell.trust_agent_code: true to accept that "
     "the agent runs code of its own (got ['git status', 'python'])"),
    ({'tools': {'shell': {'allow': 'git'}}},
     "tools.shell.allow: Input should be a valid list (got 'git')"),
    ({'tools': {'shell': {'allow': [1, 'ls']}}},
     "tools.shell.allow.0: Input should be a valid string (got 1)"),
    ({'tools': {'shell': {'allow': None}}},
     "tools.shell.allow: Input should be a valid list (got None)"),
    ({'tools': {'shell': {'max_output_chars': 5}}},
     "tools.shell.max_output_chars: Input should be greater than or equal to 100 (got 5)"),
    ({'tools': {'shell': {'allow': ['python'], 'trust_agent_code': 'x'}}},
     "tools.shell.trust_agent_code: Input should be a valid boolean (got 'x') (and 1 more: "
     "tools.shell.allow)"),
    ({'guardrails': {'active_hours': {'start': '9', 'end': '17:30'}}},
     "guardrails.active_hours.start: should be a 24-hour time like \"09:00\" (got '9')"),
    ({'guardrails': {'active_hours': {'start': '09:00'}}},
     "guardrails.active_hours.end: required key missing"),
    ({'guardrails': {'active_hours': 'x'}},
     "guardrails.active_hours: should be a mapping of keys (got 'x')"),
    ({'guardrails': {'loop_detection_repeats': 1}},
     "guardrails.loop_detection_repeats: Input should be greater than or equal to 2 (got 1)"),
    ({'guardrails': {'max_cost_usd': 0}},
     "guardrails.max_cost_usd: Input should be greater than 0 (got 0)"),
    ({'guardrails': {'active_hours': {'start': 900, 'end': '10:00'}}},
     "guardrails.active_hours.start: Input should be a valid string (got 900)"),
    ({'executor': 'bogus'},
     "executor: Input should be 'openai', 'command' or 'shell' (got 'bogus')"),
    ({'agent': 'gpt'},
     "agent: Input should be 'acp', 'aider', 'claude', 'claude-acp', 'codex', 'codex-acp', 'copilot', 'gemini', "
     "'gemini-acp', 'opencode', 'opencode-acp' or 'qwen' (got 'gpt')"),
    ({'agent': 'claude', 'acp_command': ['x']},  # which presets speak ACP: their speaks_acp, not their names
     "acp_command: is the command line of an ACP agent, but agent is 'claude'; set agent: acp (or an ACP preset: "
     "claude-acp, codex-acp, gemini-acp, opencode-acp), or remove acp_command (got ['x'])"),
    ({'agent_args': ['a', 1]},
     "agent_args.1: Input should be a valid string (got 1)"),
    ({'agent_args': 'x'},
     "agent_args: Input should be a valid list (got 'x')"),
    ({'command_success': 'x'},
     "command_success: Input should be 'checkbox' or 'exit_code' (got 'x')"),
    ({'step_timeout_seconds': 0},
     "step_timeout_seconds: Input should be greater than 0 (got 0)"),
    ({'project_dir': 5},
     "project_dir: Input should be a valid string (got 5)"),
    ({'max_parallel_loops': 0},
     "max_parallel_loops: Input should be greater than or equal to 1 (got 0)"),
    ({'on_event': {'done': 'x'}},
     "on_event: unknown event 'done': use one of completed, failed, paused, limit, finished (a "
     "loop's every event is in Logs/<task_id>.jsonl; `kiro loop logs --follow --json` streams them) "
     "(got {'done': 'x'})"),
    ({'on_event': {'completed': 5}},
     "on_event.completed: Input should be a valid string (got 5)"),
    ({'on_event': 'x'},
     "on_event: should be a mapping of keys (got 'x')"),
    ({'secret_env': 'A'},
     "secret_env: Input should be a valid list (got 'A')"),
    ({'checkpoints': 'maybe'},
     "checkpoints: Input should be 'git' or 'off' (got 'maybe')"),
    ({'isolation': 'x'},
     "isolation: Input should be 'none' or 'worktree' (got 'x')"),
    ({'backend': 'x'},
     "backend: Input tag 'x' found using 'kind' does not match any of the expected tags: 'local', "
     "'temporal' (got {'kind': 'x'})"),
    ({'backend': {'kind': 'temporal', 'adress': 'x'}},
     "unknown key 'backend.adress'"),
    ({'backend': {'kind': 'local', 'address': 'x'}},
     "unknown key 'backend.address'"),
    ({'backend': {}},
     "backend: Unable to extract tag using discriminator 'kind' (got {})"),
    ({'backend': 5},
     "backend: should be a mapping of keys (got 5)"),
    ({'backend': None},
     "backend: should be a mapping of keys (got None)"),
    ({'backend': {'kind': 'temporal', 'heartbeat_seconds': 100}},
     "backend.heartbeat_seconds: Input should be less than or equal to 60 (got 100)"),
    ({'backend': 'temporal', 'checkpoints': 'off'},
     "backend: the temporal backend needs git checkpoints (each step's work travels as a commit on "
     "branch kiro/<task_id>); remove checkpoints: off, or use backend: local (got 'temporal')"),
    ({'backend': 'temporal', 'merge': 'auto'},
     "backend: the temporal backend leaves branch kiro/<task_id> for review; merge: auto is not "
     "built on it (docs/scale-out.md §12); use merge: manual or backend: local (got 'temporal')"),
    ({'backend': {'kind': 5}},
     "backend: Input tag '5' found using 'kind' does not match any of the expected tags: 'local', "
     "'temporal' (got {'kind': 5})"),
    ({'nope': {'x': 1}},
     "unknown key 'nope' (valid keys here: autonomous_loop, resource_limits, executor, "
     "executor_command, agent, agent_args, command_success, step_timeout_seconds, "
     "step_idle_timeout_seconds, project_dir, verify, llm, tools, guardrails, approval, "
     "max_parallel_loops, ...)"),
    ({'zzz': 1, 'yyy': 2},
     "unknown key 'zzz' (valid keys here: autonomous_loop, resource_limits, executor, "
     "executor_command, agent, agent_args, command_success, step_timeout_seconds, "
     "step_idle_timeout_seconds, project_dir, verify, llm, tools, guardrails, approval, "
     "max_parallel_loops, ...) (and 1 more: yyy)"),
    ({'verify': ['a']},
     "verify: Input should be a valid string (got ['a'])"),
    ({5: 1},
     "5: Keys should be strings (got 5)"),
    ({'llm': {'prices': {'gpt': {'input_per_1m': '1', 'output_per_1m': 'x'}}}},
     "llm.prices.gpt.output_per_1m: Input should be a valid number (got 'x')"),
    ({'resource_limits': {'max_api_calls_per_minute': 0.5}},
     "resource_limits.max_api_calls_per_minute: Input should be a valid integer, got a number with a "
     "fractional part (got 0.5)"),
    ({'autonomous_loop': {'timeout_seconds': 'inf'}},
     "autonomous_loop.timeout_seconds: Input should be a finite number (got 'inf')"),
]


@pytest.mark.parametrize(("data", "message"), REFUSED, ids=[str(i) for i in range(len(REFUSED))])
def test_a_config_kiro_refuses_is_described_in_one_line(data: dict[Any, Any], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Config.model_validate(data)
    assert str(_validation_error(caught.value, {})) == message


def test_lax_values_are_taken() -> None:
    """A whole number written as text, "off" for false, a section left empty (YAML null): taken."""
    cfg = Config.model_validate({
        "autonomous_loop": {"max_iterations": " 7 ", "failure_threshold": 5.0, "timeout_seconds": "1e3",
                            "check_done_folder": "off", "check_stop_hook": 1.0, "max_step_retries": "1_0"},
        "llm": {"api_key_env": b"KEY", "prices": None}, "tools": {"shell": None},
        "checkpoints": False, "backend": "local", "include_optional": "yes", "on_event": None,
    })
    loop = cfg.autonomous_loop
    assert (loop.max_iterations, loop.failure_threshold, loop.timeout_seconds) == (7, 5, 1000.0)
    assert (loop.check_done_folder, loop.check_stop_hook, loop.max_step_retries) == (False, True, 10)
    assert cfg.llm.api_key_env == "KEY" and cfg.llm.prices == {} and cfg.tools.shell.enabled is False
    assert cfg.checkpoints == "off" and cfg.backend.kind == "local" and cfg.include_optional is True
    assert cfg.on_event == {}
    # a number field's default is written with a point
    assert Config().model_dump(mode="json")["autonomous_loop"]["timeout_seconds"] == 43200.0  # 12 h, a night
    assert isinstance(Config().model_dump(mode="json")["autonomous_loop"]["timeout_seconds"], float)
    assert isinstance(Config().autonomous_loop.timeout_seconds, float)  # what a message or an event shows


def test_text_with_a_nul_or_a_byte_that_is_not_utf8_is_refused_by_key(tmp_path: Path) -> None:
    """A NUL in `state_directory` (YAML "\\0") or a byte that is not UTF-8 in a `KIRO_*` text variable passed
    the check, then ended a started loop with an internal error."""
    write_config(tmp_path, 'autonomous_loop:\n  state_directory: "st\\0ate"\n')
    message = config_error(tmp_path)
    assert message.startswith("config/autonomous_loop.yaml:2: autonomous_loop.state_directory: holds a NUL"), message
    write_config(tmp_path, 'agent_args: ["--yes", "a\\0b"]\n')
    assert config_error(tmp_path).startswith("config/autonomous_loop.yaml:1: agent_args: holds a NUL")
    write_config(tmp_path, "")
    for var in ("KIRO_VERIFY", "KIRO_MODEL", "KIRO_LLM__API_KEY_ENV"):
        message = config_error(tmp_path, env={var: "x\udcff"})
        assert message.startswith(f"environment {var}: holds a byte that is not UTF-8"), message


def test_every_key_that_can_hold_text_refuses_a_nul() -> None:
    """The plain-text check is added to each key whose type can hold text, in one place (issue #41: it wrapped
    every key, numbers and flags too, at every command's start): no key that takes text lets a NUL through,
    whatever section it is in; a key of a narrower type (a pattern, an agent's name) refuses it as its type."""
    from typing import get_origin

    from kiro.store import config
    from kiro.store.models import inner_types, models_within

    config._build()
    refused: dict[str, list[str]] = {"by the plain-text check": [], "by its type": [], "NOT AT ALL": []}
    for model in models_within(Config):
        for name, field in model.model_fields.items():
            if not any(inner is str for inner in inner_types(field.annotation)):
                continue
            kinds = {get_origin(a) for a in inner_types(field.annotation)}
            value: Any = ["a\0b"] if list in kinds else {"k": "a\0b"} if dict in kinds else "a\0b"
            key = field.alias or name
            try:
                model.model_validate({key: value})
            except ValidationError as exc:
                said = [e["msg"] for e in exc.errors() if e["loc"][:1] == (key,)]
                refused["by the plain-text check" if any("NUL" in m for m in said) else "by its type"].append(key)
            else:
                refused["NOT AT ALL"].append(f"{model.__name__}.{key}")
    for how, keys in refused.items():
        print(f"{len(keys)} keys refused a NUL {how}: {', '.join(keys)}")
    assert refused["NOT AT ALL"] == [] and len(refused["by the plain-text check"]) >= 20


@pytest.mark.parametrize(("url", "words"), [
    ("http://127.0.0.1:99999/v1", "Port out of range 0-65535"),
    ("http://127.0.0.1:port/v1", "could not be cast to integer"),
    ("http://[::1/v1", "Invalid IPv6 URL"),
    ("127.0.0.1:8080/v1", "http:// or https://"),
    ("http:///v1", "with a host"),
])
def test_an_llm_base_url_kiro_cannot_use_is_refused_without_echoing_it(tmp_path: Path, url: str,
                                                                       words: str) -> None:
    """Port 99999 passed the check and ended the loop's first request with an internal error. The URL is
    not shown: a base_url may hold a password."""
    secret = url.replace("://", "://me:hunter2@", 1) if "://" in url else url
    write_config(tmp_path, f"llm:\n  base_url: {secret!r}\n")
    message = config_error(tmp_path)
    assert message.startswith("config/autonomous_loop.yaml:2: llm.base_url: "), message
    assert words in message and "hunter2" not in message, message
    message = config_error(tmp_path / "none", env={"KIRO_BASE_URL": secret})
    assert message.startswith("environment KIRO_BASE_URL: ") and "hunter2" not in message, message


def test_an_llm_base_url_kiro_can_use_is_kept_as_written(tmp_path: Path) -> None:
    for url in ("http://127.0.0.1:8080/v1", "https://me:pw@proxy.example/v1?api_key=x", "http://[::1]:65535/",
                "https://api.openai.com/v1"):
        write_config(tmp_path, f"llm:\n  base_url: {url!r}\n")
        assert resolve(tmp_path).llm.base_url == url
