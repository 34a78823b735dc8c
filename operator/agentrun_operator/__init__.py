"""AgentRun Operator: runs AgentRun workflows whose steps loop over a shared PVC."""

from __future__ import annotations


def __getattr__(name: str) -> str:
    """`__version__` is looked up lazily: the in-pod reporter imports this package on every start."""
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("agentrun-operator")
        except PackageNotFoundError:  # running from a source tree without install
            return "0.0.0+local"
    raise AttributeError(name)
