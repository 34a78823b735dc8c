"""The e2e tier's runs again on the real node: every example, the control-file rows, the operating
checks and the Helm install with its flag rollout (docs/development.md#tiers).

One module, so one pytest worker owns the node (it is host-wide). The test functions are the e2e
modules' own, taken over unchanged; this directory's conftest gives them the real node's
`local_default` and `release`. A behaviour only the pod runner has (its restarts, its sandbox) stays
in tests/e2e.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from tests.e2e import test_control_file, test_examples, test_helm_install, test_operating

OVERRIDDEN = ("local_default", "release")
"""The fixtures this tier provides itself (tests/node/conftest.py)."""


def take_over(modules: tuple[ModuleType, ...], into: dict[str, Any]) -> list[str]:
    """Put the modules' tests and their module fixtures into `into`; a clash of names is an error
    (it would silently drop a test)."""
    taken: list[str] = []
    for module in modules:
        for name, value in vars(module).items():
            is_fixture = (
                hasattr(value, "_pytestfixturefunction")
                or type(value).__name__ == "FixtureFunctionDefinition"
            )
            if not (name.startswith("test_") and callable(value)) and not is_fixture:
                continue
            if name in OVERRIDDEN:
                continue
            if name in into and into[name] is not value:
                raise AssertionError(f"{module.__name__}.{name} clashes with a test of the same name")
            into[name] = value
            taken.append(name)
    return taken


TAKEN = take_over((test_examples, test_control_file, test_operating, test_helm_install), globals())
