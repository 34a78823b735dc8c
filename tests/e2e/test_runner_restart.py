"""The pod runner restarted under running pods, as a kubelet is: containers outlive it, the new
runner adopts the ones still running and reports the ones that ended meanwhile truthfully."""

from __future__ import annotations

from pathlib import Path

from agentrun_devcluster.podrunner.network import NetworkRecord, isolation_unavailable, read_record
from tests.e2e.conftest import LocalDefault
from tests.e2e.test_pod_runner import container, create_pod, get_pod, wait_terminal
from tests.support.polling import eventually
from tests.support.processes import processes_with


def _running(env: LocalDefault, name: str) -> bool:
    pod = get_pod(env, name) or {}
    return (pod.get("status") or {}).get("phase") == "Running"


def test_runner_killed_and_restarted_adopts_running_and_reports_finished(
    local_default: LocalDefault,
) -> None:
    env = local_default
    env.create_claim("restart-gate")
    gate = env.claim_dir("restart-gate") / "go"
    gate.unlink(missing_ok=True)
    # Ends with exit 3 and a termination message once the gate file exists (while no runner runs).
    create_pod(
        env,
        "ends-unseen",
        {
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "command": [
                        "sh",
                        "-c",
                        "while [ ! -e /gate/go ]; do sleep 0.2; done; "
                        "echo finished-unseen > /dev/termination-log; exit 3",
                    ],
                    "volumeMounts": [{"name": "gate", "mountPath": "/gate"}],
                }
            ],
            "volumes": [{"name": "gate", "persistentVolumeClaim": {"claimName": "restart-gate"}}],
        },
    )
    create_pod(
        env,
        "keeps-running",
        # `sleep` is PID 1 and ignores SIGTERM: a short grace keeps its deletion quick.
        {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "7711"]}],
        },
    )
    # Its main container starts only once the gate is open, i.e. under the restarted runner, with
    # the pod's IP from the downward API: the address the earlier runner gave the pod (addresses.py).
    create_pod(
        env,
        "starts-later",
        {
            "initContainers": [
                {
                    "name": "wait",
                    "image": "busybox",
                    "command": ["sh", "-c", "while [ ! -e /gate/go ]; do sleep 0.2; done"],
                    "volumeMounts": [{"name": "gate", "mountPath": "/gate"}],
                }
            ],
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "command": ["sh", "-c", "echo $POD_IP > /dev/termination-log"],
                    "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                }
            ],
            "volumes": [{"name": "gate", "persistentVolumeClaim": {"claimName": "restart-gate"}}],
        },
    )
    # A pod with ports has its own network namespace, held by a helper process (network.py).
    create_pod(
        env,
        "serves",
        {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "command": ["sleep", "7712"],
                    "ports": [{"containerPort": 8080}],
                }
            ],
        },
    )
    eventually(
        lambda: all(_running(env, p) for p in ("ends-unseen", "keeps-running", "serves")),
        timeout=120,
        what="the pods",
    )
    pods = ("ends-unseen", "keeps-running", "serves", "starts-later")
    ips = eventually(lambda: _pod_ips(env, pods), timeout=120, what="every pod's IP")
    assert len(set(ips.values())) == len(pods) and "127.0.0.1" not in ips.values(), ips  # its own each
    network = _network_record(env, "serves")
    assert (network is not None) == (isolation_unavailable() is None)  # root with nsenter and ip
    before = container(get_pod(env, "keeps-running") or {}, "main")
    pids = processes_with("sleep", "7711")
    assert len(pids) == 1

    env.runner.kill()
    try:
        assert processes_with("sleep", "7711") == pids  # the container outlived its runner
        gate.write_text("go")
        eventually(
            lambda: list(Path(env.state_dir).glob("pods/e2e/ends-unseen/*/containers/main/0.exit")),
            timeout=120,
            what="the unseen container's shim to record its exit",
        )
    finally:
        env.runner.start()

    ended = wait_terminal(env, "ends-unseen")
    main = container(ended, "main")
    assert ended["status"]["phase"] == "Failed"
    assert main["state"]["terminated"]["exitCode"] == 3
    assert main["state"]["terminated"]["reason"] == "Error"
    assert main["state"]["terminated"]["message"].strip() == "finished-unseen"

    later = wait_terminal(env, "starts-later")
    assert later["status"]["phase"] == "Succeeded", later["status"]
    # started by the new runner, with the address the earlier one gave the pod (its record, not the
    # API's status, which a runner writing no podIP would leave as it was)
    assert container(later, "main")["state"]["terminated"]["message"].strip() == ips["starts-later"]
    assert _pod_ips(env, pods) == ips

    after = container(get_pod(env, "keeps-running") or {}, "main")
    assert "running" in after["state"], after
    assert after["containerID"] == before["containerID"] and after["restartCount"] == 0
    assert processes_with("sleep", "7711") == pids  # adopted, not started again
    assert "adopted main (running)" in env.runner.logs()
    if network is not None:  # isolation available here: the same helper still holds the namespace
        assert _network_record(env, "serves") == network and network.alive()
        assert "running" in container(get_pod(env, "serves") or {}, "main")["state"]

    env.plane.kubectl("delete", "pod", *pods, "-n", "e2e", "--wait=true", "--timeout=90s")
    eventually(
        lambda: not processes_with("sleep", "7711"), timeout=120, what="the adopted container to be stopped"
    )
    assert not processes_with("sleep", "7712")
    if network is not None:
        eventually(lambda: not network.alive(), timeout=120, what="the adopted network helper to be stopped")


