"""Version control for a run's pods: the VersionControlProvider resolved, checked, and turned into env
and volumes (docs/api.md#version-control). Pure: objects come in as manifest dicts the shell looked up.

The provider is the run's `vcsRef`, else its implementation's, else its Agent's (the original's
order). The repository, base and head branch come from the run's parameters `repository`, `base`
and `head` (the provider's `defaults.baseBranch`, and its rendered `defaults.branchTemplate`, when
they are not set). `vcsPolicy.mode` (default read-write) decides the credentials:

- `read-write`: the provider's credential: a token (`VCS_TOKEN`, and `GITHUB_TOKEN`/`GH_TOKEN` for
  github) from its Secret, or an SSH key mounted from its Secret; `auth.method: none` gives none;
- `read-only`: the repository's coordinates only, no credential at all (`VCS_WRITE_ENABLED=false`);
- `none`: nothing.

What the original skips silently when `vcsPolicy.required` is false (no provider, no repository) is
skipped here too, with a warning in `status.vcs`; what would make the run do something else than it
says (a denied repository, a read-write run whose credential Secret is missing, `app` auth) is a
`Problem` (`InvalidSpec` before any Job).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from agentrun_operator.jobs.template import render
from agentrun_operator.problem import Problem
from agentrun_operator.problem import api as _api

Mode = Literal["read-write", "read-only", "none"]
MODES: Final = ("read-write", "read-only", "none")
SSH_DIR: Final = "/var/run/secrets/agents/vcs/ssh"
KNOWN_HOSTS_DIR: Final = "/var/run/secrets/agents/vcs/known-hosts"
SSH_VOLUME: Final = "agentrun-vcs-ssh"
KNOWN_HOSTS_VOLUME: Final = "agentrun-vcs-known-hosts"
DEFAULT_CHECKOUT: Final = "/workspace/repo"
"""Where the pod is expected to keep its clone unless the run's `checkoutPath` parameter says
otherwise; the reporter records the commit it is at after each iteration."""
CHECKOUT_PARAMETER: Final = "checkoutPath"

_DEFAULT_USERNAMES: Final = {
    "github": "x-access-token",
    "gitlab": "oauth2",
    "bitbucket": "x-token-auth",
    "gitea": "git",
    "generic": "git",
}
_DEFAULT_CLONE_BASES: Final = {"github": "https://github.com", "gitlab": "https://gitlab.com"}
_DOCS: Final = _api("version-control")


def matches(value: str, pattern: str) -> bool:
    """A repositoryPolicy pattern: `*` stands for any run of characters (slashes too); else exact."""
    return re.fullmatch(".*".join(re.escape(part) for part in pattern.split("*")), value) is not None


def _matches_any(value: str, patterns: Iterable[str]) -> bool:
    return any(matches(value, p) for p in patterns)


@dataclass(frozen=True)
class VcsResolution:
    """What version control means for one run (or step): problems, or the pods' env and volumes."""

    problems: tuple[Problem, ...] = ()
    env: tuple[dict[str, Any], ...] = ()
    volumes: tuple[dict[str, Any], ...] = ()
    mounts: tuple[dict[str, Any], ...] = ()
    context: Mapping[str, Any] | None = None
    """`vcs` of the runner contract's template context and of run.json."""
    status: Mapping[str, Any] | None = None
    """`status.vcs` (provider, repository, branches, mode; a warning when version control is off)."""
    checkout: str | None = None
    """Where the pods keep the clone, when version control is on."""
    secret_refs: tuple[tuple[str, str], ...] = field(default=())
    """(Secret, key) the pods read, for `missing` checks."""


