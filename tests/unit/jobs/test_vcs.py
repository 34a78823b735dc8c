"""VersionControlProvider resolution and the credentials each vcsPolicy.mode gives the pods."""

from __future__ import annotations

from typing import Any

from agentrun_operator.jobs.vcs import clone_url, matches, resolve_vcs

META = {"name": "fix-1", "namespace": "team"}
PARAMS = {"repository": "acme/app", "base": "main", "head": "agent/fix-1"}
GITHUB: dict[str, Any] = {
    "provider": "github",
    "auth": {"method": "token", "token": {"secretRef": {"name": "gh-token", "key": "token"}}},
    "defaults": {"commitAuthorName": "Agent", "commitAuthorEmail": "agent@example.com"},
}
SSH: dict[str, Any] = {
    "provider": "gitea",
    "cloneProtocol": "ssh",
    "sshHost": "git.local",
    "auth": {
        "method": "ssh",
        "ssh": {"privateKeySecretRef": {"name": "deploy-key"}, "knownHostsConfigMapRef": {"name": "hosts"}},
    },
}
SECRETS = {"gh-token": frozenset({"token"}), "deploy-key": frozenset({"privateKey"})}


def resolve(run_spec: dict[str, Any], providers: dict[str, Any] | None = None, **kw: Any):  # type: ignore[no-untyped-def]
    return resolve_vcs(
        run_spec,
        META,
        kw.get("implementation", {}),
        kw.get("agent"),
        kw.get("parameters", PARAMS),
        providers if providers is not None else {"gh": GITHUB, "ssh": SSH},
        kw.get("secrets", SECRETS),
    )


def env(resolution) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in resolution.env}


def test_the_provider_is_the_runs_then_the_implementations_then_the_agents() -> None:
    agent = {"vcsRef": {"name": "ssh"}}
    impl = {"vcsRef": {"name": "gh"}}
    assert resolve({"vcsRef": {"name": "gh"}}, agent=agent).status["provider"] == "gh"
    assert resolve({}, implementation=impl, agent=agent).status["provider"] == "gh"
    assert resolve({}, agent=agent).status["provider"] == "ssh"
    assert resolve({}).status is None and not resolve({}).env


def test_read_write_token_gives_the_token_and_the_coordinates() -> None:
    r = resolve({"vcsRef": {"name": "gh"}, "vcsPolicy": {"required": True, "mode": "read-write"}})
    assert not r.problems
    e = env(r)
    assert e["VCS_TOKEN"] == {"secretKeyRef": {"name": "gh-token", "key": "token"}}
    assert e["GITHUB_TOKEN"] == e["GH_TOKEN"] == e["VCS_TOKEN"]
    assert e["VCS_REPOSITORY"] == "acme/app"
    assert e["VCS_CLONE_URL"] == "https://github.com/acme/app"
    assert (e["VCS_BASE_BRANCH"], e["VCS_HEAD_BRANCH"]) == ("main", "agent/fix-1")
    assert (e["GIT_AUTHOR_NAME"], e["GIT_COMMITTER_EMAIL"]) == ("Agent", "agent@example.com")
    assert (e["VCS_MODE"], e["VCS_WRITE_ENABLED"], e["VCS_USERNAME"]) == (
        "read-write",
        "true",
        "x-access-token",
    )
    assert r.status == {
        "provider": "gh",
        "repository": "acme/app",
        "baseBranch": "main",
        "headBranch": "agent/fix-1",
        "mode": "read-write",
    }
    assert r.secret_refs == (("gh-token", "token"),)


def test_read_only_gives_no_credential_and_none_gives_nothing() -> None:
    r = resolve({"vcsRef": {"name": "gh"}, "vcsPolicy": {"mode": "read-only"}}, secrets={})
    e = env(r)
    assert not r.problems and "VCS_TOKEN" not in e and "GITHUB_TOKEN" not in e and "VCS_USERNAME" not in e
    assert (e["VCS_MODE"], e["VCS_WRITE_ENABLED"]) == ("read-only", "false")
    ssh = resolve({"vcsRef": {"name": "ssh"}, "vcsPolicy": {"mode": "read-only"}})
    assert not ssh.volumes and "GIT_SSH_COMMAND" not in env(ssh)
    none = resolve({"vcsRef": {"name": "gh"}, "vcsPolicy": {"mode": "none", "required": True}})
    assert not none.problems and not none.env and not none.volumes
    assert none.status == {"provider": "gh", "repository": "acme/app", "mode": "none"}


def test_ssh_read_write_mounts_the_key_and_known_hosts() -> None:
    r = resolve({"vcsRef": {"name": "ssh"}})
    assert not r.problems
    e = env(r)
    assert e["VCS_CLONE_URL"] == "git@git.local:acme/app"
    assert e["VCS_SSH_KEY_PATH"] == "/var/run/secrets/agents/vcs/ssh/privateKey"
    assert e["GIT_SSH_COMMAND"].startswith("ssh -i /var/run/secrets/agents/vcs/ssh/privateKey")
    assert "UserKnownHostsFile=/var/run/secrets/agents/vcs/known-hosts/known_hosts" in e["GIT_SSH_COMMAND"]
    assert [v["name"] for v in r.volumes] == ["agentrun-vcs-ssh", "agentrun-vcs-known-hosts"]
    assert r.volumes[0]["secret"]["secretName"] == "deploy-key"
    assert all(m["readOnly"] for m in r.mounts)


