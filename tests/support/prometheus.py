"""A real Prometheus for the tests (built from upstream by the toolchain): it scrapes the operator on
loopback, evaluates the chart's rules, and answers queries over its HTTP API."""

from __future__ import annotations

import json
import socket
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.support.processes import GroupProcess

JOB = "agentrun-operator"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrometheusProcess(GroupProcess):
    """`prometheus` scraping `target` (host:port) every second as job `agentrun-operator`, with the
    static label `namespace` (what a ServiceMonitor would add), evaluating `rules` every second."""

    ready_text = "Server is ready to receive web requests."
    what = "prometheus"

    def __init__(self, bin_dir: Path, home: Path, target: str, namespace: str, rules: dict[str, Any]) -> None:
        super().__init__(home / "prometheus.log")
        self.bin_dir, self.home, self.port = bin_dir, home, free_port()
        (home / "rules.yaml").write_text(yaml.safe_dump(rules))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(home / "rules.yaml")],
            "scrape_configs": [
                {
                    "job_name": JOB,
                    "static_configs": [{"targets": [target], "labels": {"namespace": namespace}}],
                }
            ],
        }
        (home / "prometheus.yml").write_text(yaml.safe_dump(config))

    def start(self) -> PrometheusProcess:
        self._spawn(
            [
                str(self.bin_dir / "prometheus"),
                f"--config.file={self.home / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.home / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            timeout=120,
        )
        return self

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=30) as response:
            body = json.loads(response.read().decode())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` gives now (one entry per series)."""
        data = self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"] if data["resultType"] == "vector" else []
        return result

    def alerts(self) -> list[dict[str, Any]]:
        """Pending and firing alerts."""
        result: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return result

    def firing(self, name: str) -> dict[str, Any] | None:
        return next(
            (a for a in self.alerts() if a["labels"]["alertname"] == name and a["state"] == "firing"), None
        )
