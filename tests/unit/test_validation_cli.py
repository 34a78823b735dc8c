"""`agentrun validate FILE…`: offline validation with one actionable line per problem."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from agentrun_operator.validation_cli import main
from tests.fixtures import invalid_agentruns
from tests.fixtures.object_names import NAMES

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REFERENCE = FIXTURES / "reference"
LINE = re.compile(
    r"^(?P<file>[^:]+): (?P<object>[\w]+/[\w.-]+|\S+ \(document \d+\)): (?P<path>\S+): (?P<message>.+) "
    r"\(value: (?P<value>.*); fix: (?P<fix>.+); see (?P<docs>docs/[\w./-]+(#[\w-]+)?)\)$"
)

GOOD_RUN = """\
apiVersion: agents.proompteng.ai/v1alpha1
kind: AgentRun
metadata: {name: good}
spec:
  workload:
    volumes: [{name: workspace, type: pvc, claimName: ws, mountPath: /workspace}]
  workflow:
    steps:
      - name: plan
      - name: work
        when: "steps.plan.control.go == true"
        loop:
          maxIterations: 5
          items: "steps.plan.control.targets"
          state: {required: true, volumeNames: [workspace]}
"""

BAD_RUN = """\
apiVersion: agents.proompteng.ai/v1alpha1
kind: AgentRun
metadata: {name: bad}
spec:
  workload:
    volumes: [{name: workspace, type: emptyDir, mountPath: /workspace}]
  workflow:
    steps:
      - name: work
        loop:
          maxIterations: 30
          condition: {expression: "iteration.last.control.continue =="}
          state: {required: true, volumeNames: [workspace]}
"""

TYPO_RUN = """\
apiVersion: agents.proompteng.ai/v1alpha1
kind: AgentRun
metadata: {name: typo}
spec:
  workflow:
    steps:
      - name: work
        loop: {maxIteration: 3}
