"""The local pod runner's docker runtime: the examples, unchanged, in real containers from local
images (busybox:1.36 and the operator image as the reporter), and what a kubelet would do with the
securityContext, termination messages, deletion and an image that is not there.

Needs a Docker engine: the `docker_image` fixture starts one (root, Debian) and builds the images
once, or skips every test here with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from agentrun_devcluster.controlplane import ControlPlane
from agentrun_devcluster.dockerengine import docker
from agentrun_devcluster.podrunner.docker import LABEL_UID
from tests.e2e import test_kubelet_behaviours as behaviours
from tests.e2e.conftest import LocalDefault, start_local_default, step_status
from tests.e2e.test_kubelet_behaviours import create_pod, get_pod
from tests.support.polling import eventually

NAMESPACE = "e2e-docker"
NODE = "agentrun-e2e-docker"


@pytest.fixture(scope="module")
def docker_default(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory, docker_image: str
) -> Iterator[LocalDefault]:
    yield from start_local_default(
        control_plane,
        tmp_path_factory,
        namespace=NAMESPACE,
        node=NODE,
        runtime="docker",
        operator_env={"AGENTS_REPORTER_IMAGE": docker_image},
    )


def main_status(pod: dict[str, Any] | None) -> dict[str, Any]:
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or [{}]
    result: dict[str, Any] = statuses[0]
    return result


def wait_terminal(env: LocalDefault, name: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        pod = get_pod(env, name)
        return pod if ((pod or {}).get("status") or {}).get("phase") in ("Succeeded", "Failed") else None

    try:
        result: dict[str, Any] = eventually(done, timeout=120, what=f"pod {name} to end")
    except AssertionError:
        status = (get_pod(env, name) or {}).get("status")
        raise AssertionError(f"pod {name}: {json.dumps(status)}\n{env.runner.logs()[-3000:]}") from None
    return result


def dev_logs(env: LocalDefault, pod: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "agentrun_operator.cli", "dev", "logs", pod, "-n", NAMESPACE],
        env=dict(os.environ, AGENTRUN_DEV_HOME=str(env.state_dir)),
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def containers_of(uid: str) -> list[str]:
    return docker("ps", "--all", "--quiet", "--filter", f"label={LABEL_UID}={uid}").stdout.split()


def test_fixed_loop_in_containers(docker_default: LocalDefault) -> None:
    docker_default.apply_example("fixed-loop.yaml")
    run = docker_default.wait_for_end("fixed-loop")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    loop = step_status(run)["loop"]
    assert loop["stopReason"] == "LoopMaxIterationsReached"
    assert loop["completedIterations"] == 3
    lines = (docker_default.claim_dir("fixed-loop-workspace") / "log.txt").read_text().splitlines()
    assert [line.split(" at ")[0] for line in lines] == [f"iteration {k} of 3" for k in (1, 2, 3)]


def test_conditional_loop_in_containers(docker_default: LocalDefault) -> None:
    docker_default.apply_example("conditional-loop.yaml")
    run = docker_default.wait_for_end("conditional-loop")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    loop = step_status(run)["loop"]
    assert loop["stopReason"] == "LoopConditionFalse"
    assert loop["completedIterations"] == 3
    # the control object came out through the reporter container of the operator image
    assert loop["lastControl"] == {"continue": False, "outputs": {"iteration": 3, "notes": 3}}
    root = docker_default.claim_dir("conditional-loop-workspace")
    assert len((root / "notes" / "progress.log").read_text().splitlines()) == 3
    # each iteration's reporter (uid 10001 in the image) claimed its Job for its pod
    claims = sorted((root / ".agentrun-claims").iterdir())
    assert len(claims) == 3 and all(len(c.read_text()) == 36 for c in claims), claims


def test_user_read_only_root_termination_message_exit_code_and_logs(docker_default: LocalDefault) -> None:
    script = (
        "id -u; id -g; touch /root-is-writable 2>/dev/null || echo read-only root; "
        "echo done > /data/out; echo 'the message' > /dev/termination-log; exit 3"
    )
    create_pod(
        docker_default,
        "secure",
        {
            "securityContext": {"runAsUser": 4242, "runAsGroup": 4343},
            "volumes": [{"name": "data", "emptyDir": {}}],
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:1.36",
                    "command": ["sh", "-c", script],
                    "securityContext": {"readOnlyRootFilesystem": True},
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            ],
        },
    )
    pod = wait_terminal(docker_default, "secure")
    assert pod["status"]["phase"] == "Failed"
    terminated = main_status(pod)["state"]["terminated"]
    assert terminated["exitCode"] == 3
    assert terminated["reason"] == "Error"
    assert terminated["message"] == "the message\n"
    assert main_status(pod)["containerID"].startswith("docker://")
    assert dev_logs(docker_default, "secure").splitlines() == ["4242", "4343", "read-only root"]
    assert not containers_of(pod["metadata"]["uid"]), "the ended container is removed"


def test_a_missing_image_waits_with_err_image_never_pull(docker_default: LocalDefault) -> None:
    create_pod(
        docker_default,
        "no-image",
        {"containers": [{"name": "main", "image": "agentrun-test/not-here:0", "command": ["true"]}]},
    )

    def waiting() -> dict[str, Any] | None:
        state = main_status(get_pod(docker_default, "no-image")).get("state") or {}
        return (
            state.get("waiting")
            if (state.get("waiting") or {}).get("reason") == "ErrImageNeverPull"
            else None
        )

    waiting_state = eventually(waiting, timeout=60, what="ErrImageNeverPull")
    assert "agentrun-test/not-here:0" in waiting_state["message"]
    assert "not present locally" in waiting_state["message"]
    assert (get_pod(docker_default, "no-image") or {})["status"]["phase"] == "Pending"
    docker_default.plane.kubectl("delete", "pod", "no-image", "-n", NAMESPACE, "--wait=false")
    eventually(lambda: get_pod(docker_default, "no-image") is None, timeout=60, what="no-image to go")


def test_deletion_sends_sigterm_then_the_container_is_gone(docker_default: LocalDefault) -> None:
    script = "trap 'echo got TERM; exit 0' TERM; echo started; while true; do sleep 1; done"
    create_pod(
        docker_default,
        "sleeper",
        {
            "terminationGracePeriodSeconds": 20,
            "containers": [{"name": "main", "image": "busybox:1.36", "command": ["sh", "-c", script]}],
        },
    )
    pod = eventually(
        lambda: (
            (p := get_pod(docker_default, "sleeper"))
            and "running" in (main_status(p).get("state") or {})
            and p
        ),
        timeout=60,
        what="sleeper to run",
    )
    uid = pod["metadata"]["uid"]
    assert containers_of(uid), "a running container carries the pod's uid"
    docker_default.plane.kubectl("delete", "pod", "sleeper", "-n", NAMESPACE, "--wait=false")
    eventually(lambda: get_pod(docker_default, "sleeper") is None, timeout=60, what="sleeper to go")
    assert not containers_of(uid)
    assert dev_logs(docker_default, "sleeper").splitlines() == ["started", "got TERM"]


def test_a_pod_with_ports_gets_its_own_network_with_the_api_server_in_it(
    docker_default: LocalDefault,
) -> None:
    script = (
        "readlink /proc/self/ns/net; "
        'nc -w 5 "$KUBERNETES_SERVICE_HOST" "$KUBERNETES_SERVICE_PORT" </dev/null '
        "&& echo api-reachable || echo api-unreachable"
    )
    create_pod(
        docker_default,
        "server",
        {
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:1.36",
                    "command": ["sh", "-c", script],
                    "ports": [{"containerPort": 8080}],
                }
            ]
        },
    )
    pod = wait_terminal(docker_default, "server")
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    namespace_link, reachable = dev_logs(docker_default, "server").splitlines()
    assert namespace_link.startswith("net:[")
    assert namespace_link != os.readlink("/proc/self/ns/net"), "the pod has a network namespace of its own"
    assert reachable == "api-reachable"
    uid = pod["metadata"]["uid"]
    assert containers_of(uid), "the pause container holds the namespace while the pod exists"
    docker_default.plane.kubectl("delete", "pod", "server", "-n", NAMESPACE, "--wait=false")
    eventually(lambda: get_pod(docker_default, "server") is None, timeout=60, what="server to go")
    eventually(lambda: not containers_of(uid), timeout=30, what="the pause container to go")


IN_CLUSTER_CHECK = """
import json, os, ssl, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
token = open(f"{sa}/token").read()
ctx = ssl.create_default_context(cafile=f"{sa}/ca.crt")
url = f"https://{os.environ['KUBERNETES_SERVICE_HOST']}:{os.environ['KUBERNETES_SERVICE_PORT']}/version"
req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
version = json.load(urllib.request.urlopen(req, context=ctx))
print(os.getuid(), open(f"{sa}/namespace").read(), version["major"])
"""


def test_the_operator_image_logs_in_with_in_cluster_credentials(
    docker_default: LocalDefault, docker_image: str
) -> None:
    """What the chart's operator pod needs in containers: the image's user, the ServiceAccount
    volume admission adds, and the API server at KUBERNETES_SERVICE_HOST/PORT in its own network."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "in-cluster", "namespace": NAMESPACE},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": docker_image,
                    "command": ["python", "-c", IN_CLUSTER_CHECK],
                    "ports": [{"containerPort": 8080}],
                }
            ],
        },
    }
    docker_default.apply(yaml.safe_dump(pod))
    ended = wait_terminal(docker_default, "in-cluster")
    assert ended["status"]["phase"] == "Succeeded", (ended["status"], dev_logs(docker_default, "in-cluster"))
    assert dev_logs(docker_default, "in-cluster").split() == ["10001", NAMESPACE, "1"]


