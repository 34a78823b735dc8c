"""The iteration Job manifest (docs/concepts.md#iteration-pod): names, labels, env, volumes, the
reporter, container resolution."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentrun_operator import naming
from agentrun_operator.api import AgentRun, parse_agentrun
from agentrun_operator.api.resources import AgentProviderSpec, AgentSpec, ImplementationSpecSpec
from agentrun_operator.config import OperatorConfig
from agentrun_operator.jobs import (
    ANNOTATION_RUN_NAME,
    CONTROL_FALLBACK_VOLUME,
    META_VOLUME,
    PlannedAttempt,
    build_iteration_job,
)
from agentrun_operator.resolution import References
from tests.support.manifests import agentrun

CONFIG = OperatorConfig(runner_image="runner:1", reporter_image="operator:1")
PVC = {"name": "workspace", "type": "pvc", "claimName": "ws", "mountPath": "/workspace"}


def run_of(spec: dict[str, Any], name: str = "demo") -> AgentRun:
    spec.setdefault("workflow", {"steps": [{"name": "work"}]})
    return parse_agentrun(agentrun(name, metadata={"namespace": "team", "uid": "uid-1"}, **spec))


def build(
    spec: dict[str, Any],
    attempt: PlannedAttempt | None = None,
    refs: References | None = None,
    name: str = "demo",
) -> dict[str, Any]:
    return build_iteration_job(
        run_of(spec, name), attempt or PlannedAttempt(1, 1, 1), refs or References(), CONFIG
    )


def pod(job: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = job["spec"]["template"]["spec"]
    return spec


def main(job: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = pod(job)["containers"][-1]
    return container


def env(job: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in main(job)["env"]}


def init(job: dict[str, Any], name: str) -> dict[str, Any]:
    """A helper container of the pod (the reporter, a regular container listed before main)."""
    return next(c for c in pod(job)["containers"] if c["name"] == name)


# ----------------------------------------------------------------------------------- identity


def test_name_labels_annotation_and_owner() -> None:
    job = build({"workload": {"image": "img"}}, PlannedAttempt(1, 2, 3, max_iterations=5))
    meta = job["metadata"]
    assert meta["name"] == "demo-step-1-iter-2-attempt-3"
    assert meta["namespace"] == "team"
    expected_labels = {
        naming.LABEL_RUN: "demo",
        naming.LABEL_STEP: "work",
        naming.LABEL_STEP_INDEX: "1",
        naming.LABEL_ITERATION: "2",
        naming.LABEL_ATTEMPT: "3",
        naming.LABEL_MANAGED_BY: naming.MANAGED_BY,
    }
    assert meta["labels"] == expected_labels
    assert job["spec"]["template"]["metadata"]["labels"] == expected_labels
    assert meta["annotations"] == {ANNOTATION_RUN_NAME: "demo"}
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "agents.proompteng.ai/v1alpha1",
            "kind": "AgentRun",
            "name": "demo",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def test_long_run_names_are_cut_to_63_characters_with_a_hash() -> None:
    long_name = "a-very-long-agentrun-name-that-goes-on-and-on-and-on-for-a-while"
    steps = [{"name": f"s{i}"} for i in range(1, 13)]
    job = build(
        {"workload": {"image": "img"}, "workflow": {"steps": steps}},
        PlannedAttempt(12, 345, 6),
        name=long_name,
    )
    name = job["metadata"]["name"]
    assert len(name) <= 63
    assert name.endswith("-step-12-iter-345-attempt-6")
    assert name == naming.job_name(long_name, 12, 345, 6)
    other = naming.job_name(long_name + "x", 12, 345, 6)
    assert other != name and len(other) <= 63
    label = job["metadata"]["labels"][naming.LABEL_RUN]
    assert len(label) <= 63 and label == naming.label_value(long_name)
    assert job["metadata"]["annotations"][ANNOTATION_RUN_NAME] == long_name


def test_the_manifest_is_deterministic_and_json() -> None:
    spec = {"workload": {"image": "img"}, "parameters": {"b": "2", "a": "1"}}
    first = build(spec, PlannedAttempt(1, 1, 1, previous_control={"z": 1, "a": 2}))
    second = build(spec, PlannedAttempt(1, 1, 1, previous_control={"a": 2, "z": 1}))
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)


# ----------------------------------------------------------------------------------- Job spec


def test_job_spec_basics() -> None:
    job = build({"workload": {"image": "img"}})
    assert job["spec"]["backoffLimit"] == 0
    assert pod(job)["restartPolicy"] == "Never"
    assert "ttlSecondsAfterFinished" not in job["spec"]
    assert "activeDeadlineSeconds" not in job["spec"]
    assert pod(job)["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in pod(job)


def test_active_deadline_from_step_timeout_or_agent_default() -> None:
    job = build(
        {"workload": {"image": "img"}, "workflow": {"steps": [{"name": "work", "timeoutSeconds": 90}]}}
    )
    assert job["spec"]["activeDeadlineSeconds"] == 90
    zero = build(
        {"workload": {"image": "img"}, "workflow": {"steps": [{"name": "work", "timeoutSeconds": 0}]}}
    )
    assert "activeDeadlineSeconds" not in zero["spec"]
    agent = AgentSpec.model_validate({"defaults": {"timeoutSeconds": 45}})
    from_agent = build({"workload": {"image": "img"}}, refs=References(agent=agent))
    assert from_agent["spec"]["activeDeadlineSeconds"] == 45


def test_main_is_not_pid_1_and_the_grace_period_is_kubernetes_default_unless_asked() -> None:
    """docs/design.md#grace-period: the pause container is PID 1 (so `sh -c` gets SIGTERM); the pod
    leaves `terminationGracePeriodSeconds` to Kubernetes (30 s), as the original controller's did,
    with or without loops, unless the installation sets one (an immediate cancel deletes the pods
    with a short grace instead, `test_an_immediate_cancel_grace_...`)."""
    for spec in ({}, {"workflow": {"steps": [{"name": "work", "loop": {"maxIterations": 2}}]}}):
        built = pod(build(spec))
        assert built["shareProcessNamespace"] is True
        assert "terminationGracePeriodSeconds" not in built
    configured = build_iteration_job(
        run_of({}), PlannedAttempt(1, 1, 1), References(), OperatorConfig(termination_grace_seconds=0)
    )
    assert pod(configured)["terminationGracePeriodSeconds"] == 0


def test_a_steps_grace_period_wins_over_the_operators() -> None:
    steps = [{"name": "a", "terminationGracePeriodSeconds": 60}, {"name": "b"}]
    spec = {"workflow": {"steps": steps}}
    assert pod(build(dict(spec)))["terminationGracePeriodSeconds"] == 60
    second = build(dict(spec), PlannedAttempt(2, 1, 1))
    assert "terminationGracePeriodSeconds" not in pod(second)
    set_ = OperatorConfig(termination_grace_seconds=10)
    installation = build_iteration_job(run_of(dict(spec)), PlannedAttempt(2, 1, 1), References(), set_)
    assert pod(installation)["terminationGracePeriodSeconds"] == 10
    zero = {"workflow": {"steps": [{"name": "a", "terminationGracePeriodSeconds": 0}]}}
    assert pod(build(zero))["terminationGracePeriodSeconds"] == 0


def test_a_grace_period_out_of_range_is_refused() -> None:
    for value in (-1, 3601):
        with pytest.raises(ValueError, match="terminationGracePeriodSeconds"):
            run_of({"workflow": {"steps": [{"name": "a", "terminationGracePeriodSeconds": value}]}})


def test_service_account_enables_the_token() -> None:
    job = build({"workload": {"image": "img", "serviceAccountName": "agent-sa"}})
    assert pod(job)["serviceAccountName"] == "agent-sa"
    assert "automountServiceAccountToken" not in pod(job)


def test_scheduling_and_resources_pass_through() -> None:
    job = build(
        {
            "workload": {
                "image": "img",
                "nodeSelector": {"pool": "gpu"},
                "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "resources": {"requests": {"cpu": "500m"}, "limits": {"memory": "1Gi"}},
            }
        }
    )
    assert pod(job)["nodeSelector"] == {"pool": "gpu"}
    assert pod(job)["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert main(job)["resources"] == {"requests": {"cpu": "500m"}, "limits": {"memory": "1Gi"}}


# ----------------------------------------------------------------------------------- env


def test_injected_environment() -> None:
    spec = {
        "workload": {"image": "img"},
        "parameters": {"repo": "lab", "branch-name": "main"},
        "implementation": {"inline": {"text": "do it", "summary": "short"}},
        "workflow": {
            "steps": [
                {
                    "name": "work",
                    "parameters": {"repo": "override"},
                    "loop": {"maxIterations": 4, "items": "[1]"},
                }
            ]
        },
    }
    attempt = PlannedAttempt(
        1, 2, 3, max_iterations=4, previous_control={"continue": True}, item={"k": 1}, item_index=1
    )
    values = env(build(spec, attempt))
    assert values["AGENTRUN_NAME"] == "demo"
    assert values["AGENTRUN_NAMESPACE"] == "team"
    assert values["AGENTRUN_STEP"] == "work"
    assert values["AGENTRUN_ITERATION"] == "2"
    assert values["AGENTRUN_MAX_ITERATIONS"] == "4"
    assert values["AGENTRUN_ATTEMPT"] == "3"
    assert values["AGENTRUN_LOOP_CONTROL_PATH"] == "/workspace/.agentrun/loop-control.json"
    assert json.loads(values["AGENTRUN_PREVIOUS_CONTROL"]) == {"continue": True}
    assert json.loads(values["AGENTRUN_ITEM"]) == {"k": 1}
    assert values["AGENTRUN_ITEM_INDEX"] == "1"
    assert json.loads(values["AGENTRUN_PARAMETERS"]) == {"repo": "override", "branch-name": "main"}
    assert values["AGENTRUN_PARAM_REPO"] == "override"
    assert values["AGENTRUN_PARAM_BRANCH_NAME"] == "main"
    assert values["AGENTRUN_IMPLEMENTATION_TEXT"] == "do it"
    assert values["AGENTRUN_IMPLEMENTATION_SUMMARY"] == "short"


def test_first_iteration_outside_for_each_has_null_item_and_previous_control() -> None:
    values = env(build({"workload": {"image": "img"}}))
    assert values["AGENTRUN_PREVIOUS_CONTROL"] == "null"
    assert values["AGENTRUN_ITEM"] == "null"
    assert values["AGENTRUN_ITEM_INDEX"] == ""
    assert values["AGENTRUN_IMPLEMENTATION_TEXT"] == ""


def test_implementation_from_spec_ref_and_step_override() -> None:
    specs = {
        "run-task": ImplementationSpecSpec(text="run text", summary="run summary"),
        "step-task": ImplementationSpecSpec(text="step text"),
    }
    refs = References(implementation_specs=specs)
    run_level = build(
        {"workload": {"image": "img"}, "implementationSpecRef": {"name": "run-task"}}, refs=refs
    )
    assert env(run_level)["AGENTRUN_IMPLEMENTATION_TEXT"] == "run text"
    assert env(run_level)["AGENTRUN_IMPLEMENTATION_SUMMARY"] == "run summary"
    step_level = build(
        {
            "workload": {"image": "img"},
            "implementationSpecRef": {"name": "run-task"},
            "workflow": {"steps": [{"name": "work", "implementationSpecRef": {"name": "step-task"}}]},
        },
        refs=refs,
    )
    assert env(step_level)["AGENTRUN_IMPLEMENTATION_TEXT"] == "step text"
    assert env(step_level)["AGENTRUN_IMPLEMENTATION_SUMMARY"] == ""


def test_acceptance_criteria_reach_the_pod_as_a_json_list() -> None:
    """docs/api.md#acceptance-criteria: the ImplementationSpec's criteria, from the text's source."""
    criteria = ["tests pass", "the README says how to run it", 'quotes " and ünïcode']
    specs = {
        "run-task": ImplementationSpecSpec(text="run text", acceptance_criteria=criteria),
        "bare-task": ImplementationSpecSpec(text="no criteria"),
    }
    refs = References(implementation_specs=specs)
    run_level = env(
        build({"workload": {"image": "img"}, "implementationSpecRef": {"name": "run-task"}}, refs=refs)
    )
    assert json.loads(run_level["AGENTRUN_ACCEPTANCE_CRITERIA"]) == criteria
    # A step with its own source takes its criteria from it, never the run's.
    step_inline = {
        "workload": {"image": "img"},
        "implementationSpecRef": {"name": "run-task"},
        "workflow": {"steps": [{"name": "work", "implementation": {"inline": {"text": "inline"}}}]},
    }
    assert env(build(step_inline, refs=refs))["AGENTRUN_ACCEPTANCE_CRITERIA"] == "[]"
    # An inline task's own criteria (the original API's inline fields).
    step_inline["workflow"]["steps"][0]["implementation"]["inline"]["acceptanceCriteria"] = ["inline check"]
    assert json.loads(env(build(step_inline, refs=refs))["AGENTRUN_ACCEPTANCE_CRITERIA"]) == ["inline check"]
    step_bare = {
        "workload": {"image": "img"},
        "implementationSpecRef": {"name": "run-task"},
        "workflow": {"steps": [{"name": "work", "implementationSpecRef": {"name": "bare-task"}}]},
    }
    assert env(build(step_bare, refs=refs))["AGENTRUN_ACCEPTANCE_CRITERIA"] == "[]"
    assert env(build({"workload": {"image": "img"}}))["AGENTRUN_ACCEPTANCE_CRITERIA"] == "[]"


