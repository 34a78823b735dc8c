"""The shell's pure helpers: Kubernetes objects to observed values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrun_operator import naming
from agentrun_operator.shell.kube import _resource_of
from agentrun_operator.shell.observe import job_from_k8s, pod_from_k8s

LABELS = {naming.LABEL_STEP_INDEX: "1", naming.LABEL_ITERATION: "2", naming.LABEL_ATTEMPT: "3"}


def _job(conditions: list[dict[str, str]]) -> dict[str, object]:
    return {
        "metadata": {"name": "r-step-1-iter-2-attempt-3", "uid": "u1", "labels": LABELS},
        "spec": {"ttlSecondsAfterFinished": 30},
        "status": {"startTime": "2026-11-21T10:00:00Z", "conditions": conditions},
    }


def test_job_outcomes_follow_batch_v1_conditions() -> None:
    active = job_from_k8s(_job([]))
    assert active is not None and active.outcome == "Active" and not active.finished
    assert (active.step_index, active.iteration, active.attempt) == (1, 2, 3)
    assert active.ttl_seconds_after_finished == 30
    done = job_from_k8s(_job([{"type": "Complete", "status": "True"}]))
    assert done is not None and done.outcome == "Succeeded"
    deadline = job_from_k8s(
        _job([{"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "too slow"}])
    )
    assert deadline is not None and deadline.outcome == "DeadlineExceeded" and deadline.message == "too slow"
    failed = job_from_k8s(_job([{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]))
    assert failed is not None and failed.outcome == "Failed"
    not_true = job_from_k8s(_job([{"type": "Complete", "status": "False"}]))
    assert not_true is not None and not_true.outcome == "Active"


def _cond(type_: str, at: str, reason: str = "", message: str = "", status: str = "True") -> dict[str, str]:
    return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": at}


T1, T2 = "2026-11-21T10:00:10Z", "2026-11-21T10:00:41Z"


def test_failure_target_decides_a_timeout_before_failed() -> None:
    """Kubernetes >= 1.31: `FailureTarget` at the deadline, `Failed` once the pods have terminated."""
    target = _cond("FailureTarget", T1, "DeadlineExceeded", "Job was active longer than specified deadline")
    decided = job_from_k8s(_job([target]))
    assert decided is not None
    assert (decided.outcome, decided.finished, decided.settling, decided.settled) == (
        "DeadlineExceeded",
        True,
        True,
        False,
    )
    assert decided.message == "Job was active longer than specified deadline"
    assert decided.finished_at is not None and decided.finished_at.isoformat() == "2026-11-21T10:00:10+00:00"
    ended = job_from_k8s(_job([target, _cond("Failed", T2, "DeadlineExceeded", "Job was active longer")]))
    assert ended is not None
    assert (ended.outcome, ended.settling, ended.settled) == ("DeadlineExceeded", False, True)
    assert ended.finished_at == decided.finished_at  # the decision time does not move
    assert ended.message == "Job was active longer"


def test_failure_target_of_another_reason_is_a_failure() -> None:
    job = job_from_k8s(_job([_cond("FailureTarget", T1, "BackoffLimitExceeded", "")]))
    assert job is not None and (job.outcome, job.settling, job.message) == (
        "Failed",
        True,
        "BackoffLimitExceeded",
    )


def test_success_criteria_met_decides_a_success_before_complete() -> None:
    met = _cond("SuccessCriteriaMet", T1, "CompletionsReached")
    decided = job_from_k8s(_job([met]))
    assert decided is not None and (decided.outcome, decided.settling, decided.message) == (
        "Succeeded",
        True,
        None,
    )
    done = _job([met, _cond("Complete", T2, "CompletionsReached")])
    done["status"]["completionTime"] = T2  # type: ignore[index]
    complete = job_from_k8s(done)
    assert complete is not None and (complete.outcome, complete.settling) == ("Succeeded", False)
    assert complete.finished_at is not None
    assert complete.finished_at.isoformat().startswith("2026-11-21T10:00:41")


def test_interim_conditions_not_true_decide_nothing() -> None:
    for type_ in ("FailureTarget", "SuccessCriteriaMet"):
        job = job_from_k8s(_job([_cond(type_, T1, "DeadlineExceeded", status="False")]))
        assert job is not None and (job.outcome, job.settling, job.finished_at) == ("Active", False, None)


def test_a_terminal_condition_alone_is_settled() -> None:
    """Older clusters (< 1.31) set `Failed` (and `Complete`) without an interim condition."""
    failed = job_from_k8s(_job([_cond("Failed", T2, "DeadlineExceeded", "too slow")]))
    assert failed is not None and (failed.outcome, failed.settling) == ("DeadlineExceeded", False)
    assert failed.finished_at is not None


def test_a_nested_steps_job_keeps_its_address_and_its_path() -> None:
    job = _job([])
    job["metadata"] = {
        "name": "r-step-1i2-3-iter-1-attempt-1",
        "labels": {**LABELS, naming.LABEL_STEP_PATH: "1i2-3"},
        "annotations": {naming.ANNOTATION_STEP: "dev/iteration 2/review"},
    }
    observed = job_from_k8s(job)
    assert observed is not None and (observed.path, observed.label) == ("1i2-3", "dev/iteration 2/review")
    top = job_from_k8s(_job([]))
    assert top is not None and (top.path, top.label) == ("", "")


def test_foreign_jobs_are_not_guessed_at() -> None:
    assert job_from_k8s({"metadata": {"name": "x", "labels": {}}}) is None
    assert (
        job_from_k8s({"metadata": {"name": "x", "labels": {**LABELS, naming.LABEL_ATTEMPT: "one"}}}) is None
    )


def test_pod_carries_the_reporter_envelope_and_main_exit() -> None:
    pod = pod_from_k8s(
        {
            "metadata": {"name": "p", "labels": {"job-name": "j"}},
            "status": {
                "phase": "Failed",
                "containerStatuses": [
                    {"name": "reporter", "state": {"terminated": {"exitCode": 0, "message": '{"v":1}'}}},
                    {
                        "name": "main",
                        "state": {
                            "terminated": {
                                "exitCode": 137,
                                "reason": "OOMKilled",
                                "finishedAt": "2026-11-21T10:00:05Z",
                            }
                        },
                    },
                ],
            },
        }
    )
    assert pod is not None and pod.terminal and pod.job_name == "j"
    assert pod.reporter_message == '{"v":1}'
    assert pod.claim_message is None  # the claim went as expected: no news in the envelope
    assert (pod.main_exit_code, pod.main_reason) == (137, "OOMKilled")
    assert pod.finished_at is not None and pod.finished_at.second == 5
    assert pod_from_k8s({"metadata": {"name": "p", "labels": {}}}) is None


def test_api_metric_label_is_the_resource() -> None:
    assert _resource_of("/apis/batch/v1/namespaces/ns/jobs/j") == "jobs"
    assert (
        _resource_of("/apis/agents.proompteng.ai/v1alpha1/namespaces/n/agentruns/x/status")
        == "agentruns/status"
    )
    assert _resource_of("/api/v1/namespaces/ns/events") == "events"
    assert _resource_of("/apis/agents.proompteng.ai/v1alpha1/agentruns") == "agentruns"


def test_kopf_and_the_adapter_log_in_from_one_credential_stack(tmp_path: Path) -> None:
    """kopf's login and the adapter's requests come from the same kubernetes_asyncio configuration."""
    import asyncio

    import yaml

    from agentrun_operator.shell.kube import auth_headers, kopf_login, load_configuration

    kubeconfig = tmp_path / "kubeconfig"
    cluster = {"server": "https://10.96.0.1:6443", "insecure-skip-tls-verify": True}
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": {"token": "tok3n"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )

    async def both() -> tuple[Any, dict[str, str]]:
        return await kopf_login(str(kubeconfig)), await auth_headers(
            await load_configuration(str(kubeconfig))
        )

    info, headers = asyncio.run(both())
    assert (info.server, info.token, info.insecure) == ("https://10.96.0.1:6443", "tok3n", True)
    assert headers == {"Authorization": "Bearer tok3n"}


def test_claim_names_are_the_pvc_volumes_of_every_step_once() -> None:
    from agentrun_operator.api.agentrun import parse_agentrun
    from agentrun_operator.shell.observe import claim_names, claim_phase

    run = parse_agentrun(
        {
            "apiVersion": "agents.proompteng.ai/v1alpha1",
            "kind": "AgentRun",
            "metadata": {"name": "r", "namespace": "ns"},
            "spec": {
                "workload": {
                    "image": "busybox",
                    "volumes": [
                        {"name": "ws", "type": "pvc", "claimName": "shared", "mountPath": "/workspace"},
                        {"name": "tmp", "type": "emptyDir", "mountPath": "/scratch"},
                    ],
                },
                "workflow": {
                    "steps": [
                        {"name": "a"},
                        {
                            "name": "b",
                            "workload": {
                                "volumes": [
                                    {"name": "own", "type": "pvc", "claimName": "own", "mountPath": "/own"},
                                ]
                            },
                        },
                        {"name": "c"},
                    ]
                },
            },
        }
    )
    assert claim_names(run) == ["shared", "own"]
    assert claim_phase(None) is None
    assert claim_phase({"status": {"phase": "Bound"}, "spec": {"volumeName": "pv"}}) == "Bound"
    assert claim_phase({"status": {"phase": "Bound"}, "spec": {}}) == "Pending"
    assert claim_phase({"status": {}}) == "Pending"
    assert claim_phase({"status": {"phase": "Lost"}, "spec": {"volumeName": "pv"}}) == "Lost"


def test_pod_level_reason_and_message_are_observed() -> None:
    """The pod's own status.reason/message (who failed it, e.g. an eviction) reach the planner."""
    pod = pod_from_k8s(
        {
            "metadata": {"name": "p", "labels": {"job-name": "j"}},
            "status": {"phase": "Failed", "reason": "Evicted", "message": "The node was low on memory."},
        }
    )
    assert pod is not None and pod.reason == "Evicted" and pod.message == "The node was low on memory."
    plain = pod_from_k8s({"metadata": {"name": "p", "labels": {"job-name": "j"}}, "status": {}})
    assert plain is not None and plain.reason is None and plain.message is None


