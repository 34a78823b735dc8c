"""`OperatorConfig.from_env`: every variable of docs/operator.md#configuration, its default, its range,
the `JANGAR_` aliases and the precedence of `AGENTS_…` over them."""

from __future__ import annotations

import logging

import pytest

from agentrun_operator.cli import main as cli_main
from agentrun_operator.config import (
    DEFAULT_REPORTER_IMAGE,
    DEFAULT_RUNNER_IMAGE,
    ConfigError,
    OperatorConfig,
)


def test_defaults_without_any_variable() -> None:
    config = OperatorConfig.from_env({})
    assert config == OperatorConfig()
    assert config.loops_enabled is False
    assert config.loop_max_iterations == 20
    assert config.loop_status_history_limit == 50
    assert config.watched_namespaces == ()
    assert config.runner_image == DEFAULT_RUNNER_IMAGE
    assert config.reporter_image == DEFAULT_REPORTER_IMAGE
    assert config.job_ttl_seconds_after_recorded == 300
    assert config.resync_seconds == 30.0
    assert config.reference_grace_seconds == 30.0
    assert config.termination_grace_seconds is None  # pods keep Kubernetes' default grace
    assert config.pod_fs_group == 10001


def test_every_documented_variable_is_read() -> None:
    config = OperatorConfig.from_env(
        {
            "AGENTS_CONTROLLER_WORKFLOW_LOOPS_ENABLED": "true",
            "AGENTS_CONTROLLER_WORKFLOW_LOOP_MAX_ITERATIONS": "100",
            "AGENTS_CONTROLLER_WORKFLOW_LOOP_STATUS_HISTORY_LIMIT": "7",
            "AGENTS_CONTROLLER_NAMESPACES": " team-a, team-b ,,",
            "AGENTS_AGENT_RUNNER_IMAGE": "runner:2",
            "AGENTS_REPORTER_IMAGE": "reporter:3",
            "AGENTS_CONTROLLER_JOB_TTL_SECONDS": "0",
            "AGENTS_CONTROLLER_RESYNC_SECONDS": "5",
            "AGENTS_CONTROLLER_REFERENCE_GRACE_SECONDS": "0",
            "AGENTS_CONTROLLER_TERMINATION_GRACE_SECONDS": "45",
            "AGENTS_CONTROLLER_POD_FS_GROUP": "4242",
        }
    )
    assert config == OperatorConfig(
        loops_enabled=True,
        loop_max_iterations=100,
        loop_status_history_limit=7,
        watched_namespaces=("team-a", "team-b"),
        runner_image="runner:2",
        reporter_image="reporter:3",
        job_ttl_seconds_after_recorded=0,
        resync_seconds=5.0,
        reference_grace_seconds=0.0,
        termination_grace_seconds=45,
        pod_fs_group=4242,
    )


def test_pod_fs_group_zero_means_none() -> None:
    """docs/operations.md#claim-storage: where a policy fixes the groups, the operator sets none."""
    assert OperatorConfig.from_env({"AGENTS_CONTROLLER_POD_FS_GROUP": "0"}).pod_fs_group is None


@pytest.mark.parametrize(
    ("name", "value", "attribute", "expected"),
    [
        ("CONTROLLER_WORKFLOW_LOOPS_ENABLED", "true", "loops_enabled", True),
        ("CONTROLLER_WORKFLOW_LOOP_MAX_ITERATIONS", "33", "loop_max_iterations", 33),
        ("CONTROLLER_WORKFLOW_LOOP_STATUS_HISTORY_LIMIT", "9", "loop_status_history_limit", 9),
        ("CONTROLLER_NAMESPACES", "ns1", "watched_namespaces", ("ns1",)),
        ("AGENT_RUNNER_IMAGE", "r:1", "runner_image", "r:1"),
        ("REPORTER_IMAGE", "rep:1", "reporter_image", "rep:1"),
        ("CONTROLLER_JOB_TTL_SECONDS", "60", "job_ttl_seconds_after_recorded", 60),
        ("CONTROLLER_RESYNC_SECONDS", "11", "resync_seconds", 11.0),
        ("CONTROLLER_REFERENCE_GRACE_SECONDS", "5", "reference_grace_seconds", 5.0),
        ("CONTROLLER_TERMINATION_GRACE_SECONDS", "0", "termination_grace_seconds", 0),
        ("CONTROLLER_POD_FS_GROUP", "2000", "pod_fs_group", 2000),
    ],
)
def test_jangar_alias_of_every_variable(name: str, value: str, attribute: str, expected: object) -> None:
    """The reference design's names: `JANGAR_` in front of the whole `AGENTS_…` name."""
    config = OperatorConfig.from_env({f"JANGAR_AGENTS_{name}": value})
    assert getattr(config, attribute) == expected
    assert getattr(OperatorConfig(), attribute) != expected  # the alias really changed something