def test_user_env_follows_the_injected_env_and_cannot_override_it() -> None:
    spec = {
        "workload": {
            "image": "img",
            "env": [
                {"name": "GREETING", "value": "step $(AGENTRUN_STEP)"},
                {"name": "AGENTRUN_STEP", "value": "spoofed"},
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            ],
        }
    }
    entries = main(build(spec))["env"]
    names = [e["name"] for e in entries]
    assert names.index("GREETING") > names.index("AGENTRUN_STEP")
    assert names.count("AGENTRUN_STEP") == 1
    assert env(build(spec))["AGENTRUN_STEP"] == "work"
    assert {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}} in entries


# ----------------------------------------------------------------------------------- containers


PROVIDER = AgentProviderSpec.model_validate(
    {
        "image": "codex:1",
        "command": ["codex"],
        "args": ["exec", "$(AGENTRUN_IMPLEMENTATION_TEXT)"],
        "env": [{"name": "MODEL", "value": "provider"}, {"name": "ONLY_PROVIDER", "value": "p"}],
    }
)
AGENT = AgentSpec.model_validate(
    {"providerRef": {"name": "codex"}, "env": [{"name": "MODEL", "value": "agent"}]}
)


@pytest.mark.parametrize(
    ("spec", "refs", "image", "command", "args"),
    [
        (
            {
                "workload": {"image": "run-img"},
                "workflow": {"steps": [{"name": "work", "workload": {"image": "step-img"}}]},
            },
            References(AGENT, PROVIDER),
            "step-img",
            None,
            None,
        ),
        (
            {"workload": {"image": "run-img", "command": ["sh"]}},
            References(AGENT, PROVIDER),
            "run-img",
            ["sh"],
            None,
        ),
        ({}, References(AGENT, PROVIDER), "codex:1", ["codex"], ["exec", "$(AGENTRUN_IMPLEMENTATION_TEXT)"]),
        ({"workload": {"args": ["--fast"]}}, References(AGENT, PROVIDER), "codex:1", ["codex"], ["--fast"]),
        ({"workload": {"command": ["true"]}}, References(), "runner:1", ["true"], None),
    ],
    ids=["step-workload", "run-workload", "provider", "provider-with-workload-args", "operator-default"],
)
def test_container_resolution_order(
    spec: dict[str, Any], refs: References, image: str, command: list[str] | None, args: list[str] | None
) -> None:
    container = main(build(spec, refs=refs))
    assert container["name"] == "agent-runner"  # a run without loops: the original's name
    assert container["image"] == image
    assert container.get("command") == command
    assert container.get("args") == args


