"""`agentrun dev image` (and `make image`): build the Dockerfile with a Docker engine.

The Dockerfile's base stays pinned by digest. `--base` chooses what the build starts from:
`registry` uses that pinned base (pulled as usual), `local` passes
`--build-arg PYTHON_IMAGE=agentrun-local/python:3.11-bookworm` (made from Debian packages, see
`baseimages`), `auto` uses the pinned base when it is present or can be pulled, else the local one.

The image is tagged as the chart and the operator's reporter default name it
(`ghcr.io/proompteng/agentrun-operator:<version>`), so the real node and `helm install` find it
without a registry. It carries a label with the hash of its build inputs (the files the
`.dockerignore` lets in, the base image's id): when an image with that label exists, nothing is
built. The legacy builder is used (`DOCKER_BUILDKIT=0`): BuildKit would pull its `# syntax=`
frontend image from a registry. `--network host`: the engine we start has no bridge network, and
the build stage downloads the dependencies' wheels from PyPI.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from agentrun_devcluster import baseimages
from agentrun_devcluster import dockerengine as engine
from agentrun_devcluster.dockerengine import EngineUnavailable, Progress
from agentrun_devcluster.processes import exclusive
from agentrun_operator import __version__
from agentrun_operator.config import DEFAULT_REPORTER_IMAGE

SOURCE_LABEL = "ai.proompteng.agentrun.source"
DEFAULT_TAG = DEFAULT_REPORTER_IMAGE
BASES = ("auto", "local", "registry")
CONTEXT_FILES = ("Dockerfile", "pyproject.toml", "README.md")
CONTEXT_DIRS = ("operator/agentrun_operator",)
"""What `.dockerignore` lets into the build context (kept in step by tests/unit/test_imagebuild.py)."""


class ImageBuildError(EngineUnavailable):
    """The image could not be built; the message says why, in one line."""


def repo_root() -> Path:
    return Path(__file__).resolve().parents[3]  # operator/devcluster/agentrun_devcluster/


def pinned_base(dockerfile_text: str) -> str:
    """The `ARG PYTHON_IMAGE=` default of the Dockerfile (the digest-pinned base)."""
    match = re.search(r"^ARG PYTHON_IMAGE=(\S+)", dockerfile_text, re.MULTILINE)
    if match is None:
        raise ImageBuildError("the Dockerfile has no `ARG PYTHON_IMAGE=` default")
    return match.group(1)


def context_files(root: Path) -> list[Path]:
    """The build context's files, sorted (bytecode caches left out, as the .dockerignore does)."""
    files = [root / name for name in CONTEXT_FILES]
    for directory in CONTEXT_DIRS:
        files += [
            p
            for p in (root / directory).rglob("*")
            if p.is_file()
            and "__pycache__" not in p.parts
            and not p.name.endswith((".pyc", ".egg-info"))
            and not any(part.endswith(".egg-info") for part in p.parts)
        ]
    return sorted(files)


def source_hash(root: Path, files: Iterable[Path], base_id: str, build_args: Iterable[str]) -> str:
    """The hash of everything the build reads: file paths and contents, the base's id, build args."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(base_id.encode() + b"\0")
    for arg in build_args:
        digest.update(arg.encode() + b"\0")
    return digest.hexdigest()[:16]


def _image_id(ref: str) -> str:
    proc = engine.docker("image", "inspect", "--format", "{{.Id}}", ref, timeout=30)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _label(ref: str, label: str) -> str:
    proc = engine.docker("image", "inspect", "--format", f'{{{{ index .Config.Labels "{label}" }}}}', ref)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def choose_base(base: str, pinned: str, say: Progress) -> str:
    """The image the build starts from (see the module docstring)."""
    if base not in BASES:
        raise ImageBuildError(f"--base must be one of {', '.join(BASES)}, not {base!r}")
    if base == "local":
        return baseimages.ensure_python_base(say)
    if base == "registry" or engine.image_exists(pinned):
        return pinned
    pull = engine.docker("pull", pinned, timeout=120)
    if pull.returncode == 0:
        return pinned
    why = (pull.stderr.strip().splitlines() or ["no output"])[-1]
    say(f"the pinned base cannot be pulled ({why}); using the local base made from Debian packages")
    return baseimages.ensure_python_base(say)


@dataclass(frozen=True)
class Built:
    tag: str
    base: str
    source: str
    cached: bool


def build_image(tag: str = DEFAULT_TAG, base: str = "auto", progress: Progress | None = None) -> Built:
    """Build (or reuse) the image; ImageBuildError/EngineUnavailable say why it cannot be."""
    say = progress or (lambda _m: None)
    engine.ensure_engine(say)
    root = repo_root()
    dockerfile = root / "Dockerfile"
    if not dockerfile.is_file():
        raise ImageBuildError(f"no Dockerfile at {dockerfile} (run from a checkout of the repository)")
    pinned = pinned_base(dockerfile.read_text())
    chosen = choose_base(base, pinned, say)
    args = [f"VERSION={__version__}"]
    if chosen != pinned:
        args.append(f"PYTHON_IMAGE={chosen}")
    source = source_hash(root, context_files(root), _image_id(chosen), args)
    if _label(tag, SOURCE_LABEL) == source:
        say(f"image {tag}: up to date (source {source})")
        return Built(tag, chosen, source, cached=True)
    try:  # the image's REVISION label only: a checkout without git builds as "unknown"
        revision = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except FileNotFoundError:
        revision = ""
    argv = [
        engine.docker_cli(),
        "build",
        "--network",
        "host",
        "--tag",
        tag,
        "--label",
        f"{SOURCE_LABEL}={source}",
    ]
    for arg in [*args, f"REVISION={revision or 'unknown'}"]:
        argv += ["--build-arg", arg]
    say(f"image {tag}: docker build from {chosen}")
    log = engine.state_dir() / "image-build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.run(
            [*argv, str(root)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "DOCKER_BUILDKIT": "0"},
        )
    if proc.returncode != 0:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        raise ImageBuildError(f"docker build failed: {lines[-1] if lines else 'no output'} (log {log})")
    return Built(tag, chosen, source, cached=False)


def build_image_with_busybox(
    tag: str = DEFAULT_TAG, base: str = "auto", progress: Progress | None = None
) -> Built:
    """The image and busybox:1.36, one preparer at a time on this host.

    `make test` starts this in the background while the tests wait on it through the same lock (the
    `docker_image` fixture), and `make image` may run beside them: all share the engine and the tag,
    so a second caller waits and then finds both cached instead of building them again."""
    with exclusive(engine.state_dir() / "image.lock"):
        built = build_image(tag, base, progress)
        baseimages.ensure_busybox(progress)
    return built
