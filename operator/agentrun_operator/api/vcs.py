"""The VersionControlProvider kind: where a run's repository lives and how its pods reach it.

Field names, types and limits are the original v1alpha1 API's (docs/migration.md); what the operator
does with them is in docs/api.md#versioncontrolprovider.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import ConfigDict, Field, WithJsonSchema

from .base import API_VERSION, NAME_MAX, ApiModel, ApiVersion, Timestamp
from .common import ConfigMapKeyRef, SecretKeyRef
from .resources import SimpleStatus

VcsProviderType = Literal["github", "gitlab", "bitbucket", "gitea", "generic"]
AuthMethod = Literal["token", "app", "ssh", "none"]
TokenType = Literal["pat", "fine_grained", "api_token", "access_token"]
MAX_POLICY_PATTERNS: Final = 200
MAX_URL: Final = 2048

IntOrString = Annotated[
    int | str,
    WithJsonSchema({"x-kubernetes-int-or-string": True}),
]
"""An integer or a string (Kubernetes IntOrString), e.g. a GitHub App id written either way."""


class TokenAuth(ApiModel):
    """A token from a Secret key."""

    secret_ref: SecretKeyRef | None = Field(
        default=None, description="The Secret (and key) holding the token."
    )
    type: TokenType | None = Field(
        default=None, description="pat, fine_grained, api_token or access_token (informational)."
    )


class AppAuth(ApiModel):
    """A GitHub App installation (refused with InvalidSpec by this operator: docs/api.md#vcs-auth)."""

    app_id: IntOrString | None = Field(default=None, description="The App's id.")
    installation_id: IntOrString | None = Field(default=None, description="The installation's id.")
    private_key_secret_ref: SecretKeyRef | None = Field(
        default=None, description="The Secret (and key) holding the App's private key."
    )
    token_ttl_seconds: int | None = Field(
        default=None, ge=0, le=2**31 - 1, description="Lifetime of installation tokens."
    )


class SshAuth(ApiModel):
    """An SSH deploy key."""

    private_key_secret_ref: SecretKeyRef | None = Field(
        default=None, description="The Secret (and key) holding the private key."
    )
    known_hosts_config_map_ref: ConfigMapKeyRef | None = Field(
        default=None, description="The ConfigMap (and key) holding known_hosts."
    )


class VcsAuth(ApiModel):
    """How pods authenticate to the repository host."""

    method: AuthMethod | None = Field(default=None, description="token, app, ssh or none.")
    username: str | None = Field(
        default=None, max_length=NAME_MAX, description="User name for token auth over https."
    )
    token: TokenAuth | None = Field(default=None, description="For method token.")
    app: AppAuth | None = Field(default=None, description="For method app.")
    ssh: SshAuth | None = Field(default=None, description="For method ssh.")


class VcsCapabilities(ApiModel):
    """What the provider may be used for."""

    read: bool | None = Field(default=None, description="Clone and fetch.")
    write: bool | None = Field(default=None, description="Push branches.")
    pull_requests: bool | None = Field(default=None, description="Open pull requests.")


class PullRequestDefaults(ApiModel):
    """Pull request defaults (passed to the pods; this operator opens none itself)."""

    enabled: bool | None = Field(default=None, description="Whether a pull request is wanted.")
    draft: bool | None = Field(default=None, description="Open it as a draft.")
    title_template: str | None = Field(default=None, description="Title template.")
    body_template: str | None = Field(default=None, description="Body template.")


class VcsDefaults(ApiModel):
    """Branch and commit defaults."""

    base_branch: str | None = Field(
        default=None, max_length=NAME_MAX, description="Base branch when the run's parameters name none."
    )
    branch_template: str | None = Field(
        default=None, description="Head branch template, e.g. codex/{{agentRun.name}}."
    )
    branch_conflict_suffix_template: str | None = Field(
        default=None, description="Suffix template when the head branch exists."
    )
    commit_author_name: str | None = Field(default=None, description="Author name of the pods' commits.")
    commit_author_email: str | None = Field(default=None, description="Author email of the pods' commits.")
    pull_request: PullRequestDefaults | None = Field(default=None, description="Pull request defaults.")


class RepositoryPolicy(ApiModel):
    """Which repositories (owner/name, `*` wildcards) runs may use; deny wins over allow."""

    allow: list[str] | None = Field(
        default=None,
        max_length=MAX_POLICY_PATTERNS,
        description="Allowed repositories; when set, any other is refused.",
    )
    deny: list[str] | None = Field(
        default=None, max_length=MAX_POLICY_PATTERNS, description="Refused repositories."
    )


class VersionControlProviderSpec(ApiModel):
    """A repository host: URLs, credentials, capabilities, defaults and a repository policy."""

    provider: VcsProviderType = Field(description="github, gitlab, bitbucket, gitea or generic.")
    api_base_url: str | None = Field(default=None, max_length=MAX_URL, description="The host's API URL.")
    web_base_url: str | None = Field(default=None, max_length=MAX_URL, description="The host's web URL.")
    clone_base_url: str | None = Field(
        default=None,
        max_length=MAX_URL,
        description="Base of clone URLs (<cloneBaseUrl>/<repository>.git); file:// and http:// work too.",
    )
    clone_protocol: Literal["https", "ssh"] | None = Field(default=None, description="https or ssh.")
    ssh_host: str | None = Field(default=None, max_length=NAME_MAX, description="Host for ssh clones.")
    ssh_user: str | None = Field(default=None, max_length=NAME_MAX, description="User for ssh clones.")
    auth: VcsAuth | None = Field(default=None, description="How pods authenticate.")
    capabilities: VcsCapabilities | None = Field(default=None, description="read, write, pullRequests.")
    defaults: VcsDefaults | None = Field(default=None, description="Branch and commit defaults.")
    repository_policy: RepositoryPolicy | None = Field(
        default=None, description="Allowed and denied repositories."
    )


class VersionControlProviderStatus(SimpleStatus):
    """Status of a VersionControlProvider (reserved; this operator writes none today)."""

    last_validated_at: Timestamp | None = Field(default=None, description="When it was last checked.")


class VersionControlProvider(ApiModel):
    """A VersionControlProvider object."""

    model_config = ConfigDict(extra="ignore")

    api_version: ApiVersion = Field(default=API_VERSION, description=API_VERSION)
    kind: Literal["VersionControlProvider"] = Field(
        default="VersionControlProvider", description="VersionControlProvider"
    )
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: VersionControlProviderSpec = Field(description="Desired state.")
    status: VersionControlProviderStatus | None = Field(default=None, description="Observed state.")
