"""The local pod runner's status building (phase, conditions, container states) and bwrap argv."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agentrun_devcluster.podrunner.sandbox import Bind, HostEntry, bwrap_argv
from agentrun_devcluster.podrunner.status import (
    ContainerRecord,
    PodVerdict,
    PodView,
    State,
    build_status,
    initial_records,
    pod_phase,
)
from agentrun_operator.shell.observe import pod_from_k8s

SPEC = {
    "restartPolicy": "Never",
    "initContainers": [
        {"name": "reporter", "image": "op", "restartPolicy": "Always"},
        {"name": "fingerprint", "image": "op"},
    ],
    "containers": [{"name": "main", "image": "busybox"}],
}
T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:00:05Z"
RUNNING = State("running", started_at=T0)


def done(code: int, message: str | None = None) -> State:
    return State(
        "terminated",
        reason="Completed" if code == 0 else "Error",
        exit_code=code,
        message=message,
        started_at=T0,
        finished_at=T1,
    )


def records(**states: State) -> list[ContainerRecord]:
    base = initial_records(SPEC)
    return [replace(r, state=states.get(r.name, r.state)) for r in base.values()]


def test_initial_records_wait_in_start_order() -> None:
    recs = initial_records(SPEC)
    assert [(r.name, r.kind, r.state.reason) for r in recs.values()] == [
        ("reporter", "sidecar", "PodInitializing"),
        ("fingerprint", "init", "PodInitializing"),
        ("main", "main", "PodInitializing"),
    ]
    assert pod_phase(list(recs.values()), "Never") == "Pending"


def test_phase_through_a_pod_life() -> None:
    assert pod_phase(records(reporter=RUNNING), "Never") == "Pending"
    assert pod_phase(records(reporter=RUNNING, fingerprint=RUNNING), "Never") == "Pending"
    assert pod_phase(records(reporter=RUNNING, fingerprint=done(0)), "Never") == "Pending"
    assert pod_phase(records(reporter=RUNNING, fingerprint=done(0), main=RUNNING), "Never") == "Running"
    # main ended, the sidecar still runs: never terminal while a container runs
    assert pod_phase(records(reporter=RUNNING, fingerprint=done(0), main=done(0)), "Never") == "Running"
    assert pod_phase(records(reporter=done(0), fingerprint=done(0), main=done(0)), "Never") == "Succeeded"
    assert pod_phase(records(reporter=done(0), fingerprint=done(0), main=done(2)), "Never") == "Failed"
    # sidecar exit codes do not decide the phase
    assert pod_phase(records(reporter=done(143), fingerprint=done(0), main=done(0)), "Never") == "Succeeded"


def test_failed_init_container_fails_the_pod_under_never() -> None:
    assert pod_phase(records(reporter=RUNNING, fingerprint=done(1)), "Never") == "Running"
    assert pod_phase(records(reporter=done(0), fingerprint=done(1)), "Never") == "Failed"
    assert pod_phase(records(reporter=done(0), fingerprint=done(1)), "OnFailure") == "Pending"


def test_restart_policies_keep_pods_alive() -> None:
    assert pod_phase(records(reporter=done(0), fingerprint=done(0), main=done(0)), "Always") == "Running"
    assert pod_phase(records(reporter=done(0), fingerprint=done(0), main=done(1)), "OnFailure") == "Running"
    assert pod_phase(records(reporter=done(0), fingerprint=done(0), main=done(0)), "OnFailure") == "Succeeded"


def test_status_document_and_what_the_operator_reads_from_it() -> None:
    envelope = '{"v":1,"status":"found","path":"/workspace/c.json","size":2,"reason":null,"control":{}}'
    recs = records(reporter=done(0, envelope), fingerprint=done(0), main=done(3, "bye"))
    status = build_status(recs, PodView("Never", start_time=T0), now=T1)
    assert status["phase"] == "Failed"
    assert status["startTime"] == T0
    assert [c["name"] for c in status["initContainerStatuses"]] == ["reporter", "fingerprint"]
    main = status["containerStatuses"][0]
    assert main["state"]["terminated"]["exitCode"] == 3
    assert main["state"]["terminated"]["message"] == "bye"
    assert main["ready"] is False and main["started"] is False
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Ready"]["status"] == "False" and conds["Ready"]["reason"] == "PodCompleted"
    assert conds["Initialized"]["status"] == "True"
    pod = {
        "metadata": {"name": "p", "labels": {"job-name": "j"}},
        "status": status,
    }
    observed = pod_from_k8s(pod)
    assert observed is not None
    assert observed.reporter_message == envelope
    assert observed.main_exit_code == 3 and observed.phase == "Failed"


def test_running_status_is_ready_and_conditions_keep_their_transition_time() -> None:
    recs = records(reporter=RUNNING, fingerprint=done(0), main=RUNNING)
    first = build_status(recs, PodView("Never", start_time=T0), now=T0)
    assert first["phase"] == "Running"
    assert {c["type"]: c["status"] for c in first["conditions"]} == {
        "PodReadyToStartContainers": "True",
        "Initialized": "True",
        "ContainersReady": "True",
        "Ready": "True",
    }
    sidecar = first["initContainerStatuses"][0]
    assert sidecar["ready"] is True and sidecar["started"] is True
    again = build_status(
        recs, PodView("Never", start_time=T0, previous_conditions=first["conditions"]), now=T1
    )
    assert all(c["lastTransitionTime"] == T0 for c in again["conditions"])


def test_pending_conditions_name_the_containers() -> None:
    status = build_status(records(reporter=RUNNING), PodView("Never"), now=T0)
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Initialized"]["message"] == "containers with incomplete status: [fingerprint]"
    assert conds["Ready"]["message"] == "containers with unready status: [main]"


def test_the_pods_own_address_is_its_ip_and_the_hosts_stays_the_host_ip() -> None:
    status = build_status(records(reporter=RUNNING), PodView("Never", pod_ip="127.64.3.4"), now=T0)
    assert (status["podIP"], status["podIPs"]) == ("127.64.3.4", [{"ip": "127.64.3.4"}])
    assert (status["hostIP"], status["hostIPs"]) == ("127.0.0.1", [{"ip": "127.0.0.1"}])
    # Not known (a pod of an older runner, or one whose state is gone): the status keeps its own.
    unknown = build_status(records(reporter=RUNNING), PodView("Never"), now=T0)
    assert "podIP" not in unknown and "podIPs" not in unknown and unknown["hostIP"] == "127.0.0.1"


def test_a_verdict_overrides_the_phase() -> None:
    verdict = PodVerdict("Failed", "DeadlineExceeded", "Pod was active on the node longer than 5s")
    status = build_status(records(), PodView("Never", verdict=verdict), now=T0)
    assert status["phase"] == "Failed"
    assert status["reason"] == "DeadlineExceeded"
    assert "longer" in status["message"]


def test_waiting_state_carries_reason_and_message() -> None:
    rec = ContainerRecord("main", "img", "main", State("waiting", "CreateContainerConfigError", 'secret "x"'))
    assert rec.to_status()["state"] == {
        "waiting": {"reason": "CreateContainerConfigError", "message": 'secret "x"'}
    }
    assert rec.to_status()["lastState"] == {}


# ----------------------------------------------------------------------------------- bwrap argv


def test_bwrap_makes_the_command_pid_1_on_request() -> None:
    """A container of a pod without `shareProcessNamespace`: the command is PID 1 (no bwrap init)."""
    argv = bwrap_argv("/usr/bin/bwrap", ["sleep", "9"], [], "/t", [], [], "/", command_is_pid_1=True)
    assert "--as-pid-1" in argv and "--unshare-pid" in argv
    assert argv.index("--as-pid-1") < argv.index("--")


def test_bwrap_argv_layout() -> None:
    entries = [
        HostEntry("bin", "symlink", "usr/bin"),
        HostEntry("etc", "dir"),
        HostEntry("proc", "dir"),
        HostEntry("tmp", "dir"),
        HostEntry("usr", "dir"),
        HostEntry("workspace", "dir"),  # a volume replaces a host entry of the same name
    ]
    run_entries = [HostEntry("lock", "dir"), HostEntry("shm", "symlink", "/dev/shm")]
    argv = bwrap_argv(
        "/usr/bin/bwrap",
        ["sh", "-c", "echo hi"],
        entries,
        "/state/pod/tmp",
        [Bind("/state/pvc/ns/ws/sub", "/workspace/sub"), Bind("/state/pvc/ns/ws", "/workspace", True)],
        [Bind("/state/pod/containers/main/termination-log", "/dev/termination-log")],
        "/workspace",
        status_fd=7,
        hostname="pod-a",
        expand=[("/run", run_entries)],
    )
    text = " ".join(argv)
    assert argv[:3] == ["/usr/bin/bwrap", "--tmpfs", "/"]
    assert "--symlink usr/bin /bin" in text
    assert "--ro-bind /etc /etc" in text and "--ro-bind /usr /usr" in text
    assert "/proc /proc" not in text.replace("--proc /proc", "")
    assert "--ro-bind /workspace /workspace" not in text
    # parents before children, so nested mounts work
    assert text.index("--ro-bind /state/pvc/ns/ws /workspace") < text.index("/workspace/sub")
    assert text.index("--dev /dev") < text.index("/dev/termination-log")
    assert text.index("/dev/termination-log") < text.index("--remount-ro /")
    assert "--bind /state/pod/tmp /tmp" in text
    assert "--unshare-pid" in argv and "--die-with-parent" in argv
    assert "--as-pid-1" not in argv
    assert "--chdir /workspace" in text and "--json-status-fd 7" in text and "--hostname pod-a" in text
    assert argv[-4:] == ["--", "sh", "-c", "echo hi"]
    # a re-created host directory: a tmpfs with the host's entries, read-only again at the end
    assert "--tmpfs /run --ro-bind /run/lock /run/lock --symlink /dev/shm /run/shm" in text
    assert text.index("--tmpfs /run") < text.index("--bind /state/pvc")
    assert text.index("--remount-ro /run") < text.index("--remount-ro / ")


def test_host_tools_under_tmp_are_shown_again_after_the_pods_tmp() -> None:
    """A venv or source tree under the host's /tmp (a CI clone) stays visible, read-only, in pods."""
    argv = bwrap_argv(
        "/usr/bin/bwrap",
        ["agentrun", "reporter"],
        [HostEntry("usr", "dir")],
        "/state/pod/tmp",
        [],
        [],
        "/",
        tool_paths=["/tmp/ci/.venv", "/tmp/ci/operator", "/work/main/.venv"],
    )
    text = " ".join(argv)
    assert text.index("--bind /state/pod/tmp /tmp") < text.index("--ro-bind /tmp/ci/.venv /tmp/ci/.venv")
    assert "--ro-bind /tmp/ci/operator /tmp/ci/operator" in text
    assert "/work/main/.venv" not in text  # not hidden, so not bound again