def _pod_ips(env: LocalDefault, pods: tuple[str, ...]) -> dict[str, str] | None:
    """Each pod's `status.podIP`, once every one has one."""
    ips = {pod: ((get_pod(env, pod) or {}).get("status") or {}).get("podIP") for pod in pods}
    return {pod: ip for pod, ip in ips.items() if ip} if all(ips.values()) else None


def _network_record(env: LocalDefault, pod: str) -> NetworkRecord | None:
    found = list(env.state_dir.glob(f"pods/e2e/{pod}/*"))
    return read_record(found[0]) if found else None


def test_a_container_started_just_before_the_runner_died_is_adopted_not_started_again(
    local_default: LocalDefault,
) -> None:
    """The runner killed between starting a container and writing its launch record (the chaos
    suite met it: an iteration ran twice): the next runner finds the container by its shim."""
    env = local_default
    create_pod(
        env,
        "unrecorded",
        # `sleep` is PID 1 and ignores SIGTERM: a short grace keeps its deletion quick.
        {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "7713"]}],
        },
    )
    eventually(lambda: _running(env, "unrecorded"), timeout=120, what="the pod")
    # Running is reported once the container is launched; its `sleep` execs a moment later.
    pids = eventually(
        lambda: processes_with("sleep", "7713") or None, timeout=60, what="the container's sleep"
    )
    assert len(pids) == 1
    env.runner.kill()
    try:
        records = list(Path(env.state_dir).glob("pods/e2e/unrecorded/*/containers/main/launch.json"))
        assert len(records) == 1
        records[0].unlink()  # as if the runner had died before writing it
    finally:
        env.runner.start()
    eventually(
        lambda: "unrecorded: adopted main (running)" in env.runner.logs(), timeout=120, what="the adoption"
    )
    main = container(get_pod(env, "unrecorded") or {}, "main")
    assert "running" in main["state"] and main["restartCount"] == 0, main
    assert processes_with("sleep", "7713") == pids, "adopted, not started a second time"
    env.plane.kubectl("delete", "pod", "unrecorded", "-n", "e2e", "--wait=true", "--timeout=90s")
    eventually(lambda: not processes_with("sleep", "7713"), timeout=120, what="the container to stop")
