"""AgentRun Operator: runs AgentRun workflows whose steps loop over a shared PVC."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("agentrun-operator")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0+local"