def test_host_tools_under_tmp_stay_visible_under_a_volume_mounted_at_tmp() -> None:
    """The chart's operator pod mounts an emptyDir at /tmp; a checkout (and its venv with `agentrun`)
    under the host's /tmp must still be there, read-only, on top of that volume."""
    venv = "/tmp/ci-clone/.venv"
    argv = bwrap_argv(
        "/usr/bin/bwrap",
        ["agentrun", "operator"],
        [HostEntry("usr", "dir")],
        "/state/pod/tmp",
        [Bind("/state/pod/volumes/tmp", "/tmp")],
        [],
        "/",
        tool_paths=[venv, "/usr/lib/python3"],
    )
    binds = [tuple(argv[i : i + 3]) for i, arg in enumerate(argv) if arg in ("--bind", "--ro-bind")]
    volume = binds.index(("--bind", "/state/pod/volumes/tmp", "/tmp"))
    assert ("--ro-bind", venv, venv) in binds[volume + 1 :], "the venv must be bound after the /tmp volume"
    assert ("--ro-bind", "/usr/lib/python3", "/usr/lib/python3") not in binds  # not under /tmp: never hidden
    # Without a volume over it, the venv is bound once, right after the pod's own /tmp.
    plain = bwrap_argv("/usr/bin/bwrap", ["x"], [], "/state/pod/tmp", [], [], "/", tool_paths=[venv])
    assert " ".join(plain).count(f"--ro-bind {venv} {venv}") == 1


def test_a_pods_termination_messages_share_the_kubelets_12_kib_budget() -> None:
    """The kubelet's status manager gives each container 12 KiB / containers and keeps the first
    bytes of a longer message: an iteration pod of 3 containers keeps 4096 bytes each, 4 would
    keep 3072."""
    from agentrun_devcluster.podrunner.status import within_pod_budget

    def status(message: str) -> dict[str, Any]:
        return {"name": "c", "state": {"terminated": {"exitCode": 0, "message": message}}}

    assert within_pod_budget(status("m" * 4096), 3)["state"]["terminated"]["message"] == "m" * 4096
    cut = within_pod_budget(status("a" * 3000 + "b" * 1096), 4)["state"]["terminated"]["message"]
    assert cut == "a" * 3000 + "b" * 72
    running = {"name": "c", "state": {"running": {"startedAt": "t"}}}
    assert within_pod_budget(running, 5) == running