def test_agents_name_wins_over_its_jangar_alias() -> None:
    config = OperatorConfig.from_env(
        {
            "AGENTS_CONTROLLER_WORKFLOW_LOOP_MAX_ITERATIONS": "30",
            "JANGAR_AGENTS_CONTROLLER_WORKFLOW_LOOP_MAX_ITERATIONS": "40",
            "JANGAR_AGENTS_CONTROLLER_WORKFLOW_LOOPS_ENABLED": "true",
            "AGENTS_CONTROLLER_WORKFLOW_LOOPS_ENABLED": "false",
        }
    )
    assert config.loop_max_iterations == 30
    assert config.loops_enabled is False


def test_an_empty_agents_value_falls_back_to_the_alias_then_the_default() -> None:
    assert (
        OperatorConfig.from_env(
            {
                "AGENTS_CONTROLLER_WORKFLOW_LOOP_MAX_ITERATIONS": " ",
                "JANGAR_AGENTS_CONTROLLER_WORKFLOW_LOOP_MAX_ITERATIONS": "12",
            }
        ).loop_max_iterations
        == 12
    )
    assert (
        OperatorConfig.from_env({"AGENTS_CONTROLLER_WORKFLOW_LOOP_MAX_ITERATIONS": ""}).loop_max_iterations
        == 20
    )


def test_the_prefix_jangar_instead_of_agents_is_not_an_alias() -> None:
    """`JANGAR_CONTROLLER_…` (JANGAR_ replacing AGENTS_) is not a name the reference design used."""
    assert (
        OperatorConfig.from_env({"JANGAR_CONTROLLER_WORKFLOW_LOOPS_ENABLED": "true"}).loops_enabled is False
    )


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "yes", "on", " True "])
def test_true_spellings(value: str) -> None:
    assert OperatorConfig.from_env({"AGENTS_CONTROLLER_WORKFLOW_LOOPS_ENABLED": value}).loops_enabled is True


@pytest.mark.parametrize("value", ["0", "false", "no", "off", "False"])
def test_false_spellings(value: str) -> None:
    env = {"AGENTS_CONTROLLER_WORKFLOW_LOOPS_ENABLED": value}
    assert OperatorConfig.from_env(env).loops_enabled is False


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("AGENTS_CONTROLLER_WORKFLOW_LOOPS_ENABLED", "maybe", "expected true or false"),
        ("JANGAR_AGENTS_CONTROLLER_WORKFLOW_LOOPS_ENABLED", "2", "expected true or false"),
        ("AGENTS_CONTROLLER_WORKFLOW_LOOP_MAX_ITERATIONS", "0", "expected an integer in 1..1000"),
        ("AGENTS_CONTROLLER_WORKFLOW_LOOP_MAX_ITERATIONS", "1001", "expected an integer in 1..1000"),
        ("JANGAR_AGENTS_CONTROLLER_WORKFLOW_LOOP_MAX_ITERATIONS", "ten", "expected an integer in 1..1000"),
        ("AGENTS_CONTROLLER_WORKFLOW_LOOP_STATUS_HISTORY_LIMIT", "0", "expected an integer in 1..1000"),
        ("AGENTS_CONTROLLER_JOB_TTL_SECONDS", "-1", "expected an integer in 0..604800"),
        ("AGENTS_CONTROLLER_RESYNC_SECONDS", "3601", "expected an integer in 1..3600"),
        ("AGENTS_CONTROLLER_REFERENCE_GRACE_SECONDS", "-1", "expected an integer in 0..3600"),
        ("AGENTS_CONTROLLER_REFERENCE_GRACE_SECONDS", "2.5", "expected an integer in 0..3600"),
        ("AGENTS_CONTROLLER_TERMINATION_GRACE_SECONDS", "3601", "expected an integer in 0..3600"),
        ("AGENTS_CONTROLLER_TERMINATION_GRACE_SECONDS", "-1", "expected an integer in 0..3600"),
        ("AGENTS_CONTROLLER_POD_FS_GROUP", "-1", "expected an integer in 0..2147483647"),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable(key: str, value: str, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        OperatorConfig.from_env({key: value})
    assert str(err.value) == f"{key}={value!r}: {expected}"


def test_the_operator_command_stops_at_start_on_a_bad_value(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/operator.md: a bad value stops the operator at start with the variable named (exit 2)."""
    monkeypatch.setenv("AGENTS_CONTROLLER_WORKFLOW_LOOP_MAX_ITERATIONS", "5000")
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:  # `agentrun operator` configures the root logger before it reads the configuration
        assert cli_main(["operator"]) == 2
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    err = capsys.readouterr().err
    assert "AGENTS_CONTROLLER_WORKFLOW_LOOP_MAX_ITERATIONS='5000'" in err
    assert "invalid configuration" in err


def test_from_env_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JANGAR_AGENTS_CONTROLLER_WORKFLOW_LOOP_STATUS_HISTORY_LIMIT", "4")
    assert OperatorConfig.from_env().loop_status_history_limit == 4