def _state(container: str) -> dict[str, Any]:
    """The engine's `.State` of a container (empty when the engine has no such container)."""
    proc = docker("inspect", "--format", "{{json .State}}", container.removeprefix("docker://"))
    state: dict[str, Any] = json.loads(proc.stdout) if proc.returncode == 0 else {}
    return state


def test_runner_killed_and_restarted_adopts_running_containers_and_reports_finished_ones(
    docker_default: LocalDefault,
) -> None:
    """Containers outlive the runner, as containers outlive a kubelet restart: the new runner adopts
    the running ones (the same container, its pause container and log kept; also one whose launch
    record was never written) and reports the one that ended while no runner ran with its real exit
    code, termination message and whole log."""
    env = docker_default
    env.create_claim("docker-restart-gate")
    gate = env.claim_dir("docker-restart-gate") / "go"
    gate.unlink(missing_ok=True)
    waits = "echo before; while [ ! -e /gate/go ]; do sleep 0.2; done; echo after"
    create_pod(
        env,
        "d-ends-unseen",
        {
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:1.36",
                    "command": ["sh", "-c", f"{waits}; echo finished-unseen > /dev/termination-log; exit 3"],
                    "volumeMounts": [{"name": "gate", "mountPath": "/gate"}],
                }
            ],
            "volumes": [{"name": "gate", "persistentVolumeClaim": {"claimName": "docker-restart-gate"}}],
        },
    )
    create_pod(
        env,
        "d-keeps-running",
        {
            "terminationGracePeriodSeconds": 1,  # `sh` is PID 1 and ignores SIGTERM
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:1.36",
                    "command": ["sh", "-c", f"{waits}; sleep 3600"],
                    "volumeMounts": [{"name": "gate", "mountPath": "/gate"}],
                    "ports": [{"containerPort": 8080}],  # its own network: a pause container
                }
            ],
            "volumes": [{"name": "gate", "persistentVolumeClaim": {"claimName": "docker-restart-gate"}}],
        },
    )

    def running(name: str) -> bool:
        return ((get_pod(env, name) or {}).get("status") or {}).get("phase") == "Running"

    eventually(lambda: running("d-ends-unseen") and running("d-keeps-running"), timeout=120, what="the pods")
    kept = get_pod(env, "d-keeps-running") or {}
    before = main_status(kept)
    uid = kept["metadata"]["uid"]
    containers = sorted(containers_of(uid))
    assert len(containers) == 2, "the container and the pod's pause container"
    started = _state(before["containerID"])["StartedAt"]

    env.runner.kill()  # the runner's process group: its `docker start --attach` clients too
    try:
        assert _state(before["containerID"])["Running"], "the container outlived its runner"
        # As if the runner had died between starting it and recording it: found by its name.
        records = list(env.state_dir.glob("pods/e2e-docker/d-keeps-running/*/containers/main/launch.json"))
        assert len(records) == 1
        records[0].unlink()
        gate.write_text("go")
        unseen = main_status(get_pod(env, "d-ends-unseen"))["containerID"]
        eventually(
            lambda: _state(unseen).get("Status") == "exited", timeout=60, what="the unseen container to end"
        )
    finally:
        env.runner.start()

    ended = wait_terminal(env, "d-ends-unseen")
    main = main_status(ended)
    assert ended["status"]["phase"] == "Failed"
    assert main["state"]["terminated"]["exitCode"] == 3
    assert main["state"]["terminated"]["reason"] == "Error"
    assert main["state"]["terminated"]["message"].strip() == "finished-unseen"
    assert dev_logs(env, "d-ends-unseen").splitlines() == ["before", "after"]  # "after": while no runner ran
    eventually(lambda: not _state(unseen), timeout=60, what="the ended container to be removed")

    after = main_status(get_pod(env, "d-keeps-running"))
    assert "running" in after["state"], after
    assert after["containerID"] == before["containerID"] and after["restartCount"] == 0
    assert _state(after["containerID"])["StartedAt"] == started, "adopted, not started again"
    assert sorted(containers_of(uid)) == containers, "the same container and pause container"
    assert "adopted main (running)" in env.runner.logs()
    eventually(
        lambda: dev_logs(env, "d-keeps-running").splitlines() == ["before", "after"],
        timeout=30,
        what="the adopted container's whole log",
    )

    env.plane.kubectl("delete", "pod", "d-keeps-running", "d-ends-unseen", "-n", NAMESPACE, "--wait=false")
    eventually(lambda: get_pod(env, "d-keeps-running") is None, timeout=90, what="d-keeps-running to go")
    eventually(lambda: not containers_of(uid), timeout=60, what="the adopted containers to be removed")


@pytest.mark.parametrize(
    "behaviour",
    [
        behaviours.test_containers_of_a_pod_sharing_its_process_namespace_see_each_others_processes,
        behaviours.test_regular_containers_start_in_order_each_after_its_post_start_hook,
        behaviours.test_a_subpath_leaving_its_volume_keeps_the_container_waiting_until_fixed,
        behaviours.test_pid_1_ignores_sigterm_unless_the_pod_shares_its_process_namespace,
    ],
    ids=lambda test: test.__name__.removeprefix("test_"),
)
def test_kubelet_behaviours_of_sharing_pods_in_containers(
    docker_default: LocalDefault, behaviour: Callable[[LocalDefault], None]
) -> None:
    """The shared PID namespace (a pause container, `--pid container:`), regular containers' hook
    order and the subPath gate, checked in real containers by the same assertions as on the process
    runtime and the real node (the watcher runs as uid 10001 here, as there)."""
    behaviour(docker_default)
