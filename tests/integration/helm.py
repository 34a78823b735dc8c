"""`helm` as the tests run it: the binary built with the control plane, its homes in a temp dir."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "agentrun-operator"
RELEASE_NS = "agentrun-system"


# -- helm -----------------------------------------------------------------------------------------
def _helm_env(home: Path, kubeconfig: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    env.update(
        {
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }
    )
    return env


@dataclass
class Helm:
    binary: Path
    home: Path
    kubeconfig: Path | None = None  # the cluster `install`/`upgrade` talk to

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(self.binary), *args],
            capture_output=True,
            text=True,
            env=_helm_env(self.home, self.kubeconfig),
            check=False,
            timeout=120,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc

    def values_file(self, values: dict[str, Any]) -> Path:
        path = self.home / f"values-{abs(hash(json.dumps(values, sort_keys=True)))}.yaml"
        path.write_text(yaml.safe_dump(values))
        return path

    def template(
        self, values: dict[str, Any], release: str = "agentrun", namespace: str = RELEASE_NS
    ) -> subprocess.CompletedProcess[str]:
        return self.run(
            "template",
            release,
            str(CHART),
            "--namespace",
            namespace,
            "--values",
            str(self.values_file(values)),
            check=False,
        )

    def render(
        self, values: dict[str, Any], release: str = "agentrun", namespace: str = RELEASE_NS
    ) -> list[dict[str, Any]]:
        proc = self.template(values, release, namespace)
        assert proc.returncode == 0, proc.stderr
        return [d for d in yaml.safe_load_all(proc.stdout) if d]
