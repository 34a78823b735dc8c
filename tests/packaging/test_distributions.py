"""The two distributions built from this repository, as `pip` builds and installs them.

`agentrun-operator` (the product: the wheel the image installs) holds no dev-cluster code and needs no
`cryptography`; `agentrun-devcluster` (operator/devcluster/) holds `agentrun dev` and brings what it
needs. docs/development.md#dev-cluster-package says why.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _build_wheel(project: Path, out: Path) -> Path:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "-w",
            str(out),
            str(project),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("*.whl")
    return wheel


def _requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as whl:
        (metadata,) = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
        text = whl.read(metadata).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


@pytest.fixture(scope="module")
def operator_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build_wheel(REPO, tmp_path_factory.mktemp("operator-wheel"))


@pytest.fixture(scope="module")
def devcluster_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build_wheel(REPO / "operator" / "devcluster", tmp_path_factory.mktemp("devcluster-wheel"))


def test_the_operator_wheel_holds_no_dev_cluster_code(operator_wheel: Path) -> None:
    names = zipfile.ZipFile(operator_wheel).namelist()
    assert any(n.startswith("agentrun_operator/planner/") for n in names)
    assert [n for n in names if "devcluster" in n] == []


def test_the_operator_wheel_does_not_require_cryptography(
    operator_wheel: Path,
) -> None:
    required = _requires(operator_wheel)
    unconditional = [r.split(";")[0].strip() for r in required if ";" not in r]
    assert any(r.startswith("kopf") for r in unconditional)
    assert [r for r in required if "cryptography" in r] == []
    assert 'agentrun-devcluster==0.1.0; extra == "devcluster"' in required


def test_installing_the_operator_wheel_without_extras_pulls_no_cryptography(
    operator_wheel: Path, tmp_path: Path
) -> None:
    """What pip would install into an empty environment: the wheel and its dependencies, resolved."""
    report = tmp_path / "report.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            str(report),
            str(operator_wheel),
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0 and "No matching distribution" in done.stderr + done.stdout:
        pytest.skip(f"no package index answers here, so the resolution cannot be shown: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr
    installed = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert {"agentrun-operator", "kopf", "pydantic"} <= installed
    assert "cryptography" not in installed
    assert "agentrun-devcluster" not in installed


def test_the_devcluster_wheel_holds_agentrun_dev_and_its_dependencies(devcluster_wheel: Path) -> None:
    names = zipfile.ZipFile(devcluster_wheel).namelist()
    assert "agentrun_devcluster/dev.py" in names
    assert "agentrun_devcluster/podrunner/runner.py" in names
    assert [n for n in names if n.startswith("agentrun_operator/")] == []
    required = _requires(devcluster_wheel)
    assert "agentrun-operator==0.1.0" in required
    assert any(r.startswith("cryptography") for r in required)


def test_agentrun_dev_without_the_dev_cluster_says_how_to_install_it(
    operator_wheel: Path, tmp_path: Path
) -> None:
    """The operator wheel alone (its dependencies from this environment, no dev cluster on the path)."""
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            str(operator_wheel),
        ],
        check=True,
        capture_output=True,
    )
    # -S: no site-packages processing, so the editable installs' path hooks (.pth) of this checkout
    # stay out; the dependencies come from this environment's site-packages as a plain directory.
    program = (
        "import sys; sys.path[:0] = sys.argv[1:3];"
        "import importlib.util as u; assert u.find_spec('agentrun_devcluster') is None, 'visible';"
        "from agentrun_operator.cli import main; sys.exit(main(sys.argv[3:]))"
    )
    site = sysconfig.get_paths()["purelib"]

    def agentrun(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-S", "-c", program, str(target), site, *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )

    version = agentrun("--version")
    assert version.returncode == 0, version.stderr
    assert "0.1.0" in version.stdout + version.stderr
    dev = agentrun("dev", "up")
    assert dev.returncode == 2, dev.stderr
    assert "not installed" in dev.stderr
    assert "pip install -e operator/devcluster" in dev.stderr
    assert "docs/development.md#dev-cluster-package" in dev.stderr
    validate = agentrun("validate", str(REPO / "examples" / "fixed-loop.yaml"))
    assert validate.returncode == 0, validate.stdout + validate.stderr