def test_env_layers_provider_then_agent_then_workload() -> None:
    values = env(
        build({"workload": {"env": [{"name": "EXTRA", "value": "w"}]}}, refs=References(AGENT, PROVIDER))
    )
    assert values["MODEL"] == "agent"
    assert values["ONLY_PROVIDER"] == "p"
    assert values["EXTRA"] == "w"
    overridden = env(
        build({"workload": {"env": [{"name": "MODEL", "value": "w"}]}}, refs=References(AGENT, PROVIDER))
    )
    assert overridden["MODEL"] == "w"


# ----------------------------------------------------------------------------------- volumes


def test_volume_types_become_pod_volumes() -> None:
    volumes = [
        {**PVC, "readOnly": True},
        {
            "name": "scratch",
            "type": "emptyDir",
            "mountPath": "/scratch",
            "sizeLimit": "1Gi",
            "medium": "Memory",
        },
        {"name": "creds", "type": "secret", "secretName": "api-keys", "mountPath": "/creds"},
    ]
    job = build({"workload": {"image": "img", "volumes": volumes}})
    by_name = {v["name"]: v for v in pod(job)["volumes"]}
    assert by_name["workspace"] == {
        "name": "workspace",
        "persistentVolumeClaim": {"claimName": "ws", "readOnly": True},
    }
    assert by_name["scratch"] == {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi", "medium": "Memory"}}
    assert by_name["creds"] == {"name": "creds", "secret": {"secretName": "api-keys"}}
    mounts = {m["name"]: m for m in main(job)["volumeMounts"]}
    assert mounts["workspace"] == {"name": "workspace", "mountPath": "/workspace", "readOnly": True}
    assert mounts["scratch"] == {"name": "scratch", "mountPath": "/scratch"}


def test_step_volumes_replace_the_runs() -> None:
    spec = {
        "workload": {"image": "img", "volumes": [PVC]},
        "workflow": {
            "steps": [
                {
                    "name": "work",
                    "workload": {
                        "volumes": [{"name": "other", "type": "pvc", "claimName": "o", "mountPath": "/o"}]
                    },
                }
            ]
        },
    }
    names = [v["name"] for v in pod(build(spec))["volumes"]]
    assert "workspace" not in names and "other" in names


def hook(job: dict[str, Any]) -> list[str]:
    """The reporter's postStart hook command (docs/design.md#reporter-first)."""
    command = init(job, "reporter")["lifecycle"]["postStart"]["exec"]["command"]
    assert isinstance(command, list)
    return command


def test_the_reporter_is_the_only_helper_listed_before_main_and_its_hook_holds_main_at_a_gate() -> None:
    """One helper container, a regular one listed before main (the kubelet starts regular containers
    in order, each after its postStart hook completed: no relist wait before main): the reporter
    claims and fingerprints before main (`--before-main`), watches for main's end (`--hook-done`),
    and its hook opens main's gate, a subPath of the meta volume main mounts read-only
    (docs/design.md#reporter-first)."""
    job = build(
        {
            "workload": {"image": "img", "volumes": [PVC]},
            "workflow": {"steps": [{"name": "work", "loop": {"maxIterations": 2}}]},
        }
    )
    assert "initContainers" not in pod(job)
    assert [c["name"] for c in pod(job)["containers"]] == ["reporter", "main"]
    assert pod(job)["shareProcessNamespace"] is True  # the reporter sees main's processes
    reporter = init(job, "reporter")
    assert "restartPolicy" not in reporter
    assert reporter["image"] == "operator:1"
    assert reporter["imagePullPolicy"] == "IfNotPresent"  # no registry round trip per pod
    assert reporter["command"] == ["agentrun", "reporter", "report"]
    assert reporter["args"][:11] == [
        "--path",
        "/workspace/.agentrun/loop-control.json",
        "--fingerprint",
        "/agentrun-meta/fingerprint.json",
        "--termination-log",
        "/dev/termination-log",
        "--hook-done",
        "/agentrun-meta/hook-done",
        "--ready-file",
        "/agentrun-meta/reporter-ready",
        "--before-main",
    ]
    assert reporter["args"][11:17] == [
        "--gate",
        "/agentrun-meta/gate",
        "--knock",
        "/agentrun-meta/knock",
        "--hook-failed",
        "/agentrun-meta/hook-failed",
    ]
    assert hook(job)[:2] == ["sh", "-c"] and hook(job)[3:] == [
        "agentrun-ready",
        "/agentrun-meta/reporter-ready",
        "1500",
        "/agentrun-meta/gate",
        "/agentrun-meta/hook-done",
        "/agentrun-meta/hook-failed",
    ]
    assert reporter["terminationMessagePath"] == "/dev/termination-log"
    assert reporter["resources"]["requests"] == {"cpu": "10m", "memory": "32Mi"}
    assert {"name": META_VOLUME, "mountPath": "/agentrun-meta"} in reporter["volumeMounts"]
    # kubectl logs/exec without -c mean main, not the reporter listed first
    annotations = job["spec"]["template"]["metadata"]["annotations"]
    assert annotations["kubectl.kubernetes.io/default-container"] == "main"
    # The knock before the gate: the kubelet makes it even when it refuses the shut gate, so the
    # reporter learns that the kubelet tried to start main (docs/design.md#hook-lost).
    gates = [m for m in main(job)["volumeMounts"] if m["name"] == META_VOLUME]
    assert gates == [
        {"name": META_VOLUME, "mountPath": "/.agentrun-knock", "subPath": "knock", "readOnly": True},
        {"name": META_VOLUME, "mountPath": "/.agentrun-gate", "subPath": "gate", "readOnly": True},
    ]


def test_reporter_mounts_the_volume_with_the_longest_matching_mount_path() -> None:
    volumes = [
        {"name": "root", "type": "pvc", "claimName": "r", "mountPath": "/work"},
        {"name": "deep", "type": "pvc", "claimName": "d", "mountPath": "/work/state"},
        {"name": "lookalike", "type": "pvc", "claimName": "l", "mountPath": "/work/stateful"},
    ]
    step = {
        "name": "work",
        "loop": {
            "maxIterations": 2,
            "condition": {"expression": "true", "source": {"path": "/work/state/ctl.json"}},
        },
    }
    job = build({"workload": {"image": "img", "volumes": volumes}, "workflow": {"steps": [step]}})
    mounted = {m["name"] for m in init(job, "reporter")["volumeMounts"]}
    assert mounted == {META_VOLUME, "deep"}
    assert env(job)["AGENTRUN_LOOP_CONTROL_PATH"] == "/work/state/ctl.json"


def test_control_path_on_no_volume_gets_an_empty_dir_in_main_and_helpers() -> None:
    job = build({"workload": {"image": "img", "volumes": [{**PVC, "mountPath": "/data"}]}})
    fallback = {"name": CONTROL_FALLBACK_VOLUME, "emptyDir": {}}
    assert fallback in pod(job)["volumes"]
    assert {"name": CONTROL_FALLBACK_VOLUME, "mountPath": "/workspace/.agentrun"} in main(job)["volumeMounts"]
    assert {"name": CONTROL_FALLBACK_VOLUME, "mountPath": "/workspace/.agentrun", "readOnly": True} in init(
        job, "reporter"
    )["volumeMounts"]


def test_the_reporter_mounts_the_pvc_as_main_does_for_the_job_claim() -> None:
    """Only main and the reporter (whose hook takes the Job claim, docs/concepts.md#exactly-once)
    mount it, both as the step says."""
    job = build({"workload": {"image": "img", "volumes": [PVC]}})
    writable = {
        c["name"]
        for c in pod(job)["containers"]
        for m in c["volumeMounts"]
        if m["name"] == "workspace" and not m.get("readOnly")
    }
    assert writable == {"agent-runner", "reporter"}


@pytest.mark.parametrize(
    ("steps", "name"),
    [
        ([{"name": "work"}], "agent-runner"),
        ([{"name": "a"}, {"name": "b", "steps": [{"name": "c"}]}], "agent-runner"),
        ([{"name": "work", "loop": {"maxIterations": 2}}], "main"),
        ([{"name": "a"}, {"name": "b", "loop": {"maxIterations": 2, "items": "[1, 2]"}}], "main"),
        ([{"name": "g", "steps": [{"name": "c", "loop": {"maxIterations": 2}}]}], "main"),
    ],
    ids=["one-step", "group-without-loop", "loop", "for-each-in-a-later-step", "nested-loop"],
)
def test_the_workload_container_is_the_originals_agent_runner_in_a_run_without_loops(
    steps: list[dict[str, Any]], name: str
) -> None:
    """docs/migration.md#runner-pod: tooling of the original runs `kubectl logs -c agent-runner`; a run
    with a loop anywhere keeps the loop layout's `main` in every pod. The default-container
    annotation names the workload either way (`kubectl logs POD` means it, not the reporter)."""
    job = build({"workload": {"image": "img"}, "workflow": {"steps": steps}})
    assert [c["name"] for c in pod(job)["containers"]] == ["reporter", name]
    annotations = job["spec"]["template"]["metadata"]["annotations"]
    assert annotations["kubectl.kubernetes.io/default-container"] == name


def claim_args(job: dict[str, Any]) -> dict[str, str]:
    args = init(job, "reporter")["args"]
    start = args.index("--claim-dir")
    return dict(zip(args[start::2], args[start + 1 :: 2], strict=True))


def test_the_reporter_claims_the_job_in_the_control_volume_s_claims_directory() -> None:
    """docs/concepts.md#exactly-once: the reporter mounts the control volume as main does and claims
    the Job before main (uids from the downward API in its env), keeping the outcome for its envelope."""
    job = build({"workload": {"image": "img", "volumes": [PVC]}})
    assert claim_args(job) == {
        "--claim-dir": "/workspace/.agentrun-claims",
        "--claim-volume": "workspace",
        "--claim-report": "/agentrun-meta/claim.json",
    }
    reporter = init(job, "reporter")
    assert {"name": "workspace", "mountPath": "/workspace"} in reporter["volumeMounts"]
    fields = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in reporter["env"]}
    assert fields == {
        "AGENTRUN_JOB_UID": "metadata.labels['batch.kubernetes.io/controller-uid']",
        "AGENTRUN_POD_UID": "metadata.uid",
    }