"""

OTHER_KINDS = """\
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: ws}
spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
---
apiVersion: agents.proompteng.ai/v1alpha1
kind: AgentProvider
metadata: {name: codex}
spec: {image: codex:1, command: [codex]}
---
apiVersion: agents.proompteng.ai/v1alpha1
kind: Agent
metadata: {name: codex-agent}
spec: {providerRef: {name: codex}, defaults: {retries: 2}}
---
apiVersion: agents.proompteng.ai/v1alpha1
kind: ImplementationSpec
metadata: {name: task}
spec: {text: "Implement the thing."}
"""


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_valid_files_exit_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = [write(tmp_path, "good.yaml", GOOD_RUN), write(tmp_path, "others.yaml", OTHER_KINDS)]
    assert main(paths) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert "4 object(s) valid" in err


def test_reference_manifests_are_valid() -> None:
    assert main([str(p) for p in sorted(REFERENCE.glob("*.yaml"))]) == 0


def test_problems_exit_one_with_one_actionable_line_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "bad.yaml", BAD_RUN)
    assert main([path]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    parsed = [LINE.match(line) for line in lines]
    assert all(parsed), lines
    by_path = {m["path"]: m for m in parsed if m}
    cap = by_path["spec.workflow.steps[0].loop.maxIterations"]
    assert cap["file"] == path and cap["object"] == "AgentRun/bad"
    assert cap["value"] == "30" and "cap of 20" in cap["message"]
    assert cap["docs"] == "docs/concepts.md#iteration-cap"
    assert "type pvc" in by_path["spec.workflow.steps[0].loop.state.volumeNames"]["message"]
    cel = by_path["spec.workflow.steps[0].loop.condition.expression"]
    assert "unexpected end of expression" in cel["message"]


def test_max_iterations_option_sets_the_cap(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "bad.yaml", BAD_RUN)
    main([path], max_iterations=100)
    out = capsys.readouterr().out
    assert "maxIterations" not in out


def test_loops_disabled_flags_every_loop(capsys: pytest.CaptureFixture[str]) -> None:
    paths = [str(p) for p in sorted(REFERENCE.glob("*.yaml"))]
    assert main(paths, loops_enabled=False) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert all("workflow loops are disabled" in line and "#feature-flag" in line for line in lines)


def test_parse_errors_become_lines_with_the_field_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "typo.yaml", TYPO_RUN)
    assert main([path]) == 1
    lines = capsys.readouterr().out.splitlines()
    paths = {m["path"] for m in (LINE.match(line) for line in lines) if m}
    assert paths == {"spec.workflow.steps[0].loop.maxIterations", "spec.workflow.steps[0].loop.maxIteration"}
    assert any("unknown field" in line for line in lines)
    assert any("required field is missing" in line for line in lines)


def test_other_kinds_are_checked_with_their_models(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad_agent = (
        "apiVersion: agents.proompteng.ai/v1alpha1\nkind: Agent\nmetadata: {name: a}\n"
        "spec: {defaults: {retries: -1}}\n"
    )
    assert main([write(tmp_path, "agent.yaml", bad_agent)]) == 1
    line = capsys.readouterr().out.strip()
    match = LINE.match(line)
    assert match and match["object"] == "Agent/a" and match["path"] == "spec.defaults.retries"
    assert match["docs"] == "docs/api.md#fields-agent"


def test_unknown_kind_of_our_group_is_a_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = "apiVersion: agents.proompteng.ai/v1alpha1\nkind: AgentRunz\nmetadata: {name: x}\n"
    assert main([write(tmp_path, "x.yaml", text)]) == 1
    assert "unknown kind 'AgentRunz'" in capsys.readouterr().out


def test_yaml_errors_and_missing_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = write(tmp_path, "broken.yaml", "kind: [unclosed\n")
    assert main([broken, str(tmp_path / "absent.yaml")]) == 1
    out = capsys.readouterr().out
    assert f"{broken}: not valid YAML" in out
    assert "absent.yaml: cannot read the file" in out


def test_non_object_documents_are_problems(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([write(tmp_path, "list.yaml", "- a\n- b\n")]) == 1
    assert "is not a Kubernetes object" in capsys.readouterr().out


def test_cli_entry_point_is_wired(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from agentrun_operator.cli import main as cli_main

    assert cli_main(["validate", write(tmp_path, "bad.yaml", BAD_RUN), "--max-iterations", "40"]) == 1
    out = capsys.readouterr().out
    assert "maxIterations" not in out and "type pvc" in out


INVALID = invalid_agentruns


@pytest.mark.parametrize(
    ("case", "manifest", "expected"),
    INVALID.INVALID_AGENTRUNS,
    ids=[c for c, _, _ in INVALID.INVALID_AGENTRUNS],
)
def test_every_invalid_fixture_names_the_apiservers_field_path(
    case: str, manifest: dict[str, object], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each fixture breaks one rule; `agentrun validate` reports it at exactly the field path the
    apiserver names (tests/integration/test_crds_apiserver.py checks the apiserver's side), with
    the rule's own message where the rule is a CEL rule, and one actionable line per problem."""
    path = write(tmp_path, f"{case}.yaml", yaml.safe_dump(manifest))
    assert main([path]) == 1
    lines = capsys.readouterr().out.splitlines()
    parsed = [LINE.match(line) for line in lines]
    assert lines and all(parsed), lines
    assert [m["path"] for m in parsed if m] == [expected]
    fragment = INVALID.RULE_MESSAGES.get(case)
    if fragment is not None:
        assert fragment in lines[0]


def test_object_rules_name_the_field_and_its_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An object-level rule is reported at its field with that field's value, not the whole object."""
    cases = {c: m for c, m, _ in INVALID.INVALID_AGENTRUNS}
    path = write(tmp_path, "runtime.yaml", yaml.safe_dump(cases["loop-with-job-runtime"]))
    main([path])
    match = LINE.match(capsys.readouterr().out.splitlines()[0])
    assert match and match["path"] == "spec.runtime.type" and match["value"] == '"job"'
    assert match["docs"] == "docs/api.md#runtime-type"
    path = write(tmp_path, "claim.yaml", yaml.safe_dump(cases["volume-pvc-without-claim-name"]))
    main([path])
    match = LINE.match(capsys.readouterr().out.splitlines()[0])
    assert match and match["path"] == "spec.workload.volumes[0].claimName" and match["value"] == "null"
    assert match["fix"] == "add claimName"


def test_control_flow_problems_are_one_actionable_line_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deep: dict[str, object] = {"name": "d4"}
    for level in (3, 2):
        deep = {"name": f"d{level}", "steps": [deep]}
    manifest = {
        "apiVersion": "agents.proompteng.ai/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": "flow"},
        "spec": {
            "workload": {"image": "busybox", "command": ["true"]},
            "workflow": {
                "maxNestingDepth": 3,
                "steps": [
                    {"name": "d1", "steps": [deep]},
                    {"name": "use", "loop": {"maxIterations": 2, "items": "outputs.later"}},
                ],
            },
        },
    }
    path = tmp_path / "flow.yaml"
    path.write_text(json.dumps(manifest))
    assert main([str(path)]) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if LINE.match(line)]
    assert any("NestingTooDeep" in line and "d1/d2/d3/d4" in line for line in lines), lines
    assert any("outputs.later" in line and "#collected-outputs" in line for line in lines), lines