def test_the_claim_comes_from_the_reporter_s_envelope() -> None:
    """docs/design.md#reporter-first: the claim report rides in the reporter's envelope when it is news."""
    from agentrun_operator.shell.observe import envelope_claim

    claim = {"v": 1, "claim": "unavailable", "volume": "w", "dir": "/w/c", "detail": "denied"}
    message = json.dumps(
        {
            "v": 1,
            "status": "missing",
            "path": "/p",
            "size": None,
            "reason": "r",
            "control": None,
            "claim": claim,
        }
    )
    assert envelope_claim(message) is not None and json.loads(envelope_claim(message) or "") == claim
    assert envelope_claim('{"v":1,"status":"missing"}') is None
    assert envelope_claim("not json") is None and envelope_claim(None) is None
    pod = {
        "metadata": {"name": "p", "labels": {"job-name": "j"}},
        "status": {
            "containerStatuses": [{"name": "reporter", "state": {"terminated": {"message": message}}}]
        },
    }
    observed = pod_from_k8s(pod)
    assert observed is not None and json.loads(observed.claim_message or "") == claim


def test_legacy_pods_of_earlier_builds_are_still_read() -> None:
    """Until the release after 0.1.0 (docs/operations.md#earlier-pods): a pod of an earlier build has
    the reporter among its init containers (the native sidecar) and, older still, a `fingerprint` init
    container whose termination message is the claim report. Delete this test with that reading."""
    pod = pod_from_k8s(
        {
            "metadata": {"name": "p", "labels": {"job-name": "j"}},
            "status": {
                "initContainerStatuses": [
                    {"name": "fingerprint", "state": {"terminated": {"exitCode": 0, "message": "claim"}}},
                    {"name": "reporter", "state": {"terminated": {"exitCode": 0, "message": '{"v":1}'}}},
                ],
            },
        }
    )
    assert pod is not None and (pod.reporter_message, pod.claim_message) == ('{"v":1}', "claim")
