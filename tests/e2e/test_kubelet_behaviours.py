"""What a kubelet does that the product relies on, checked on whatever runs the pods: the local pod
runner here, the real kubelet in the node tier (tests/node/, which takes these tests over unchanged),
so the imitation cannot drift from the real thing unseen (docs/development.md#tiers).

Native sidecars start before the init containers after them and get SIGTERM after the main
containers end; `$(VAR)` expansion; secret, emptyDir and PVC volumes; exit codes; termination
messages (the last 4096 bytes of the file, each container's share of the pod's 12 KiB, the log's
tail with FallbackToLogsOnError); PID 1 and the grace period; a sidecar's postStart hook, which
completes before the next container starts, and kills its container when it fails; regular
containers started in order, each after its postStart hook, the next started even when a hook
fails; a shared PID namespace (`shareProcessNamespace`) seen from a non-root container; a subPath
that leaves its volume keeping its container waiting (`CreateContainerConfigError`) until fixed; a
secret volume whose Secret is missing posting `FailedMount` until it exists; a pod's own IP,
which the host reaches and two pods serve the same port on. docs/local-dev.md#pod-runner-fidelity
lists which test checks which behaviour.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from agentrun_operator.config import DEFAULT_REPORTER_IMAGE
from tests.e2e.conftest import NAMESPACE, LocalDefault
from tests.support.polling import eventually

IMAGE = "busybox:1.36"
"""The pod runner's process runtime ignores images (the host's `sh` runs); the real node runs this."""


def create_pod(env: LocalDefault, name: str, spec: dict[str, Any]) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": env.namespace},
        "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False, **spec},
    }
    env.apply(yaml.safe_dump(pod))


def get_pod(env: LocalDefault, name: str) -> dict[str, Any] | None:
    code, body = env.plane.api_get(f"/api/v1/namespaces/{env.namespace}/pods/{name}")
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
        [sys.executable, "-m", "agentrun_operator.cli", "dev", "logs", pod, "-c", name, "-n", env.namespace],
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
                    "image": IMAGE,
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
                    "image": IMAGE,
                    "command": ["sh", "-c", f"echo setup >> {order}"],
                    "volumeMounts": [{"name": "ws", "mountPath": "/workspace"}],
                },
            ],
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
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
                    "image": IMAGE,
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
    assert pod["status"]["phase"] == "Failed"
    lines = (env.claim_dir("runner-order") / "order.log").read_text().splitlines()
    # A sidecar counts as started once its process runs (no startup probe), as on a kubelet: the
    # init container after it may then write first, so only the containers' start order is fixed.
    assert sorted(lines[:2]) == ["setup", "side-start"] and lines[2:] == ["main", "side-stop"], lines
    started = {name: container(pod, name)["state"]["terminated"]["startedAt"] for name in ("side", "setup")}
    assert started["side"] <= started["setup"], started
    main = container(pod, "main")["state"]["terminated"]
    assert main["exitCode"] == 3 and main["reason"] == "Error"
    # The file's last 4096 bytes, then this container's share of the pod's 12 KiB: 4 containers, 3072.
    assert main["message"] == "m" * 3072
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


def test_a_sidecars_post_start_hook_runs_before_main_and_a_failing_one_keeps_main_from_starting(
    local_default: LocalDefault,
) -> None:
    """The iteration pod's fingerprint runs as the reporter's postStart hook
    (docs/design.md#fingerprint-hook):
    the kubelet starts the next container only once the hook has completed (here it takes a second,
    so `main` would otherwise see no file), and a hook that fails kills its container, so `main`
    never starts (the duplicate pod's guard)."""
    env = local_default
    env.create_claim("runner-hooks")
    volumes = [{"name": "ws", "persistentVolumeClaim": {"claimName": "runner-hooks"}}]
    mounts = [{"name": "ws", "mountPath": "/workspace"}]

    def sidecar(hook: str) -> dict[str, Any]:
        return {
            "name": "side",
            "image": IMAGE,
            "restartPolicy": "Always",
            "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"],
            "lifecycle": {"postStart": {"exec": {"command": ["sh", "-c", hook]}}},
            "volumeMounts": mounts,
        }

    def main(marker: str) -> dict[str, Any]:
        command = f"cat /workspace/hooked 2>/dev/null || echo none; echo ran > /workspace/{marker}"
        return {"name": "main", "image": IMAGE, "command": ["sh", "-c", command], "volumeMounts": mounts}

    create_pod(
        env,
        "hooked",
        {
            "shareProcessNamespace": True,
            "terminationGracePeriodSeconds": 3,
            "initContainers": [sidecar("sleep 1; echo hook-done > /workspace/hooked")],
            "containers": [main("main-of-hooked")],
            "volumes": volumes,
        },
    )
    create_pod(
        env,
        "hook-fails",
        {
            "shareProcessNamespace": True,
            "terminationGracePeriodSeconds": 3,
            "activeDeadlineSeconds": 8,
            "initContainers": [sidecar("echo refused > /workspace/refused; exit 1")],
            "containers": [main("main-of-hook-fails")],
            "volumes": volumes,
        },
    )
    hooked = wait_terminal(env, "hooked")
    assert hooked["status"]["phase"] == "Succeeded", hooked["status"]
    assert dev_logs(env, "hooked", "main").split() == ["hook-done"]
    failed = wait_terminal(env, "hook-fails")
    assert failed["status"]["phase"] == "Failed" and failed["status"].get("reason") == "DeadlineExceeded"
    claim = env.claim_dir("runner-hooks")
    assert (claim / "refused").exists()  # the hook ran
    assert not (claim / "main-of-hook-fails").exists()  # and main never did
    side = container(failed, "side")
    ended = (side.get("state") or {}).get("terminated") or (side.get("lastState") or {}).get("terminated")
    assert ended is not None, side  # the failed hook killed the sidecar
    main_state = container(failed, "main").get("state") or {}
    assert "running" not in main_state and not (main_state.get("terminated") or {}).get("startedAt")


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
                    {
                        "name": "main",
                        "image": IMAGE,
                        "command": ["sh", "-c", "echo pid $$$$; exec sleep 7792"],
                    }
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


def test_termination_messages_keep_the_files_end_within_the_pods_budget(local_default: LocalDefault) -> None:
    """The kubelet reads a termination message file from its end (the last 4096 bytes) and then
    gives each container of the pod an equal share of 12 KiB, keeping the first bytes: a pod of
    four containers reports 3072 bytes each. The reporter's envelope relies on both."""
    write = (
        "head -c 1000 /dev/zero | tr '\\0' a > /dev/termination-log; "
        "head -c {n} /dev/zero | tr '\\0' z >> /dev/termination-log"
    )
    create_pod(
        local_default,
        "messages",
        {
            "containers": [
                {"name": f"c{i}", "image": IMAGE, "command": ["sh", "-c", write.format(n=n)]}
                for i, n in enumerate((4096, 100, 2000, 10))
            ]
        },
    )
    pod = wait_terminal(local_default, "messages")
    messages = [container(pod, f"c{i}")["state"]["terminated"].get("message", "") for i in range(4)]
    assert messages[0] == "z" * 3072  # the file's last 4096 bytes, then the pod's share: the first 3072
    assert messages[1] == "a" * 1000 + "z" * 100
    assert messages[2] == "a" * 1000 + "z" * 2000
    assert messages[3] == "a" * 1000 + "z" * 10


_WATCH = (
    # No fork between the two reads of /proc/loadavg (`read`, `:` with a redirection and `[` are
    # builtins), so the last-pid field can grow only by the other container's processes, which
    # start only once the first read is done (/shared/ready); then the other container's shell is
    # found by the marker in its cmdline (built here, so this script's own cmdline lacks it).
    "read -r a b c d first rest < /proc/loadavg; : > /shared/ready; i=0; "
    "while [ ! -f /shared/started ] && [ $i -lt 30000000 ]; do i=$((i+1)); done; "
    "read -r a b c d after rest < /proc/loadavg; m=agentrun-marker; m=$m-7793; seen=none; n=0; "
    "while [ $seen = none ] && [ $n -lt 300 ]; do n=$((n+1)); "
    '  for d in /proc/[0-9]*; do if tr "\\0" " " < $d/cmdline 2>/dev/null | grep -q $m; then '
    "    seen=${d#/proc/}; state=$(cut -d' ' -f3 $d/stat); fi; done; "
    "  [ $seen = none ] && sleep 0.1; done; "
    'echo "first=${first#*/} after=${after#*/} seen=$seen state=$state uid=$(id -u)" > /dev/termination-log; '
    "touch /shared/seen; [ $seen != none ]"
)
_TARGET = (
    "while [ ! -f /shared/ready ]; do sleep 0.1; done; touch /shared/started; "
    "while [ ! -f /shared/seen ]; do sleep 0.1; done"
)


def test_containers_of_a_pod_sharing_its_process_namespace_see_each_others_processes(
    local_default: LocalDefault,
) -> None:
    """`shareProcessNamespace: true` (the iteration pod's reporter watches `main` this way): one PID
    namespace for the pod, so a container (here running as a non-root user) lists the other
    container's process in /proc, reads its stat and cmdline, and the last-pid field of
    /proc/loadavg (per the reader's namespace) grows when the other container starts."""
    shared = [{"name": "shared", "mountPath": "/shared"}]
    create_pod(
        local_default,
        "pidns",
        {
            "shareProcessNamespace": True,
            "terminationGracePeriodSeconds": 3,
            "containers": [
                {
                    "name": "watcher",
                    "image": IMAGE,
                    "securityContext": {"runAsUser": 10001},
                    "command": ["sh", "-c", _WATCH],
                    "volumeMounts": shared,
                },
                {
                    "name": "target",
                    "image": IMAGE,
                    "command": ["sh", "-c", _TARGET, "agentrun-marker-7793"],
                    "volumeMounts": shared,
                },
            ],
            "volumes": [{"name": "shared", "emptyDir": {}}],
        },
    )
    pod = wait_terminal(local_default, "pidns")
    watched = container(pod, "watcher")["state"]["terminated"]
    fields = dict(part.split("=", 1) for part in (watched.get("message") or "").split())
    assert pod["status"]["phase"] == "Succeeded", (pod["status"], fields)
    assert fields["seen"].isdigit() and int(fields["seen"]) > 1, fields  # not the pause process
    # Its stat was readable and it was alive: any state of a live process (a busy machine's I/O puts
    # it in D, uninterruptible sleep), not a zombie or a dead one, which mainwatch takes for gone.
    assert fields["state"] and fields["state"] not in ("Z", "X", "x"), fields
    assert int(fields["after"]) > int(fields["first"]), fields  # the other container's pids count
    assert container(pod, "target")["state"]["terminated"]["exitCode"] == 0


def _regular(name: str, command: str, hook: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "image": IMAGE,
        "command": ["sh", "-c", command],
        "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
    }
    if hook is not None:
        spec["lifecycle"] = {"postStart": {"exec": {"command": ["sh", "-c", hook]}}}
    return spec


def test_regular_containers_start_in_order_each_after_its_post_start_hook(
    local_default: LocalDefault,
) -> None:
    """Regular containers start one after another, in their order, and the kubelet runs each one's
    postStart hook to completion before it starts the next (the iteration pod's reporter, listed
    before `main`, relies on it); a hook that fails kills its container, and the next one still
    starts."""
    waiting = "trap 'exit 0' TERM; while [ ! -f /shared/done ]; do sleep 0.2; done"
    second = (
        "if [ -f /shared/x ]; then echo found; else echo missing; fi > /dev/termination-log; "
        "touch /shared/done"
    )
    for name, hook in (("ordered", "sleep 1; touch /shared/x"), ("hook-refused", "touch /shared/x; exit 1")):
        create_pod(
            local_default,
            name,
            {
                "shareProcessNamespace": True,
                "terminationGracePeriodSeconds": 3,
                "containers": [_regular("first", waiting, hook), _regular("second", second)],
                "volumes": [{"name": "shared", "emptyDir": {}}],
            },
        )
    ordered = wait_terminal(local_default, "ordered")
    assert ordered["status"]["phase"] == "Succeeded", ordered["status"]
    assert container(ordered, "second")["state"]["terminated"]["message"] == "found\n"
    refused = wait_terminal(local_default, "hook-refused")
    first = container(refused, "first")["state"]["terminated"]
    assert first["startedAt"], first  # it ran, then its failed hook ended it
    second_state = container(refused, "second")["state"]["terminated"]
    assert second_state["exitCode"] == 0 and second_state["message"] == "found\n", second_state


def test_a_subpath_leaving_its_volume_keeps_the_container_waiting_until_fixed(
    local_default: LocalDefault,
) -> None:
    """The duplicate pod's gate: a subPath that, symlinks evaluated, is not within its volume (here
    a symlink to `/`, made by the first container's postStart hook in a shared emptyDir) is refused
    by the kubelet's PrepareSafeSubpath; the container waits with `CreateContainerConfigError` and
    the kubelet's message, retried, and starts once the path is a directory again. A subPath that
    does not exist is made as a directory."""
    fix = (
        "trap 'exit 0' TERM; sleep 8; rm /meta/gate; mkdir /meta/gate; "
        "while [ ! -f /meta/gate/ran ]; do sleep 0.2; done; "
        "if [ -d /meta/made/here ]; then echo dir; else echo no-dir; fi > /dev/termination-log"
    )
    create_pod(
        local_default,
        "gated",
        {
            "shareProcessNamespace": True,
            "terminationGracePeriodSeconds": 3,
            "containers": [
                {
                    "name": "reporter",
                    "image": IMAGE,
                    "command": ["sh", "-c", fix],
                    "lifecycle": {"postStart": {"exec": {"command": ["sh", "-c", "ln -s / /meta/gate"]}}},
                    "volumeMounts": [{"name": "agentrun-meta", "mountPath": "/meta"}],
                },
                {
                    "name": "main",
                    "image": IMAGE,
                    "command": [
                        "sh",
                        "-c",
                        "touch /gate/ran; [ -d /made ] && echo made > /dev/termination-log",
                    ],
                    "volumeMounts": [
                        {"name": "agentrun-meta", "mountPath": "/gate", "subPath": "gate"},
                        {"name": "agentrun-meta", "mountPath": "/made", "subPath": "made/here"},
                    ],
                },
            ],
            "volumes": [{"name": "agentrun-meta", "emptyDir": {}}],
        },
    )

    def gated() -> dict[str, Any] | None:
        pod = get_pod(local_default, "gated") or {}
        try:
            waiting = (container(pod, "main").get("state") or {}).get("waiting")
        except KeyError:
            return None
        return waiting if waiting and waiting.get("reason") == "CreateContainerConfigError" else None

    waiting = eventually(gated, timeout=60, what="main waiting at the gate")
    assert (
        waiting["message"] == 'failed to prepare subPath for volumeMount "agentrun-meta" of container "main"'
    )
    pod = wait_terminal(local_default, "gated")
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    assert container(pod, "main")["state"]["terminated"]["message"] == "made\n"
    assert container(pod, "reporter")["state"]["terminated"]["message"] == "dir\n"


def test_a_secret_volume_whose_secret_is_missing_waits_with_a_failed_mount_event_until_it_exists(
    local_default: LocalDefault,
) -> None:
    """The pod-waits path (docs/design.md#pod-waits) reads why a pod stays `ContainerCreating` from
    the kubelet's `FailedMount` Events, not from its status: a secret volume whose Secret does not
    exist is one, in the kubelet's words, retried until the Secret is there; then the pod runs."""
    env = local_default
    create_pod(
        env,
        "mounted-later",
        {
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "command": ["sh", "-c", "cat /s/key > /dev/termination-log"],
                    "volumeMounts": [{"name": "s", "mountPath": "/s"}],
                }
            ],
            "volumes": [{"name": "s", "secret": {"secretName": "mounted-later"}}],
        },
    )
    expected = 'MountVolume.SetUp failed for volume "s" : secret "mounted-later" not found'

    def failed_mount() -> dict[str, Any] | None:
        out = env.plane.kubectl(
            "get", "events", "-n", env.namespace, "--field-selector",
            "involvedObject.name=mounted-later,reason=FailedMount", "-o", "json",
        )  # fmt: skip
        events = [e for e in json.loads(out)["items"] if e.get("message") == expected]
        return events[0] if events else None

    event = eventually(failed_mount, timeout=120, what="the FailedMount Event of the missing secret")
    assert event["type"] == "Warning" and event["source"]["component"] == "kubelet", event

    def creating() -> dict[str, Any] | None:
        # The kubelet's status write is its own, and may land after its Event (its first one can be
        # refused while the node authorizer has not yet learnt the pod is on the node).
        pod = get_pod(env, "mounted-later") or {}
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        return pod if statuses else None

    pod = eventually(creating, timeout=120, what="the kubelet's status of the pod waiting for its secret")
    assert pod["status"]["phase"] == "Pending", pod["status"]
    assert (container(pod, "main").get("state") or {}).get("waiting", {}).get("reason") == "ContainerCreating"
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "mounted-later", "namespace": env.namespace},
        "stringData": {"key": "mounted now"},
    }
    env.apply(yaml.safe_dump(secret))
    # The kubelet retries a failed mount with a back-off that grows to about 2 minutes.
    ended = wait_terminal(env, "mounted-later", timeout=300)
    assert ended["status"]["phase"] == "Succeeded", ended["status"]
    assert container(ended, "main")["state"]["terminated"]["message"] == "mounted now"