def test_version_control_and_artifacts_are_checked_when_the_file_holds_the_objects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    git_loop = (Path(__file__).resolve().parents[2] / "examples" / "git-loop.yaml").read_text()
    assert main([write(tmp_path, "ok.yaml", git_loop)]) == 0
    denied = git_loop.replace('allow: ["demo/*"]', 'deny: ["demo/*"]')
    assert main([write(tmp_path, "denied.yaml", denied)]) == 1
    out = capsys.readouterr().out
    assert "AgentRun/git-loop: spec.parameters.repository: repository 'demo/app.git' is denied" in out
    assert "docs/api.md#version-control" in out
    contract = (Path(__file__).resolve().parents[2] / "examples" / "runner-contract.yaml").read_text()
    lost = contract.replace("path: /workspace/out/report.md", "path: /report.md")
    assert main([write(tmp_path, "lost.yaml", lost)]) == 1
    assert "outputArtifacts[0] ('report') is at /report.md, on no volume" in capsys.readouterr().out
    homed = contract.replace("path: /workspace/out/report.md", "path: /elsewhere/report.md")
    assert main([write(tmp_path, "homed.yaml", homed)]) == 0  # an emptyDir holds it


@pytest.mark.parametrize(
    ("where", "path"),
    [
        (lambda m: m["spec"]["workflow"]["steps"][0], "spec.workflow.steps[0]"),
        (
            lambda m: m["spec"]["workflow"]["steps"][0]["steps"][1],
            "spec.workflow.steps[0].steps[1]",
        ),
    ],
    ids=["top-level step", "child of a loop body"],
)
def test_interval_seconds_outside_its_loop_is_told_where_it_belongs(
    where: object, path: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`intervalSeconds` is a field of `loop`; written on the step (top level or nested, where the
    CRD schema keeps unknown fields and only the operator's validation sees it) the error names the
    field, its value, where to move it and the docs anchor."""
    manifest = invalid_agentruns.base_manifest("misplaced")
    step = manifest["spec"]["workflow"]["steps"][0]
    step.pop("implementationSpecRef")
    step["steps"] = [{"name": "check"}, {"name": "report"}]
    where(manifest)["intervalSeconds"] = 30  # type: ignore[operator]
    assert main([write(tmp_path, "m.yaml", yaml.safe_dump(manifest))]) == 1
    match = LINE.match(capsys.readouterr().out.splitlines()[0])
    assert match, "not one actionable line"
    assert match["path"] == f"{path}.intervalSeconds" and match["value"] == "30"
    assert match["message"] == "intervalSeconds is a field of the step's loop, not of the step"
    assert f"{path}.loop.intervalSeconds" in match["fix"]
    assert match["docs"] == "docs/api.md#loop-intervalseconds"


@pytest.mark.parametrize("value", [-1, 86401])
def test_a_nested_loop_interval_out_of_range_is_refused_naming_the_field(
    value: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A loop inside a loop body: the CRD keeps nested steps as free-form JSON, so the operator's own
    validation (`agentrun validate`, the webhook) is what refuses it."""
    manifest = invalid_agentruns.base_manifest("nested-interval")
    step = manifest["spec"]["workflow"]["steps"][0]
    step.pop("implementationSpecRef")
    step["steps"] = [{"name": "poll", "loop": {"maxIterations": 3, "intervalSeconds": value}}]
    assert main([write(tmp_path, "m.yaml", yaml.safe_dump(manifest))]) == 1
    match = LINE.match(capsys.readouterr().out.splitlines()[0])
    assert match and match["path"] == "spec.workflow.steps[0].steps[0].loop.intervalSeconds"
    assert match["value"] == str(value) and match["docs"] == "docs/api.md#loop-intervalseconds"
    assert "between 0 and 86400" in match["message"] and "intervalSeconds: 300" in match["fix"]


# Any object label: `Kind/name` as written (also a name the API server refuses), `? (document N)`.
ANY_LINE = re.compile(LINE.pattern.replace(r"[\w]+/[\w.-]+", r"\S+/\S+"))

# The shapes the fuzz run crashed on (a traceback from `_objects_by_kind`): each is one
# problem line of its own document, and the rest of the file is still checked.
BROKEN_ENVELOPES = [
    ("metadata: 0", {"metadata": 0}, "metadata"),
    ('metadata: "x"', {"metadata": "x"}, "metadata"),
    ("metadata: []", {"metadata": []}, "metadata"),
    ("a list as a name", {"metadata": {"name": ["a"]}}, "metadata.name"),
    ("a mapping as a name", {"metadata": {"name": {"a": 1}}}, "metadata.name"),
    ("a list as the kind", {"kind": ["Agent"]}, "kind"),
    ("a mapping as the kind", {"kind": {}}, "kind"),
    ("a string as the spec", {"spec": "x"}, "spec"),
    ("a number as the spec", {"spec": 1.5}, "spec"),
    ("labels as a list", {"metadata": {"name": "p", "labels": ["a"]}}, "metadata.labels"),
    ("a name with a line break", {"metadata": {"name": "a\nb"}}, "metadata.name"),
]


@pytest.mark.parametrize(
    ("case", "edit", "field"), BROKEN_ENVELOPES, ids=[case for case, _, _ in BROKEN_ENVELOPES]
)
def test_a_broken_envelope_is_one_line_in_a_multi_document_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, edit: dict[str, object], field: str
) -> None:
    documents = list(yaml.safe_load_all(OTHER_KINDS))
    documents[1].update(edit)  # the AgentProvider, which the Agent refers to
    path = write(tmp_path, "file.yaml", yaml.safe_dump_all(documents))
    assert main([path]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1, lines
    match = ANY_LINE.match(lines[0])
    assert match and match["path"] == field, lines[0]
    assert match["object"] in (
        "AgentProvider/codex",
        "AgentProvider/p",
        "?/codex",
        "AgentProvider (document 2)",
    )


@pytest.mark.parametrize(("name", "valid"), NAMES, ids=[n[:40] for n, _ in NAMES])
def test_names_are_checked_as_the_api_server_checks_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, valid: bool
) -> None:
    """The same set goes to the real API server in tests/integration/test_admission_webhook.py."""
    run = yaml.safe_load(GOOD_RUN)
    run["metadata"]["name"] = name
    assert main([write(tmp_path, "run.yaml", yaml.safe_dump(run, allow_unicode=True))]) == (0 if valid else 1)
    out = capsys.readouterr().out
    if not valid:
        match = ANY_LINE.match(out.strip())
        assert match and match["path"] == "metadata.name" and match["docs"] == "docs/api.md#metadata-name", (
            out
        )
        assert "rename it, e.g." in match["fix"]


def test_the_suggested_name_is_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = yaml.safe_load(GOOD_RUN)
    run["metadata"]["name"] = "torghut-v3-<lane>-<yyyymmdd>"
    main([write(tmp_path, "run.yaml", yaml.safe_dump(run))])
    assert "e.g. 'torghut-v3-lane-yyyymmdd'" in capsys.readouterr().out


def test_a_name_or_a_generate_name_is_required(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = yaml.safe_load(GOOD_RUN)
    run["metadata"] = {"generateName": "nightly-"}
    assert main([write(tmp_path, "generated.yaml", yaml.safe_dump(run))]) == 0
    del run["metadata"]
    assert main([write(tmp_path, "nameless.yaml", yaml.safe_dump(run))]) == 1
    assert ": metadata.name: is required" in capsys.readouterr().out


@pytest.mark.parametrize("edit", [{"apiVersion": 0}, {"apiVersion": ""}, {"kind": None}, {"kind": ""}])
def test_an_object_without_a_type_is_a_problem_not_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: dict[str, object]
) -> None:
    """kubectl refuses an object without apiVersion or kind; validate must not pass it as "not ours"."""
    run = {**yaml.safe_load(GOOD_RUN), **edit}
    assert main([write(tmp_path, "run.yaml", yaml.safe_dump(run))]) == 1
    match = ANY_LINE.match(capsys.readouterr().out.strip())
    assert match and match["path"] == next(iter(edit)), match


@pytest.mark.parametrize(
    ("field", "value"), [("maxIterations", True), ("maxIterations", "3"), ("maxIterations", 2.5)]
)
def test_values_of_the_wrong_json_type_are_refused_as_the_api_server_refuses_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: object
) -> None:
    """Lax parsing took `maxIterations: true` as 1 (found by the webhook fuzz: the API server refuses
    it with `must be of type integer`)."""
    run = yaml.safe_load(GOOD_RUN)
    run["spec"]["workflow"]["steps"][1]["loop"][field] = value
    assert main([write(tmp_path, "run.yaml", yaml.safe_dump(run))]) == 1
    match = ANY_LINE.match(capsys.readouterr().out.strip())
    assert match and match["path"] == f"spec.workflow.steps[1].loop.{field}", match
