"""Operator configuration from the environment (docs/operator.md), mapped from Helm values.

Every `AGENTS_…` variable is also accepted with the `JANGAR_` prefix of the loop proposal
(docs/design.md#origin); when both are set the `AGENTS_` one wins. Bad values are refused at start-up
with the variable named.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

PREFIXES = ("AGENTS_", "JANGAR_AGENTS_")

DEFAULT_RUNNER_IMAGE = "ghcr.io/proompteng/agentrun-runner:latest"
DEFAULT_REPORTER_IMAGE = "ghcr.io/proompteng/agentrun-operator:0.1.0"

DEFAULT_REFERENCE_GRACE_SECONDS = 30
"""How long a run waits for a missing Agent/AgentProvider/ImplementationSpec/PVC after its creation
(people apply a directory of manifests in any order) before it fails `InvalidSpec`."""

DEFAULT_POD_FS_GROUP = 10001
"""The `fsGroup` of iteration pods that mount a PVC (the helper image's group): the kubelet makes the
volume group-writable for it, so the Job claim works on root-owned `0755` volumes
(docs/design.md#claim-storage)."""


IMMEDIATE_CANCEL_GRACE_SECONDS = 3
"""The grace period an immediate cancel deletes the running attempt's pods with, when neither the step
nor the installation set one (docs/design.md#grace-period): the pods themselves keep Kubernetes'
default (30 s) for every other way they stop, as the original controller's did, and an immediate
cancel still ends a `main` that ignores SIGTERM within seconds. Long enough for the reporter (well
under a second)."""


DEFAULT_POD_GC_STRATEGY = "OnPodSuccess"
POD_GC_STRATEGIES = ("OnPodSuccess", "OnPodCompletion", "OnRunCompletion")
DEFAULT_POD_GC_MAX_KEPT_PODS = 10
"""Kept (failed) pods per run: enough to read the last few failures, few enough that a loop of 1,000
failing attempts cannot pile up pods."""


DEFAULT_WARM_PORT = 8471
"""Where a warm pod's supervisor listens (`AGENTS_CONTROLLER_WARM_PORT`, Helm `warm.port`)."""


class ConfigError(ValueError):
    """A configuration variable has a value the operator cannot use."""


@dataclass(frozen=True)
class OperatorConfig:
    """Everything the planner and the shell need to know about this installation."""

    loops_enabled: bool = False
    loop_max_iterations: int = 20
    loop_status_history_limit: int = 50
    watched_namespaces: tuple[str, ...] = field(default_factory=tuple)  # empty: cluster-wide
    runner_image: str = DEFAULT_RUNNER_IMAGE
    reporter_image: str = DEFAULT_REPORTER_IMAGE
    job_ttl_seconds_after_recorded: int = 300
    resync_seconds: float = 30.0
    status_budget_bytes: int = 256 * 1024
    reference_grace_seconds: float = float(DEFAULT_REFERENCE_GRACE_SECONDS)
    termination_grace_seconds: int | None = None
    """terminationGracePeriodSeconds of iteration pods whose step sets none; None (the default): not
    set, Kubernetes' default applies (`AGENTS_CONTROLLER_TERMINATION_GRACE_SECONDS` unset)."""
    pod_fs_group: int | None = DEFAULT_POD_FS_GROUP
    """None: iteration pods get no `fsGroup` (`AGENTS_CONTROLLER_POD_FS_GROUP=0`)."""
    pod_gc_strategy: str = DEFAULT_POD_GC_STRATEGY
    """Which recorded attempts keep their pods when a run sets no `spec.podGC.strategy`
    (docs/api.md#podgc)."""
    pod_gc_retention_seconds: int = 0
    """How long a kept pod stays after its attempt ended; 0: until the run is deleted."""
    pod_gc_max_kept_pods: int = DEFAULT_POD_GC_MAX_KEPT_PODS
    """At most this many kept pods per run; the oldest past it are released."""
    warm_port: int = DEFAULT_WARM_PORT
    """The port a warm pod's supervisor listens on, on its pod IP (docs/design.md#warm-channel)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        source = os.environ if env is None else env

        def raw(name: str) -> tuple[str, str] | None:
            for prefix in PREFIXES:
                key = prefix + name
                if key in source and source[key].strip() != "":
                    return key, source[key].strip()
            return None

        def boolean(name: str, default: bool) -> bool:
            found = raw(name)
            if found is None:
                return default
            key, value = found
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise ConfigError(f"{key}={value!r}: expected true or false")

        def integer(name: str, default: int, low: int, high: int) -> int:
            found = raw(name)
            if found is None:
                return default
            key, value = found
            try:
                number = int(value)
            except ValueError:
                raise ConfigError(f"{key}={value!r}: expected an integer in {low}..{high}") from None
            if not low <= number <= high:
                raise ConfigError(f"{key}={value!r}: expected an integer in {low}..{high}")
            return number

        def text(name: str, default: str) -> str:
            found = raw(name)
            return default if found is None else found[1]

        def choice(name: str, default: str, choices: tuple[str, ...]) -> str:
            found = raw(name)
            if found is None:
                return default
            key, value = found
            if value not in choices:
                raise ConfigError(f"{key}={value!r}: expected one of {', '.join(choices)}")
            return value

        namespaces = text("CONTROLLER_NAMESPACES", "")
        fs_group = integer("CONTROLLER_POD_FS_GROUP", DEFAULT_POD_FS_GROUP, 0, 2**31 - 1)
        return cls(
            loops_enabled=boolean("CONTROLLER_WORKFLOW_LOOPS_ENABLED", False),
            loop_max_iterations=integer("CONTROLLER_WORKFLOW_LOOP_MAX_ITERATIONS", 20, 1, 1000),
            loop_status_history_limit=integer("CONTROLLER_WORKFLOW_LOOP_STATUS_HISTORY_LIMIT", 50, 1, 1000),
            watched_namespaces=tuple(n.strip() for n in namespaces.split(",") if n.strip()),
            runner_image=text("AGENT_RUNNER_IMAGE", DEFAULT_RUNNER_IMAGE),
            reporter_image=text("REPORTER_IMAGE", DEFAULT_REPORTER_IMAGE),
            job_ttl_seconds_after_recorded=integer("CONTROLLER_JOB_TTL_SECONDS", 300, 0, 7 * 24 * 3600),
            resync_seconds=float(integer("CONTROLLER_RESYNC_SECONDS", 30, 1, 3600)),
            status_budget_bytes=integer("CONTROLLER_STATUS_BUDGET_BYTES", 256 * 1024, 1024, 1024 * 1024),
            reference_grace_seconds=float(
                integer("CONTROLLER_REFERENCE_GRACE_SECONDS", DEFAULT_REFERENCE_GRACE_SECONDS, 0, 3600)
            ),
            termination_grace_seconds=(
                integer("CONTROLLER_TERMINATION_GRACE_SECONDS", 0, 0, 3600)
                if raw("CONTROLLER_TERMINATION_GRACE_SECONDS") is not None
                else None
            ),
            pod_fs_group=fs_group or None,
            pod_gc_strategy=choice("CONTROLLER_POD_GC_STRATEGY", DEFAULT_POD_GC_STRATEGY, POD_GC_STRATEGIES),
            pod_gc_retention_seconds=integer("CONTROLLER_POD_GC_RETENTION_SECONDS", 0, 0, 90 * 24 * 3600),
            pod_gc_max_kept_pods=integer(
                "CONTROLLER_POD_GC_MAX_KEPT_PODS", DEFAULT_POD_GC_MAX_KEPT_PODS, 0, 1000
            ),
            warm_port=integer("CONTROLLER_WARM_PORT", DEFAULT_WARM_PORT, 1, 65535),
        )