POD_PORT = 8471
"""The warm channel's port (docs/design.md#warm-channel): a server in the pod on its own pod IP."""
SERVE_ON_POD_IP = f"""
import os, socket
ip, name = os.environ["POD_IP"], os.environ["POD_NAME"]
server = socket.create_server((ip, {POD_PORT}))
while True:
    conn, _ = server.accept()
    with conn:
        try:
            conn.sendall(f"{{name}} {{ip}}\\n".encode())
            said = conn.makefile().readline().strip()
        except OSError:
            continue
        if said == "stop":
            break
"""
"""Answers each connection with the pod's name and the address it serves on, and ends once told
`stop`. It binds the pod IP only (not 0.0.0.0), as the warm supervisor does. A connection that
goes at once (the kubelet's tcpSocket probe connects and closes) is not an answer: it goes on."""


def ready_with_ip(env: LocalDefault, name: str) -> dict[str, Any] | None:
    pod = get_pod(env, name) or {}
    status = pod.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    return pod if status.get("phase") == "Running" and status.get("podIP") and ready else None


def answer(ip: str, reply: str) -> str | None:
    """The first line the server on ip:POD_PORT sends, after which it is told `reply`; None while
    nothing answers there (not listening yet, or unreachable)."""
    try:
        with socket.create_connection((ip, POD_PORT), timeout=10) as conn:
            line = conn.makefile().readline().strip()
            conn.sendall(f"{reply}\n".encode())
    except OSError:
        return None
    return line or None


