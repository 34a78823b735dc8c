"""Pure builders of the Kubernetes objects an AgentRun needs (iteration Jobs). No I/O lives here."""

from .builder import (
    ANNOTATION_RUN_NAME,
    CONTROL_FALLBACK_VOLUME,
    PlannedAttempt,
    ResolvedContainer,
    Task,
    build_iteration_job,
    iteration_job_name,
    resolve_container,
    resolve_implementation,
    volume_holding,
)
from .reporter_container import FINGERPRINT_CONTAINER, MAIN_CONTAINER, META_VOLUME, REPORTER_CONTAINER

__all__ = [
    "ANNOTATION_RUN_NAME",
    "CONTROL_FALLBACK_VOLUME",
    "FINGERPRINT_CONTAINER",
    "MAIN_CONTAINER",
    "META_VOLUME",
    "REPORTER_CONTAINER",
    "PlannedAttempt",
    "ResolvedContainer",
    "Task",
    "build_iteration_job",
    "iteration_job_name",
    "resolve_container",
    "resolve_implementation",
    "volume_holding",
]