def provider_name(
    run_spec: Mapping[str, Any], implementation: Mapping[str, Any], agent_spec: Mapping[str, Any] | None
) -> tuple[str, str] | None:
    """(field path, name) of the VersionControlProvider: the run's, its implementation's, its Agent's."""
    for path, ref in (
        ("spec.vcsRef.name", run_spec.get("vcsRef")),
        ("implementation.vcsRef.name", implementation.get("vcsRef")),
        ("spec.agentRef.name", (agent_spec or {}).get("vcsRef")),
    ):
        if isinstance(ref, Mapping) and ref.get("name"):
            return path, str(ref["name"])
    return None


def referenced_names(
    run_spec: Mapping[str, Any],
    implementations: Iterable[Mapping[str, Any]],
    agent_spec: Mapping[str, Any] | None,
) -> list[str]:
    """Every VersionControlProvider a run may resolve (the shell looks each up), sorted."""
    refs = [run_spec.get("vcsRef"), (agent_spec or {}).get("vcsRef")]
    refs += [impl.get("vcsRef") for impl in implementations]
    return sorted({str(r["name"]) for r in refs if isinstance(r, Mapping) and r.get("name")})


def credential_secret(spec: Mapping[str, Any]) -> str | None:
    """The Secret a provider's token or SSH key is in (the shell checks it before the first Job)."""
    auth = spec.get("auth") or {}
    method = auth_method(auth)
    section = auth.get(method) or {}
    ref = section.get("secretRef") if method == "token" else section.get("privateKeySecretRef")
    if method in ("token", "ssh") and isinstance(ref, Mapping) and ref.get("name"):
        return str(ref["name"])
    return None


def _skip(status: dict[str, Any] | None, warning: str) -> VcsResolution:
    return VcsResolution(status={**(status or {}), "mode": "none", "message": warning})


def _problem(path: str, value: Any, message: str, fix: str, missing: str | None = None) -> VcsResolution:
    return VcsResolution(problems=(Problem(path, value, message, fix, _DOCS, missing=missing),))


def auth_method(auth: Mapping[str, Any]) -> str:
    """`auth.method`, else the method whose secret is named, else none (as the original infers it)."""
    explicit = str(auth.get("method") or "").lower()
    if explicit in ("token", "app", "ssh", "none"):
        return explicit
    for method in ("token", "app", "ssh"):
        section = auth.get(method) or {}
        ref = section.get("secretRef") if method == "token" else section.get("privateKeySecretRef")
        if isinstance(ref, Mapping) and ref.get("name"):
            return method
    return "none"


def clone_url(spec: Mapping[str, Any], repository: str) -> str:
    """`<cloneBaseUrl>/<repository>` (https, the default), or `<sshUser>@<sshHost>:<repository>` (ssh)."""
    kind = str(spec.get("provider") or "generic")
    if spec.get("cloneProtocol") == "ssh" and spec.get("sshHost"):
        return f"{spec.get('sshUser') or 'git'}@{spec['sshHost']}:{repository}"
    base = spec.get("cloneBaseUrl") or spec.get("webBaseUrl") or _DEFAULT_CLONE_BASES.get(kind, "")
    return f"{str(base).rstrip('/')}/{repository}" if base else repository


