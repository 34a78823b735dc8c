"""The local pod runner's pure rules: order, `$(VAR)` expansion, environment, volumes, messages."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from agentrun_devcluster.podrunner import spec as S
from agentrun_operator.jobs.reporter_container import (
    FINGERPRINT_CONTAINER,
    MAIN_CONTAINER,
    REPORTER_CONTAINER,
)

POD: dict[str, Any] = {
    "metadata": {
        "name": "run-step-1-iter-2-attempt-1-abcde",
        "namespace": "team",
        "uid": "u-1",
        "labels": {"app": "x", "tier": "y"},
        "annotations": {"note": "hi"},
    },
    "spec": {
        "nodeName": "agentrun-local",
        "restartPolicy": "Never",
        "initContainers": [
            {"name": REPORTER_CONTAINER, "restartPolicy": "Always", "command": ["agentrun"]},
            {"name": FINGERPRINT_CONTAINER, "command": ["agentrun"]},
        ],
        "containers": [{"name": MAIN_CONTAINER, "command": ["sh"]}, {"name": "helper", "command": ["sh"]}],
    },
}


# ----------------------------------------------------------------------------------- order


def test_start_order_is_init_containers_in_order_then_mains() -> None:
    steps = S.start_order(POD["spec"])
    assert [(s.name, s.kind) for s in steps] == [
        (REPORTER_CONTAINER, "sidecar"),
        (FINGERPRINT_CONTAINER, "init"),
        (MAIN_CONTAINER, "main"),
        ("helper", "main"),
    ]


def test_sidecars_stop_in_reverse_start_order() -> None:
    spec = {
        "initContainers": [
            {"name": "a", "restartPolicy": "Always"},
            {"name": "setup"},
            {"name": "b", "restartPolicy": "Always"},
        ],
        "containers": [{"name": "main"}],
    }
    assert S.sidecar_stop_order(spec) == ["b", "a"]
    assert S.sidecar_stop_order({"containers": [{"name": "main"}]}) == []


@pytest.mark.parametrize(
    ("policy", "kind", "code", "restart"),
    [
        ("Never", "main", 1, False),
        ("Never", "main", 0, False),
        ("Never", "init", 1, False),
        ("Never", "sidecar", 0, True),
        ("OnFailure", "main", 1, True),
        ("OnFailure", "main", 0, False),
        ("OnFailure", "init", 2, True),
        ("Always", "main", 0, True),
        ("Always", "init", 0, False),
    ],
)
def test_restart_decisions_follow_the_kubelet(policy: str, kind: str, code: int, restart: bool) -> None:
    assert S.should_restart(policy, kind, code) is restart


def test_restart_backoff_doubles_and_is_capped() -> None:
    assert [S.restart_backoff(n) for n in (1, 2, 3, 4)] == [10.0, 20.0, 40.0, 80.0]
    assert S.restart_backoff(30) == 300.0
    assert S.restart_backoff(2, base=1.0, cap=5.0) == 2.0


# ----------------------------------------------------------------------------------- expansion


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)", "alpha"),
        ("x-$(A)-$(B)-y", "x-alpha-beta-y"),
        ("$(MISSING)", "$(MISSING)"),
        ("$$(A)", "$(A)"),
        ("$$", "$"),
        ("$$$(A)", "$alpha"),
        ("cost: $5", "cost: $5"),
        ("$(A", "$(A"),
        ("trailing $", "trailing $"),
        ("$(wc -c < f)", "$(wc -c < f)"),
        ("$((N - 1))", "$((N - 1))"),
        ("no vars", "no vars"),
        ("", ""),
    ],
)
def test_expand_follows_kubernetes(text: str, expected: str) -> None:
    assert S.expand(text, {"A": "alpha", "B": "beta", "N": "3"}) == expected


def test_env_is_expanded_over_earlier_variables_only() -> None:
    container = {
        "name": "main",
        "env": [
            {"name": "LATER_REF", "value": "$(B)"},
            {"name": "A", "value": "one"},
            {"name": "B", "value": "$(A)-two"},
            {"name": "ESCAPED", "value": "$$(A)"},
            {"name": "FROM_BASE", "value": "$(HOME)/x"},
        ],
    }
    env = S.resolve_env(POD, container, S.Lookups(), {"HOME": "/tmp", "PATH": "/bin"})
    assert env["LATER_REF"] == "$(B)"
    assert env["B"] == "one-two"
    assert env["ESCAPED"] == "$(A)"
    assert env["FROM_BASE"] == "/tmp/x"
    assert env["PATH"] == "/bin"


def test_field_refs() -> None:
    container = {
        "name": "main",
        "env": [
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
            {"name": "WHO", "value": "$(POD).$(NS)"},
        ],
    }
    env = S.resolve_env(POD, container, S.Lookups(), {})
    assert env["POD"] == POD["metadata"]["name"]
    assert env["NS"] == "team"
    assert env["UID"] == "u-1"
    assert env["NODE"] == "agentrun-local"
    assert env["APP"] == "x"
    assert env["IP"] == "127.0.0.1"
    assert env["SA"] == "default"
    assert env["WHO"] == f"{POD['metadata']['name']}.team"
    assert S.field_value(POD, "metadata.labels") == 'app="x"\ntier="y"'
    mine = S.resolve_env(POD, container, S.Lookups(), {}, pod_ip="127.64.0.9")
    assert mine["IP"] == "127.64.0.9"  # the pod's own address (addresses.py)
    assert S.field_value(POD, "status.hostIP", pod_ip="127.64.0.9") == "127.0.0.1"
    assert not S.uses_host_network(POD) and S.uses_host_network({"spec": {"hostNetwork": True}})


def test_unsupported_field_ref_is_a_config_error() -> None:
    container = {"name": "m", "env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.bogus"}}}]}
    with pytest.raises(S.ContainerConfigError, match=r"spec\.bogus"):
        S.resolve_env(POD, container, S.Lookups(), {})


def test_secret_and_config_map_refs() -> None:
    secrets = {("team", "creds"): {"token": b"s3cret"}}
    maps = {("team", "settings"): {"level": "debug", "bad key": "x"}}
    lookups = S.Lookups(
        secret=lambda ns, name: secrets.get((ns, name)),
        config_map=lambda ns, name: maps.get((ns, name)),
    )
    container = {
        "name": "m",
        "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
        "env": [
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
            {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "level"}}},
            {
                "name": "OPTIONAL",
                "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k", "optional": True}},
            },
        ],
    }
    env = S.resolve_env(POD, container, lookups, {})
    assert env["TOKEN"] == "s3cret"
    assert env["LEVEL"] == "debug"
    assert env["CFG_level"] == "debug"
    assert "CFG_bad key" not in env
    assert "OPTIONAL" not in env
    missing = {
        "name": "m",
        "env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k"}}}],
    }
    with pytest.raises(S.ContainerConfigError, match='secret "nope" not found'):
        S.resolve_env(POD, missing, lookups, {})
    no_key = {
        "name": "m",
        "env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "k"}}}],
    }
    with pytest.raises(S.ContainerConfigError, match="couldn't find key k"):
        S.resolve_env(POD, no_key, lookups, {})


def test_secret_data_decodes_data_and_string_data() -> None:
    secret = {"data": {"a": base64.b64encode(b"\x00bin").decode()}, "stringData": {"b": "text"}}
    assert S.secret_data(secret) == {"a": b"\x00bin", "b": b"text"}


def test_argv_is_command_then_args_expanded() -> None:
    container = {"name": "m", "command": ["sh", "-c"], "args": ["echo $(GREETING) $$(GREETING)", "$(NONE)"]}
    assert S.container_argv(container, {"GREETING": "hi"}) == ["sh", "-c", "echo hi $(GREETING)", "$(NONE)"]


def test_no_command_cannot_start() -> None:
    with pytest.raises(S.StartError, match="does not pull images") as info:
        S.container_argv({"name": "m", "image": "busybox", "args": ["x"]}, {})
    assert info.value.exit_code == 128


def test_find_executable_searches_path_like_execvp() -> None:
    present = {"/usr/bin/sh", "/venv/bin/agentrun"}
    assert S.find_executable("agentrun", "/venv/bin:/usr/bin", present.__contains__) == "/venv/bin/agentrun"
    assert S.find_executable("sh", "/venv/bin:/usr/bin", present.__contains__) == "/usr/bin/sh"
    assert S.find_executable("nope", "/venv/bin:/usr/bin", present.__contains__) is None
    assert S.find_executable("/usr/bin/sh", "", present.__contains__) == "/usr/bin/sh"
    assert S.find_executable("/bin/nope", "/usr/bin", present.__contains__) is None


# ----------------------------------------------------------------------------------- volumes


def test_plan_volumes_accepts_the_supported_types() -> None:
    volumes = S.plan_volumes(
        {
            "volumes": [
                {"name": "ws", "persistentVolumeClaim": {"claimName": "codex-workspace"}},
                {"name": "scratch", "emptyDir": {}},
                {"name": "creds", "secret": {"secretName": "creds"}},
            ]
        }
    )
    assert {n: v.kind for n, v in volumes.items()} == {
        "ws": "persistentVolumeClaim",
        "scratch": "emptyDir",
        "creds": "secret",
    }
    assert volumes["ws"].claim == "codex-workspace"


def test_unknown_volume_type_is_a_pod_problem() -> None:
    with pytest.raises(S.PodProblem) as info:
        S.plan_volumes({"volumes": [{"name": "host", "hostPath": {"path": "/etc"}}]})
    assert info.value.reason == "UnsupportedVolume"
    assert "hostPath" in info.value.message and "persistentVolumeClaim" in info.value.message


@pytest.mark.parametrize(
    "claim", ["../../etc", "a/b", "UPPER", "-lead", "a..b", ".", "", "x" * 254, "sp ace"]
)
def test_unsafe_claim_names_are_refused(claim: str) -> None:
    assert S.claim_name_problem(claim) is not None
    with pytest.raises(S.PodProblem) as info:
        S.plan_volumes({"volumes": [{"name": "ws", "persistentVolumeClaim": {"claimName": claim}}]})
    assert info.value.reason == "InvalidClaimName"


@pytest.mark.parametrize("claim", ["ws", "codex-workspace", "a.b-c", "x" * 253, "0"])
def test_safe_claim_names_are_accepted(claim: str) -> None:
    assert S.claim_name_problem(claim) is None


def test_mount_targets() -> None:
    assert S.mount_target_problem("/workspace") is None
    assert S.mount_target_problem("/var/run/secrets/kubernetes.io/serviceaccount") is None
    assert "absolute" in (S.mount_target_problem("relative") or "")
    assert "absolute" in (S.mount_target_problem("/a/../etc") or "")
    assert S.mount_target_problem("/") == "cannot mount over /"
    assert "proc" in (S.mount_target_problem("/proc/x") or "")
    assert "proc" in (S.mount_target_problem("/sys/fs") or "")


HOST = {"/usr", "/usr/share", "/var", "/var/run", "/run", "/etc", "/etc/hosts"}
LINKS = {"/var/run": "/run"}


def resolve(target: str) -> tuple[str, str | None]:
    return S.resolve_on_host(target, HOST.__contains__, lambda p: LINKS.get(p, p))


def test_mount_points_outside_volumes_follow_the_host_tree() -> None:
    assert resolve("/workspace") == ("/workspace", None)  # new top-level name: the tmpfs root
    assert resolve("/workspace/a/b") == ("/workspace/a/b", None)
    assert resolve("/usr/share") == ("/usr/share", None)  # exists: mounted over
    assert resolve("/etc/hosts") == ("/etc/hosts", None)
    assert resolve("/usr/new/deeper") == ("/usr/new/deeper", "/usr")  # /usr is re-created
    assert resolve("/usr/share/new") == ("/usr/share/new", "/usr/share")
    # the service-account path, through Debian's /var/run -> /run symlink
    assert resolve("/var/run/secrets/kubernetes.io/serviceaccount") == (
        "/run/secrets/kubernetes.io/serviceaccount",
        "/run",
    )


# ----------------------------------------------------------------------------------- messages


def test_termination_message_is_the_last_4096_bytes_of_the_file() -> None:
    """As the kubelet reads it (tail.ReadAtMost): a long file keeps its end, not its start."""
    assert S.termination_message(b"a" * 1000 + b"z" * 4096, "File", 0, lambda: b"") == "z" * 4096
    assert S.termination_message(b"head" + b"x" * 4095, "File", 0, lambda: b"") == "d" + "x" * 4095
    assert S.termination_message(b"", "File", 1, lambda: b"log") is None
    assert S.termination_message(None, "File", 0, lambda: b"") is None


def test_fallback_to_logs_on_error_only_when_failed_and_empty() -> None:
    logs = b"".join(f"line {i}\n".encode() for i in range(200))
    text = S.termination_message(b"", "FallbackToLogsOnError", 2, lambda: logs)
    assert text is not None and text.endswith("line 199\n")
    assert text.count("\n") == 80
    assert S.termination_message(b"", "FallbackToLogsOnError", 0, lambda: logs) is None
    assert S.termination_message(b"file", "FallbackToLogsOnError", 2, lambda: logs) == "file"
    huge = b"y" * 10_000
    assert len(S.log_tail(huge)) == S.FALLBACK_LOG_BYTES


def test_grace_seconds() -> None:
    assert S.grace_seconds({"metadata": {"deletionGracePeriodSeconds": 5}}) == 5.0
    assert S.grace_seconds({"spec": {"terminationGracePeriodSeconds": 7}}) == 7.0
    assert S.grace_seconds({}) == 30.0
    assert S.exit_reason(0) == "Completed" and S.exit_reason(143) == "Error"


@pytest.mark.parametrize(
    ("container", "argv"),
    [
        # The chart's operator container: only `args` → the image's ENTRYPOINT + those args.
        (
            {
                "name": "operator",
                "image": "ghcr.io/proompteng/agentrun-operator:0.1.0",
                "args": ["operator", "--peering"],
            },
            ["agentrun", "operator", "--peering"],
        ),
        # Neither command nor args → ENTRYPOINT + CMD; digest and registry port do not matter.
        (
            {"name": "o", "image": "registry.local:5000/x/agentrun-operator@sha256:" + "a" * 64},
            ["agentrun", "operator"],
        ),
        # An empty `args` list is given args: CMD is not used.
        ({"name": "o", "image": "agentrun-operator", "args": []}, ["agentrun"]),
        # A command always wins over the image's config.
        (
            {"name": "o", "image": "agentrun-operator:1", "command": ["sh"], "args": ["-c", "true"]},
            ["sh", "-c", "true"],
        ),
    ],
)
def test_known_images_supply_their_entrypoint(container: dict[str, Any], argv: list[str]) -> None:
    assert S.container_argv(container, {}) == argv


def test_image_repository_name_ignores_registry_tag_and_digest() -> None:
    assert S.image_repository_name("busybox:1.36") == "busybox"
    assert S.image_repository_name("localhost:5000/team/agentrun-operator:0.1.0") == "agentrun-operator"
    assert S.image_repository_name("agentrun-operator@sha256:abc") == "agentrun-operator"


def test_default_env_points_in_cluster_clients_at_the_api_server() -> None:
    env = S.default_env(POD, "/bin", "https://127.0.0.1:36443")
    assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
    assert env["KUBERNETES_SERVICE_PORT"] == "36443"
    assert env["KUBERNETES_PORT"] == "tcp://127.0.0.1:36443"
    assert "KUBERNETES_SERVICE_HOST" not in S.default_env(POD, "/bin")


def test_only_pods_that_serve_ports_get_their_own_network() -> None:
    from agentrun_devcluster.podrunner.network import wants_own_network

    server = {"containers": [{"name": "op", "ports": [{"containerPort": 8080}]}]}
    assert wants_own_network(server)
    assert not wants_own_network({**server, "hostNetwork": True})
    assert not wants_own_network({"containers": [{"name": "main", "command": ["sh"]}]})
    assert wants_own_network(
        {"initContainers": [{"name": "s", "ports": [{"containerPort": 1}]}], "containers": []}
    )


def test_a_post_start_exec_hook_runs_as_the_container_with_the_hook_s_command() -> None:
    """docs/local-dev.md#pod-runner-hooks: the hook keeps the container's image, env and mounts; its
    command is not `$(VAR)`-expanded (the kubelet does not expand a hook's command)."""
    container = {
        "name": "reporter",
        "image": "operator:1",
        "command": ["agentrun", "reporter", "report"],
        "args": ["--path", "/w/c.json"],
        "restartPolicy": "Always",
        "env": [{"name": "A", "value": "1"}],
        "volumeMounts": [{"name": "ws", "mountPath": "/w"}],
        "lifecycle": {"postStart": {"exec": {"command": ["sh", "-c", "echo $(A) $A $$ $$$(A) $"]}}},
    }
    command = S.post_start_command(container)
    assert command == ["sh", "-c", "echo $(A) $A $$ $$$(A) $"]
    hook = S.hook_container(container, command)
    assert hook["image"] == "operator:1" and hook["env"] == container["env"]
    assert hook["volumeMounts"] == container["volumeMounts"]
    assert "lifecycle" not in hook and "restartPolicy" not in hook and "args" not in hook
    # Run as written: the kubelet does not expand a hook's command (the shell's `$$` stays its PID).
    assert S.container_argv(hook, {"A": "1"}) == ["sh", "-c", "echo $(A) $A $$ $$$(A) $"]
    assert S.post_start_command({"name": "x"}) is None
    assert S.post_start_command({"lifecycle": {"postStart": {"httpGet": {"port": 80}}}}) is None
