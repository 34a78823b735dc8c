"""The local pod runner with plain pods: what a kubelet would report for good and bad input, volumes,
environment, termination messages, deletion, and that nothing is written outside its state."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.conftest import NAMESPACE, LocalDefault
from tests.support.polling import eventually
from tests.support.processes import processes_with


def create_pod(env: LocalDefault, name: str, spec: dict[str, Any]) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False, **spec},
    }
    env.apply(yaml.safe_dump(pod))


def get_pod(env: LocalDefault, name: str) -> dict[str, Any] | None:
    code, body = env.plane.api_get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
    if code == 404:
        return None
    assert code == 200, body[:300]
    pod: dict[str, Any] = json.loads(body)
    return pod


def wait_terminal(env: LocalDefault, name: str, timeout: float = 120.0) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        pod = get_pod(env, name)
        if pod and (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return pod
        return None

    try:
        result: dict[str, Any] = eventually(done, timeout=timeout, what=f"pod {name} to end")
    except AssertionError:
        pod = get_pod(env, name) or {}
        raise AssertionError(
            f"pod {name}: {json.dumps(pod.get('status'), indent=1)}\n{env.runner.logs()[-3000:]}"
        ) from None
    return result


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    status = pod["status"]
    for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        if cs["name"] == name:
            result: dict[str, Any] = cs
            return result
    raise KeyError(name)


def dev_logs(env: LocalDefault, pod: str, name: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "agentrun_operator.cli", "dev", "logs", pod, "-c", name, "-n", NAMESPACE],
        env=dict(os.environ, AGENTRUN_DEV_HOME=str(env.state_dir)),
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_kubelet_order_env_volumes_and_messages(local_default: LocalDefault) -> None:
    env = local_default
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "runner-creds", "namespace": NAMESPACE},
        "data": {"token": base64.b64encode(b"s3cret").decode()},
    }
    env.apply(yaml.safe_dump(secret))
    env.create_claim("runner-order")
    order = "/workspace/order.log"
    create_pod(
        env,
        "order",
        {
            "initContainers": [
                {
                    "name": "side",
                    "image": "x",
                    "restartPolicy": "Always",
                    "command": ["sh", "-c"],
                    "args": [
                        f'trap "echo side-stop >> {order}; echo bye > /dev/termination-log; exit 0" TERM; '
                        f"echo side-start >> {order}; while true; do sleep 0.2; done"
                    ],
                    "volumeMounts": [{"name": "ws", "mountPath": "/workspace"}],
                },
                {
                    "name": "setup",
                    "image": "x",
                    "command": ["sh", "-c", f"echo setup >> {order}"],
                    "volumeMounts": [{"name": "ws", "mountPath": "/workspace"}],
                },
            ],
            "containers": [
                {
                    "name": "main",
                    "image": "x",
                    "workingDir": "/workspace/work",
                    "env": [
                        {"name": "GREETING", "value": "hello"},
                        {"name": "FULL", "value": "$(GREETING) from $(POD_NAME)"},  # POD_NAME: later
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                        {
                            "name": "TOKEN",
                            "valueFrom": {"secretKeyRef": {"name": "runner-creds", "key": "token"}},
                        },
                    ],
                    "command": ["sh", "-c"],
                    "args": [
                        f"echo main >> {order}; echo $(GREETING) $POD_NAME $NS $TOKEN; echo $FULL; pwd; "
                        "cat /creds/token; echo; "
                        "touch /creds/new 2>/dev/null && echo secret-writable; "
                        f"touch {sys.prefix}/written-by-a-pod 2>/dev/null && echo host-writable; "
                        "touch /scratch/ok && echo scratch-writable; "
                        "head -c 5000 /dev/zero | tr '\\0' m > /dev/termination-log; exit 3"
                    ],
                    "volumeMounts": [
                        {"name": "ws", "mountPath": "/workspace"},
                        {"name": "creds", "mountPath": "/creds"},
                        {"name": "scratch", "mountPath": "/scratch"},
                    ],
                },
                {
                    "name": "fallback",
                    "image": "x",
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                    "command": ["sh", "-c", "for i in 1 2 3; do echo line $i; done; exit 1"],
                },
            ],
            "volumes": [
                {"name": "ws", "persistentVolumeClaim": {"claimName": "runner-order"}},
                {"name": "creds", "secret": {"secretName": "runner-creds"}},
                {"name": "scratch", "emptyDir": {}},
            ],
        },
    )
    pod = wait_terminal(env, "order")
    assert pod["spec"]["nodeName"] == "agentrun-e2e"
    assert pod["status"]["phase"] == "Failed"
    lines = (env.claim_dir("runner-order") / "order.log").read_text().splitlines()
    # A sidecar counts as started once its process runs (no startup probe), as on a kubelet: the
    # init container after it may then write first, so only the containers' start order is fixed.
    assert sorted(lines[:2]) == ["setup", "side-start"] and lines[2:] == ["main", "side-stop"], lines
    started = {name: container(pod, name)["state"]["terminated"]["startedAt"] for name in ("side", "setup")}
    assert started["side"] <= started["setup"], started
    main = container(pod, "main")["state"]["terminated"]
    assert main["exitCode"] == 3 and main["reason"] == "Error"
    assert main["message"] == "m" * 4096  # the kubelet's cap
    assert main["startedAt"] and main["finishedAt"]
    fallback = container(pod, "fallback")["state"]["terminated"]
    assert fallback["exitCode"] == 1 and fallback["message"] == "line 1\nline 2\nline 3\n"
    side = container(pod, "side")["state"]["terminated"]
    assert side["exitCode"] == 0 and side["message"] == "bye\n"
    assert container(pod, "setup")["state"]["terminated"]["reason"] == "Completed"
    out = dev_logs(env, "order", "main").splitlines()
    assert out[0] == "hello order e2e s3cret"
    assert out[1] == "hello from $(POD_NAME)"  # defined after FULL: left as written
    assert out[2] == "/workspace/work"
    assert out[3] == "s3cret"
    assert "secret-writable" not in out and "host-writable" not in out
    assert "scratch-writable" in out
    assert not (Path(sys.prefix) / "written-by-a-pod").exists()  # the host (here: the venv) is read-only


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


def test_pid_1_ignores_sigterm_unless_the_pod_shares_its_process_namespace(
    local_default: LocalDefault,
) -> None:
    """As on a kubelet (docs/local-dev.md#pod-runner-signals): a container's command is PID 1 of its
    own PID namespace, where SIGTERM without a handler is ignored (`$$$$` is `$$` after the
    kubelet's `$(VAR)` expansion), so the pod's deadline stops it
    with SIGKILL after the grace period (137); in a pod with `shareProcessNamespace` the pause
    process is PID 1 and SIGTERM ends the command (143)."""
    grace, deadline = 3, 2
    for name, shared in (("pid-one", False), ("pid-shared", True)):
        create_pod(
            local_default,
            name,
            {
                "activeDeadlineSeconds": deadline,
                "terminationGracePeriodSeconds": grace,
                "shareProcessNamespace": shared,
                "containers": [
                    {"name": "main", "image": "x", "command": ["sh", "-c", "echo pid $$$$; exec sleep 7792"]}
                ],
            },
        )
    alone, shared_pod = wait_terminal(local_default, "pid-one"), wait_terminal(local_default, "pid-shared")
    assert dev_logs(local_default, "pid-one", "main").split() == ["pid", "1"]
    assert dev_logs(local_default, "pid-shared", "main").split()[0] == "pid"
    assert dev_logs(local_default, "pid-shared", "main").split() != ["pid", "1"]
    killed = container(alone, "main")["state"]["terminated"]
    termed = container(shared_pod, "main")["state"]["terminated"]
    assert (killed["exitCode"], termed["exitCode"]) == (137, 143)
    assert alone["status"]["reason"] == shared_pod["status"]["reason"] == "DeadlineExceeded"
    # The grace period was honoured: SIGKILL came no earlier than the deadline plus the grace
    # (timestamps have whole seconds, hence the one second of slack).
    started = datetime.fromisoformat(alone["status"]["startTime"].replace("Z", "+00:00"))
    finished = datetime.fromisoformat(killed["finishedAt"].replace("Z", "+00:00"))
    assert (finished - started).total_seconds() >= deadline + grace - 1


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