def test_the_host_reaches_each_pod_on_its_own_ip_where_two_pods_serve_one_port(
    local_default: LocalDefault,
) -> None:
    """The operator (a process on the host) calls a warm pod on its `status.podIP`, where a server
    in the pod listens on the address the downward API gave it (docs/design.md#warm-channel). Two
    such pods on the same port at once do not collide: each has an IP of its own, not the host's.
    On the real node the kubelet's own tcpSocket readiness probe reaches the pod too, from the host
    (the pod runner runs no probes: its pod is ready once it runs). No `ports` are declared: a pod
    with ports gets a network namespace of its own on the pod runner (docs/local-dev.md#network)."""
    env = local_default
    names = ("serves-a", "serves-b")
    for name in names:
        create_pod(
            env,
            name,
            {
                "terminationGracePeriodSeconds": 3,
                "containers": [
                    {
                        "name": "main",
                        "image": DEFAULT_REPORTER_IMAGE,  # python3, in the operator image and on the host
                        "command": ["python3", "-c", SERVE_ON_POD_IP],
                        "env": [
                            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        ],
                        "readinessProbe": {"tcpSocket": {"port": POD_PORT}, "periodSeconds": 1},
                    }
                ],
            },
        )
    pods = {
        name: eventually(lambda n=name: ready_with_ip(env, n), timeout=120, what=f"{name} ready")
        for name in names
    }
    ips = {name: pod["status"]["podIP"] for name, pod in pods.items()}
    assert len(set(ips.values())) == len(names), ips
    for pod in pods.values():
        status = pod["status"]
        assert status["podIPs"] == [{"ip": status["podIP"]}] and status["podIP"] != status["hostIP"], status
    for name in names:  # both listen on the same port at once, each on its own address
        said = eventually(
            lambda n=name: answer(ips[n], "hello"),
            timeout=60,
            what=f"{name} to answer on {ips[name]}:{POD_PORT}",
        )
        assert said == f"{name} {ips[name]}"  # the downward API's podIP is the status's
    for name in names:
        assert answer(ips[name], "stop") == f"{name} {ips[name]}"
        ended = wait_terminal(env, name)
        assert ended["status"]["phase"] == "Succeeded", ended["status"]