def resolve_vcs(
    run_spec: Mapping[str, Any],
    run_meta: Mapping[str, Any],
    implementation: Mapping[str, Any],
    agent_spec: Mapping[str, Any] | None,
    parameters: Mapping[str, str],
    providers: Mapping[str, Mapping[str, Any] | None],
    secrets: Mapping[str, frozenset[str] | None] | None,
) -> VcsResolution:
    """Version control for a run. `providers` holds the looked-up VersionControlProvider specs by name
    (None: not found); `secrets` the keys of each looked-up Secret (None: not found; the whole map
    None: not checked, e.g. offline), for the credential checks."""
    policy = run_spec.get("vcsPolicy") or {}
    required = policy.get("required") is True
    mode: str = str(policy.get("mode") or "read-write")
    ref = provider_name(run_spec, implementation, agent_spec)
    if ref is None:
        if required and mode != "none":
            return _problem(
                "spec.vcsPolicy.required",
                True,
                "version control is required but no VersionControlProvider is named (not by the run's "
                "vcsRef, its implementation's vcsRef, nor its Agent's vcsRef)",
                "set spec.vcsRef.name to a VersionControlProvider, or set vcsPolicy.required: false",
            )
        return VcsResolution()
    ref_path, name = ref
    spec = providers.get(name)
    if spec is None:
        if required and mode != "none":
            return _problem(
                ref_path,
                name,
                f"VersionControlProvider {name!r} does not exist in the run's namespace",
                f"create VersionControlProvider {name!r}, or correct the name",
                missing=f"VersionControlProvider/{name}",
            )
        return _skip({"provider": name}, f"VersionControlProvider {name!r} not found; version control is off")
    repository = str(parameters.get("repository") or "")
    if not repository:
        if required and mode != "none":
            return _problem(
                "spec.parameters.repository",
                None,
                "version control is required but the run names no repository",
                "set spec.parameters.repository (e.g. acme/app)",
            )
        return _skip({"provider": name}, "no repository parameter; version control is off")
    status: dict[str, Any] = {"provider": name, "repository": repository}
    rules = spec.get("repositoryPolicy") or {}
    if mode != "none":
        deny = [str(p) for p in rules.get("deny") or ()]
        allow = [str(p) for p in rules.get("allow") or ()]
        if _matches_any(repository, deny) or (allow and not _matches_any(repository, allow)):
            why = "denied by" if _matches_any(repository, deny) else "not in the allow list of"
            return _problem(
                "spec.parameters.repository",
                repository,
                f"repository {repository!r} is {why} the repositoryPolicy of VersionControlProvider {name!r} "
                f"(allow: {allow or 'any'}, deny: {deny or 'none'})",
                "use a repository the policy allows, or set vcsPolicy.mode: none",
            )
    if mode == "none":
        return VcsResolution(status={**status, "mode": "none"})
    return _credentials(
        run_spec, run_meta, spec, name, repository, parameters, mode, required, agent_spec, secrets
    )


def _effective_mode(spec: Mapping[str, Any], mode: str) -> str:
    caps = spec.get("capabilities") or {}
    if mode == "read-write" and caps.get("write") is False:
        mode = "read-only"
    if mode == "read-only" and caps.get("read") is False:
        mode = "none"
    return mode


def _secret_problem(
    path: str, secret: str, key: str, secrets: Mapping[str, frozenset[str] | None] | None, what: str
) -> VcsResolution | None:
    if secrets is None:
        return None
    keys = secrets.get(secret)
    if keys is None:
        return _problem(
            path,
            secret,
            f"Secret {secret!r} with the provider's {what} does not exist in the run's namespace",
            f"create Secret {secret!r} with key {key!r}, or use vcsPolicy.mode: read-only",
            missing=f"Secret/{secret}",
        )
    if key not in keys:
        return _problem(
            path,
            secret,
            f"Secret {secret!r} has no key {key!r} (the provider's {what}; keys: {sorted(keys)})",
            f"add key {key!r} to Secret {secret!r}, or correct the key in the provider",
        )
    return None