def test_auth_none_writes_without_a_credential() -> None:
    local = {"provider": "generic", "cloneBaseUrl": "/srv/git", "auth": {"method": "none"}}
    r = resolve({"vcsRef": {"name": "local"}}, {"local": local}, secrets={})
    e = env(r)
    assert not r.problems and e["VCS_CLONE_URL"] == "/srv/git/acme/app" and e["VCS_WRITE_ENABLED"] == "true"
    assert not any(k in e for k in ("VCS_TOKEN", "VCS_SSH_KEY_PATH"))


def test_app_auth_is_refused_for_read_write_with_a_reason() -> None:
    app = {"provider": "github", "auth": {"method": "app", "app": {"appId": 1, "installationId": 2}}}
    (problem,) = resolve({"vcsRef": {"name": "app"}}, {"app": app}).problems
    assert "app" in problem.message and "does not implement" in problem.message
    assert problem.path == "spec.vcsPolicy.mode" and "read-only" in problem.fix
    assert not resolve({"vcsRef": {"name": "app"}, "vcsPolicy": {"mode": "read-only"}}, {"app": app}).problems


def test_a_missing_credential_secret_or_key_is_invalid_for_read_write() -> None:
    (missing,) = resolve({"vcsRef": {"name": "gh"}}, secrets={}).problems
    assert missing.missing == "Secret/gh-token" and "gh-token" in missing.message
    (no_key,) = resolve({"vcsRef": {"name": "gh"}}, secrets={"gh-token": frozenset({"other"})}).problems
    assert "no key 'token'" in no_key.message and no_key.missing is None
    assert not resolve({"vcsRef": {"name": "gh"}}, secrets=None).problems  # offline: not checked


def test_the_credential_secret_must_be_allowed_by_the_agent() -> None:
    agent = {"security": {"allowedSecrets": ["other"]}}
    (problem,) = resolve({"vcsRef": {"name": "gh"}}, agent=agent).problems
    assert "allowedSecrets" in problem.message and "gh-token" in problem.message


def test_repository_policy_deny_and_allow() -> None:
    policy = {**GITHUB, "repositoryPolicy": {"allow": ["acme/*"], "deny": ["acme/secret-*"]}}
    ok = resolve({"vcsRef": {"name": "p"}}, {"p": policy})
    assert not ok.problems
    (denied,) = resolve(
        {"vcsRef": {"name": "p"}}, {"p": policy}, parameters={"repository": "acme/secret-x"}
    ).problems
    assert denied.path == "spec.parameters.repository" and "denied" in denied.message
    (outside,) = resolve(
        {"vcsRef": {"name": "p"}}, {"p": policy}, parameters={"repository": "evil/app"}
    ).problems
    assert "not in the allow list" in outside.message
    none = resolve(
        {"vcsRef": {"name": "p"}, "vcsPolicy": {"mode": "none"}},
        {"p": policy},
        parameters={"repository": "evil/app"},
    )
    assert not none.problems


def test_required_without_a_usable_provider_is_invalid_and_optional_is_skipped() -> None:
    (none_named,) = resolve({"vcsPolicy": {"required": True}}).problems
    assert none_named.path == "spec.vcsPolicy.required"
    (missing,) = resolve({"vcsRef": {"name": "nope"}, "vcsPolicy": {"required": True}}).problems
    assert missing.missing == "VersionControlProvider/nope"
    skipped = resolve({"vcsRef": {"name": "nope"}})
    assert not skipped.problems and skipped.status is not None and skipped.status["mode"] == "none"
    (no_repo,) = resolve({"vcsRef": {"name": "gh"}, "vcsPolicy": {"required": True}}, parameters={}).problems
    assert no_repo.path == "spec.parameters.repository"


def test_capabilities_lower_the_mode_unless_required() -> None:
    ro = {**GITHUB, "capabilities": {"write": False}}
    r = resolve({"vcsRef": {"name": "ro"}}, {"ro": ro})
    assert env(r)["VCS_MODE"] == "read-only" and "VCS_TOKEN" not in env(r)
    (problem,) = resolve({"vcsRef": {"name": "ro"}, "vcsPolicy": {"required": True}}, {"ro": ro}).problems
    assert "cannot give read-write" in problem.message


def test_head_branch_from_the_template_when_no_head_parameter() -> None:
    templated = {
        **GITHUB,
        "defaults": {"baseBranch": "develop", "branchTemplate": "agents/{{ agentRun.name }}-{{ ticket }}"},
    }
    r = resolve(
        {"vcsRef": {"name": "t"}}, {"t": templated}, parameters={"repository": "acme/app", "ticket": "42"}
    )
    assert (env(r)["VCS_BASE_BRANCH"], env(r)["VCS_HEAD_BRANCH"]) == ("develop", "agents/fix-1-42")


def test_patterns_and_clone_urls() -> None:
    assert matches("acme/app", "acme/*") and matches("acme/a/b", "*") and not matches("acme/app", "acme")
    assert matches("a.b", "a.b") and not matches("axb", "a.b")
    assert clone_url({"provider": "gitlab"}, "g/p") == "https://gitlab.com/g/p"
    assert clone_url({"cloneBaseUrl": "file:///srv/git/"}, "demo.git") == "file:///srv/git/demo.git"
