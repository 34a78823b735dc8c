"""The Dockerfile, checked statically (tests/docker/ builds and runs it where a Docker engine can be
started; `.ci/run` repeats the image's install steps in a clean virtualenv without Docker)."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"

Instruction = tuple[str, str]  # (KEYWORD, arguments)


def instructions(text: str) -> list[Instruction]:
    """Dockerfile instructions with line continuations joined and comments dropped."""
    result: list[Instruction] = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        keyword, _, args = current.strip().partition(" ")
        result.append((keyword.upper(), args.strip()))
        current = ""
    assert not current, "a dangling line continuation at the end of the Dockerfile"
    return result


@pytest.fixture(scope="module")
def parsed() -> list[Instruction]:
    return instructions(DOCKERFILE.read_text())


def stages(parsed: list[Instruction]) -> list[list[Instruction]]:
    out: list[list[Instruction]] = []
    for ins in parsed:
        if ins[0] == "FROM":
            out.append([])
        if out:
            out[-1].append(ins)
    return out


def _arg_defaults(parsed: list[Instruction]) -> dict[str, str]:
    defaults: dict[str, str] = {}
    for keyword, args in parsed:
        if keyword == "ARG" and "=" in args:
            name, _, value = args.partition("=")
            defaults[name.strip()] = value.strip().strip('"')
    return defaults


def _base_images(parsed: list[Instruction]) -> list[str]:
    defaults = _arg_defaults(parsed)
    images = []
    for keyword, args in parsed:
        if keyword != "FROM":
            continue
        image = next(a for a in args.split() if not a.startswith("--"))
        images.append(re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: defaults[m.group(1) or m.group(2)], image))
    return images


def test_is_multi_stage_building_the_wheel_then_installing_it(parsed: list[Instruction]) -> None:
    build, final = stages(parsed)[0], stages(parsed)[-1]
    assert len(stages(parsed)) >= 2
    build_runs = " ".join(a for k, a in build if k == "RUN")
    assert "pip wheel --no-deps" in build_runs, "stage 1 builds our wheel"
    final_runs = " ".join(a for k, a in final if k == "RUN")
    assert "pip install --no-index" in final_runs, "stage 2 installs the wheels offline"
    assert any(k == "COPY" and a.startswith("--from=") for k, a in final), "stage 2 copies stage 1's wheels"
    assert not any(k == "COPY" and "operator/" in a for k, a in final), "no source tree in the final image"


def test_base_image_is_slim_and_pinned_by_version_and_digest(parsed: list[Instruction]) -> None:
    for image in _base_images(parsed):
        if image in {name for _, a in parsed for name in re.findall(r"\bAS\s+(\S+)", a, re.I)}:
            continue  # FROM <earlier stage>
        assert re.fullmatch(r"python:3\.\d+\.\d+-slim-\w+@sha256:[0-9a-f]{64}", image), image


def test_no_remote_add_and_no_piped_installers(parsed: list[Instruction]) -> None:
    for keyword, args in parsed:
        if keyword == "ADD":
            assert not re.search(r"https?://|git@", args), f"ADD of a URL: {args}"
        if keyword == "RUN":
            assert not re.search(r"(curl|wget)[^|]*\|\s*(ba)?sh", args), f"piped installer: {args}"


def test_runs_as_a_non_root_numeric_user(parsed: list[Instruction]) -> None:
    users = [a for k, a in stages(parsed)[-1] if k == "USER"]
    assert users, "the final stage sets USER"
    user, _, group = users[-1].partition(":")
    assert user.isdigit() and int(user) > 0, users[-1]
    assert not group or (group.isdigit() and int(group) > 0), users[-1]
    # ...and nothing after it switches back to root.
    last_user = max(i for i, (k, _) in enumerate(stages(parsed)[-1]) if k == "USER")
    assert not [k for k, _ in stages(parsed)[-1][last_user + 1 :] if k == "RUN"], "RUN after USER"


def test_entrypoint_is_agentrun_and_defaults_to_the_operator(parsed: list[Instruction]) -> None:
    final = stages(parsed)[-1]
    entrypoint = [json.loads(a) for k, a in final if k == "ENTRYPOINT"]
    cmd = [json.loads(a) for k, a in final if k == "CMD"]
    assert entrypoint[-1] == ["agentrun"], "exec form, so signals reach the operator"
    assert cmd[-1] == ["operator"]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["agentrun"] == "agentrun_operator.cli:main"
    env = " ".join(a for k, a in final if k == "ENV")
    assert "PATH=/opt/agentrun/bin:" in env, "the reporter runs `agentrun reporter …` by name"


def test_health_is_checked_or_the_probe_story_is_documented(parsed: list[Instruction]) -> None:
    checks = [a for k, a in parsed if k == "HEALTHCHECK"]
    assert checks, "state the health check (or HEALTHCHECK NONE with the probe story)"
    if checks[-1].upper() == "NONE":
        deployment = (REPO / "charts" / "agentrun-operator" / "templates" / "deployment.yaml").read_text()
        assert "--liveness-port=" in deployment
        assert "livenessProbe" in deployment and "readinessProbe" in deployment
        assert "path: /healthz" in deployment
        operations = (REPO / "docs" / "operations.md").read_text()
        assert "HEALTHCHECK" in operations and "/healthz" in operations


def test_oci_labels(parsed: list[Instruction]) -> None:
    labels = " ".join(a for k, a in stages(parsed)[-1] if k == "LABEL")
    for key in ("title", "description", "version", "revision", "source", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels, key


def test_ci_repeats_the_install_steps(parsed: list[Instruction]) -> None:
    ci = (REPO / ".ci" / "run").read_text()
    assert "pip wheel --quiet --no-deps" in ci
    assert "--no-index --find-links" in ci
    assert "python3 -m venv" in ci
    assert 'agentrun" --version' in ci


def test_build_context_holds_what_the_dockerfile_copies() -> None:
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    for needed in ("pyproject.toml", "README.md", "operator/agentrun_operator/"):
        assert f"!{needed}" in ignore, needed