def _credentials(
    run_spec: Mapping[str, Any],
    run_meta: Mapping[str, Any],
    spec: Mapping[str, Any],
    name: str,
    repository: str,
    parameters: Mapping[str, str],
    desired: str,
    required: bool,
    agent_spec: Mapping[str, Any] | None,
    secrets: Mapping[str, frozenset[str] | None] | None,
) -> VcsResolution:
    mode = _effective_mode(spec, desired)
    if required and mode != desired:
        return _problem(
            "spec.vcsPolicy.mode",
            desired,
            f"VersionControlProvider {name!r} cannot give {desired} access (its capabilities allow {mode})",
            "lower vcsPolicy.mode, or allow it in the provider's capabilities",
        )
    if mode == "none":
        return VcsResolution(status={"provider": name, "repository": repository, "mode": "none"})
    auth = spec.get("auth") or {}
    method = auth_method(auth)
    vpath = f"VersionControlProvider {name!r} spec.auth"
    if method == "app" and mode == "read-write":
        return _problem(
            "spec.vcsPolicy.mode",
            desired,
            f"{vpath}.method is app (GitHub App installation tokens), which this operator does not "
            "implement: it makes no calls to a forge's API",
            "give the provider a token (auth.method: token with a Secret holding an installation or "
            "fine-grained token) or an SSH key, or use vcsPolicy.mode: read-only",
        )
    kind = str(spec.get("provider") or "generic")
    defaults = spec.get("defaults") or {}
    base = str(parameters.get("base") or defaults.get("baseBranch") or "")
    head = str(parameters.get("head") or "")
    if not head and defaults.get("branchTemplate"):
        branch_context = {
            **parameters,
            "agentRun": {"name": run_meta.get("name", ""), "namespace": run_meta.get("namespace", "")},
            "parameters": dict(parameters),
        }
        head = render(str(defaults["branchTemplate"]), branch_context)
    env: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    refs: list[tuple[str, str]] = []
    allowed = [str(s) for s in ((agent_spec or {}).get("security") or {}).get("allowedSecrets") or ()]
    write = mode == "read-write"
    if write and method in ("token", "ssh"):
        section = auth.get(method) or {}
        secret_ref = (
            section.get("secretRef") if method == "token" else section.get("privateKeySecretRef")
        ) or {}
        secret = str(secret_ref.get("name") or "")
        key = str(secret_ref.get("key") or ("token" if method == "token" else "privateKey"))
        field_name = "token.secretRef" if method == "token" else "ssh.privateKeySecretRef"
        if not secret:
            return _problem(
                "spec.vcsPolicy.mode",
                desired,
                f"{vpath}.{field_name}.name is not set, so there is no credential to write with",
                f"set auth.{field_name}.name in the provider, or use vcsPolicy.mode: read-only",
            )
        if allowed and secret not in allowed:
            return _problem(
                "spec.agentRef.name",
                secret,
                f"the provider's credential Secret {secret!r} is not in the Agent's "
                f"security.allowedSecrets ({allowed})",
                f"add {secret!r} to the Agent's security.allowedSecrets, or use vcsPolicy.mode: read-only",
            )
        problem = _secret_problem("spec.vcsPolicy.mode", secret, key, secrets, "credential")
        if problem is not None:
            return problem
        refs.append((secret, key))
        if method == "token":
            token_ref = {"secretKeyRef": {"name": secret, "key": key}}
            names = ["VCS_TOKEN"] + (["GITHUB_TOKEN", "GH_TOKEN"] if kind == "github" else [])
            env += [{"name": n, "valueFrom": token_ref} for n in names]
        else:
            volumes.append(
                {
                    "name": SSH_VOLUME,
                    "secret": {
                        "secretName": secret,
                        "items": [{"key": key, "path": key}],
                        "defaultMode": 0o400,
                    },
                }
            )
            mounts.append({"name": SSH_VOLUME, "mountPath": SSH_DIR, "readOnly": True})
            key_path = posixpath.join(SSH_DIR, key)
            ssh_command = f"ssh -i {key_path} -o IdentitiesOnly=yes"
            env.append({"name": "VCS_SSH_KEY_PATH", "value": key_path})
            known = section.get("knownHostsConfigMapRef") or {}
            if known.get("name"):
                hosts_key = str(known.get("key") or "known_hosts")
                volumes.append(
                    {
                        "name": KNOWN_HOSTS_VOLUME,
                        "configMap": {
                            "name": known["name"],
                            "items": [{"key": hosts_key, "path": hosts_key}],
                        },
                    }
                )
                mounts.append({"name": KNOWN_HOSTS_VOLUME, "mountPath": KNOWN_HOSTS_DIR, "readOnly": True})
                hosts_path = posixpath.join(KNOWN_HOSTS_DIR, hosts_key)
                env.append({"name": "VCS_SSH_KNOWN_HOSTS_PATH", "value": hosts_path})
                ssh_command += f" -o UserKnownHostsFile={hosts_path}"
            env.append({"name": "GIT_SSH_COMMAND", "value": ssh_command})
    caps = spec.get("capabilities") or {}
    pr = defaults.get("pullRequest") or {}
    pull_requests = write and caps.get("pullRequests") is not False and pr.get("enabled") is not False
    checkout = str(parameters.get(CHECKOUT_PARAMETER) or DEFAULT_CHECKOUT)
    values: list[tuple[str, Any]] = [
        ("VCS_PROVIDER", kind),
        ("VCS_PROVIDER_NAME", name),
        (
            "VCS_API_BASE_URL",
            spec.get("apiBaseUrl") or ("https://api.github.com" if kind == "github" else None),
        ),
        ("VCS_CLONE_BASE_URL", spec.get("cloneBaseUrl")),
        ("VCS_WEB_BASE_URL", spec.get("webBaseUrl")),
        ("VCS_CLONE_PROTOCOL", spec.get("cloneProtocol")),
        ("VCS_SSH_HOST", spec.get("sshHost")),
        ("VCS_SSH_USER", spec.get("sshUser")),
        ("VCS_REPOSITORY", repository),
        ("VCS_CLONE_URL", clone_url(spec, repository)),
        ("VCS_BASE_BRANCH", base),
        ("VCS_HEAD_BRANCH", head),
        ("VCS_CHECKOUT_PATH", checkout),
        ("VCS_COMMIT_AUTHOR_NAME", defaults.get("commitAuthorName")),
        ("VCS_COMMIT_AUTHOR_EMAIL", defaults.get("commitAuthorEmail")),
        ("GIT_AUTHOR_NAME", defaults.get("commitAuthorName")),
        ("GIT_COMMITTER_NAME", defaults.get("commitAuthorName")),
        ("GIT_AUTHOR_EMAIL", defaults.get("commitAuthorEmail")),
        ("GIT_COMMITTER_EMAIL", defaults.get("commitAuthorEmail")),
        ("VCS_BRANCH_TEMPLATE", defaults.get("branchTemplate")),
        ("VCS_PR_TITLE_TEMPLATE", pr.get("titleTemplate")),
        ("VCS_PR_BODY_TEMPLATE", pr.get("bodyTemplate")),
        (
            "VCS_USERNAME",
            (auth.get("username") or _DEFAULT_USERNAMES.get(kind)) if write and method == "token" else None,
        ),
        ("VCS_MODE", mode),
        ("VCS_WRITE_ENABLED", "true" if write else "false"),
        ("VCS_PULL_REQUESTS_ENABLED", "true" if pull_requests else "false"),
        ("VCS_PR_DRAFT", "true" if pr.get("draft") is True else "false"),
    ]
    plain = [{"name": k, "value": str(v)} for k, v in values if v]
    context: dict[str, Any] = {
        "provider": kind,
        "providerName": name,
        "repository": repository,
        "cloneUrl": clone_url(spec, repository),
        "baseBranch": base,
        "headBranch": head,
        "mode": mode,
        "writeEnabled": write,
        "pullRequestsEnabled": pull_requests,
        "authMethod": method,
        "checkoutPath": checkout,
        "commitAuthorName": defaults.get("commitAuthorName"),
        "commitAuthorEmail": defaults.get("commitAuthorEmail"),
    }
    status = {
        "provider": name,
        "repository": repository,
        "baseBranch": base,
        "headBranch": head,
        "mode": mode,
    }
    return VcsResolution(
        env=tuple(plain + env),
        volumes=tuple(volumes),
        mounts=tuple(mounts),
        context=context,
        status=status,
        checkout=checkout,
        secret_refs=tuple(refs),
    )
