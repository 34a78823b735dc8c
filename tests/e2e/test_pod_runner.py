"""The local pod runner with plain pods: what a kubelet would report for good and bad input, volumes,
environment, termination messages, deletion, and that nothing is written outside its state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.conftest import NAMESPACE, LocalDefault
from tests.e2e.test_kubelet_behaviours import container, create_pod, dev_logs, get_pod, wait_terminal
from tests.support.polling import eventually
from tests.support.processes import processes_with


def test_a_missing_binary_is_exit_128_and_the_runner_goes_on(local_default: LocalDefault) -> None:
    create_pod(
        local_default,
        "no-binary",
        {"containers": [{"name": "main", "image": "x", "command": ["no-such-binary-4711"]}]},
    )
    pod = wait_terminal(local_default, "no-binary")
    term = container(pod, "main")["state"]["terminated"]
    assert term["exitCode"] == 128 and term["reason"] == "StartError"
    assert 'exec: "no-such-binary-4711": executable file not found in $PATH' in term["message"]
    create_pod(local_default, "no-command", {"containers": [{"name": "main", "image": "busybox"}]})
    pod = wait_terminal(local_default, "no-command")
    term = container(pod, "main")["state"]["terminated"]
    assert term["exitCode"] == 128 and "give `command`" in term["message"]
    create_pod(
        local_default,
        "after-bad-ones",
        {"containers": [{"name": "main", "image": "x", "command": ["true"]}]},
    )
    assert wait_terminal(local_default, "after-bad-ones")["status"]["phase"] == "Succeeded"


def test_a_bad_mount_path_is_a_start_error(local_default: LocalDefault) -> None:
    create_pod(
        local_default,
        "bad-mount",
        {
            "containers": [
                {
                    "name": "main",
                    "image": "x",
                    "command": ["true"],
                    "volumeMounts": [{"name": "scratch", "mountPath": "/proc/sneaky"}],
                }
            ],
            "volumes": [{"name": "scratch", "emptyDir": {}}],
        },
    )
    pod = wait_terminal(local_default, "bad-mount")
    term = container(pod, "main")["state"]["terminated"]
    assert term["exitCode"] == 128 and term["reason"] == "StartError"
    assert "bad mountPath '/proc/sneaky'" in term["message"]


def test_service_account_volume_and_new_mount_points_in_host_directories(local_default: LocalDefault) -> None:
    # The ServiceAccount admission plugin adds the kube-api-access projected volume at
    # /var/run/secrets/kubernetes.io/serviceaccount, a path that does not exist on the host.
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "with-token", "namespace": NAMESPACE},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "x",
                    "command": ["sh", "-c"],
                    "args": [
                        "d=/var/run/secrets/kubernetes.io/serviceaccount; cat $d/namespace; echo; "
                        "test -s $d/token && test -s $d/ca.crt && echo token-ok; "
                        "ls /usr/share/agentrun-new-dir/ && touch /usr/x 2>/dev/null || echo usr-read-only"
                    ],
                    "volumeMounts": [{"name": "scratch", "mountPath": "/usr/share/agentrun-new-dir"}],
                }
            ],
            "volumes": [{"name": "scratch", "emptyDir": {}}],
        },
    }
    local_default.apply(yaml.safe_dump(pod))
    done = wait_terminal(local_default, "with-token")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert any(v.get("projected") for v in done["spec"]["volumes"])
    assert dev_logs(local_default, "with-token", "main").splitlines() == ["e2e", "token-ok", "usr-read-only"]
    assert not Path("/usr/share/agentrun-new-dir").exists()


def test_unknown_volume_types_and_unsafe_claims_fail_the_pod(local_default: LocalDefault) -> None:
    create_pod(
        local_default,
        "host-path",
        {
            "containers": [{"name": "main", "image": "x", "command": ["true"]}],
            "volumes": [{"name": "host", "hostPath": {"path": "/etc"}}],
        },
    )
    pod = wait_terminal(local_default, "host-path")
    assert pod["status"]["reason"] == "UnsupportedVolume"
    assert "hostPath" in pod["status"]["message"]
    assert container(pod, "main")["state"]["terminated"]["exitCode"] == 128

    create_pod(
        local_default,
        "escape",
        {
            "containers": [{"name": "main", "image": "x", "command": ["true"]}],
            "volumes": [{"name": "ws", "persistentVolumeClaim": {"claimName": "../../../escaped"}}],
        },
    )
    pod = wait_terminal(local_default, "escape")
    assert pod["status"]["reason"] == "InvalidClaimName"
    assert "'../../../escaped' is not a valid PersistentVolumeClaim name" in pod["status"]["message"]
    assert not (local_default.state_dir.parent / "escaped").exists()


def test_a_missing_secret_waits_then_runs(local_default: LocalDefault) -> None:
    create_pod(
        local_default,
        "waits-for-secret",
        {
            "containers": [
                {
                    "name": "main",
                    "image": "x",
                    "command": ["cat", "/s/key"],
                    "volumeMounts": [{"name": "s", "mountPath": "/s"}],
                }
            ],
            "volumes": [{"name": "s", "secret": {"secretName": "arrives-later"}}],
        },
    )

    def waiting() -> dict[str, Any] | None:
        pod = get_pod(local_default, "waits-for-secret")
        statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
        state = statuses[0]["state"] if statuses else {}
        return state.get("waiting") if "arrives-later" in json.dumps(state) else None

    state = eventually(waiting, what="the pod to wait for its secret", timeout=120)
    assert state["reason"] == "ContainerCreating"
    assert 'secret "arrives-later" not found' in state["message"]
    local_default.apply(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "arrives-later", "namespace": NAMESPACE},
                "stringData": {"key": "here now"},
            }
        )
    )
    pod = wait_terminal(local_default, "waits-for-secret")
    assert pod["status"]["phase"] == "Succeeded"
    assert dev_logs(local_default, "waits-for-secret", "main") == "here now"


def test_deleting_a_pod_kills_its_processes_then_confirms(local_default: LocalDefault) -> None:
    create_pod(
        local_default,
        "sleeper",
        {
            # `sleep` is PID 1 and ignores SIGTERM: it is killed after the (short) grace period.
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "x", "command": ["sh", "-c", "exec sleep 7780"]}],
        },
    )
    eventually(lambda: processes_with("sleep", "7780"), what="the sleep to run", timeout=120)
    local_default.plane.kubectl("delete", "pod", "sleeper", "-n", NAMESPACE, "--wait=false")
    eventually(lambda: get_pod(local_default, "sleeper") is None, what="the pod to be gone", timeout=120)
    assert not processes_with("sleep", "7780")


def test_restart_policy_on_failure_restarts_with_back_off(local_default: LocalDefault) -> None:
    create_pod(
        local_default,
        "on-failure",
        {
            "restartPolicy": "OnFailure",
            "containers": [
                {
                    "name": "main",
                    "image": "x",
                    "command": ["sh", "-c", "test -e /scratch/m && exit 0; touch /scratch/m; exit 2"],
                    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                }
            ],
            "volumes": [{"name": "scratch", "emptyDir": {}}],
        },
    )
    pod = wait_terminal(local_default, "on-failure")
    assert pod["status"]["phase"] == "Succeeded"
    main = container(pod, "main")
    assert main["restartCount"] == 1
    assert main["lastState"]["terminated"]["exitCode"] == 2
    assert main["state"]["terminated"]["exitCode"] == 0


def test_a_claim_binds_to_a_provisioned_directory_which_is_reclaimed_with_it(
    local_default: LocalDefault,
) -> None:
    """A pod waits for its claim like on a kubelet; the claim binds to a volume of the local
    provisioner (default StorageClass), the pod writes into it, and deleting the claim reclaims it."""
    env = local_default
    create_pod(
        env,
        "claim-later",
        {
            "containers": [
                {
                    "name": "main",
                    "image": "x",
                    "command": ["sh", "-c", "echo kept > /data/file.txt"],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            ],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "arrives-later"}}],
        },
    )

    def waiting() -> dict[str, Any] | None:
        pod = get_pod(env, "claim-later")
        statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
        state = statuses[0]["state"] if statuses else {}
        return state.get("waiting") if "arrives-later" in json.dumps(state) else None

    state = eventually(waiting, what="the pod to wait for its claim")
    assert 'persistentvolumeclaim "arrives-later" not found' in state["message"]
    env.create_claim("arrives-later")
    pod = wait_terminal(env, "claim-later")
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    claim = json.loads(
        env.plane.api_get(f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims/arrives-later")[1]
    )
    assert claim["spec"]["storageClassName"] == "agentrun-local"  # the default class was applied
    volume_name = claim["spec"]["volumeName"]
    directory = env.claim_dir("arrives-later")
    assert (directory / "file.txt").read_text() == "kept\n"

    env.plane.kubectl("delete", "pod", "claim-later", "-n", NAMESPACE, "--wait=true")
    env.plane.kubectl("delete", "pvc", "arrives-later", "-n", NAMESPACE, "--wait=true", "--timeout=60s")
    eventually(
        lambda: env.plane.api_get(f"/api/v1/persistentvolumes/{volume_name}")[0] == 404,
        what=f"volume {volume_name} to be reclaimed",
    )
    assert not directory.exists()