def test_a_control_path_on_no_volume_claims_on_main_s_first_read_write_pvc() -> None:
    """The duplicate-pod guard exists wherever state is shared, whatever the control path."""
    volumes = [
        {**PVC, "name": "inputs", "claimName": "in", "mountPath": "/in", "readOnly": True},
        {"name": "scratch", "type": "emptyDir", "mountPath": "/tmp/s"},
        {**PVC, "mountPath": "/w"},
        {**PVC, "name": "other", "claimName": "o", "mountPath": "/o"},
    ]
    job = build({"workload": {"image": "img", "volumes": volumes}})
    assert claim_args(job)["--claim-dir"] == "/w/.agentrun-claims"
    assert claim_args(job)["--claim-volume"] == "workspace"
    mounts = {m["name"]: m for m in init(job, "reporter")["volumeMounts"]}
    assert mounts["workspace"] == {"name": "workspace", "mountPath": "/w"}
    assert mounts[CONTROL_FALLBACK_VOLUME]["readOnly"] is True
    assert set(mounts) == {META_VOLUME, "workspace", CONTROL_FALLBACK_VOLUME}


def test_a_read_only_control_volume_claims_on_a_writable_pvc_else_tries_the_read_only_one() -> None:
    """A read-only mount cannot hold the claim: another read-write PVC does; with none, the reporter
    tries the read-only one, fails and says so (the run gets a Warning Event and a condition)."""
    writable = {**PVC, "name": "state", "claimName": "st", "mountPath": "/state"}
    both = build({"workload": {"image": "img", "volumes": [{**PVC, "readOnly": True}, writable]}})
    assert claim_args(both)["--claim-dir"] == "/state/.agentrun-claims"
    only = build({"workload": {"image": "img", "volumes": [{**PVC, "readOnly": True}]}})
    assert claim_args(only)["--claim-dir"] == "/workspace/.agentrun-claims"
    assert claim_args(only)["--claim-volume"] == "workspace"
    assert {"name": "workspace", "mountPath": "/workspace", "readOnly": True} in init(only, "reporter")[
        "volumeMounts"
    ]


def test_no_claim_and_no_fs_group_without_a_pvc() -> None:
    """An emptyDir is the pod's own: a duplicate pod would not share it, so there is nothing to guard."""
    volumes = [{"name": "scratch", "type": "emptyDir", "mountPath": "/workspace"}]
    for workload in ({"image": "img", "volumes": volumes}, {"image": "img"}):
        job = build({"workload": workload})
        assert "--claim-dir" not in init(job, "reporter")["args"] and "env" not in init(job, "reporter")
        assert "securityContext" not in pod(job)


def test_a_pod_with_a_pvc_gets_the_configured_fs_group_on_root_mismatch() -> None:
    """docs/design.md#claim-storage: the kubelet makes the volume group-writable for the helper's uid."""
    job = build({"workload": {"image": "img", "volumes": [PVC]}})
    assert pod(job)["securityContext"] == {"fsGroup": 10001, "fsGroupChangePolicy": "OnRootMismatch"}
    run = run_of({"workload": {"image": "img", "volumes": [PVC]}})
    custom = OperatorConfig(runner_image="r", reporter_image="o", pod_fs_group=4242)
    built = build_iteration_job(run, PlannedAttempt(1, 1, 1), References(), custom)
    assert built["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == 4242
    off = OperatorConfig(runner_image="r", reporter_image="o", pod_fs_group=None)
    assert (
        "securityContext"
        not in build_iteration_job(run, PlannedAttempt(1, 1, 1), References(), off)["spec"]["template"][
            "spec"
        ]
    )
