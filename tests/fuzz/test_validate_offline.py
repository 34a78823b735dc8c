"""Offline fuzz: many mutated manifests through `agentrun validate`; it never crashes, and every
problem it prints is one actionable line (field path, value, fix, docs anchor).

Size: `AGENTRUN_FUZZ_OFFLINE` manifests (default 300) from seed `AGENTRUN_FUZZ_SEED` (default 0);
every kind of the examples is mutated (AgentRun, Agent, AgentProvider, ImplementationSpec).
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import yaml

from agentrun_operator.config import OperatorConfig
from agentrun_operator.validation_cli import check_file
from tests.fuzz.mutate import mutant

COUNT = int(os.environ.get("AGENTRUN_FUZZ_OFFLINE", "300"))
SEED = int(os.environ.get("AGENTRUN_FUZZ_SEED", "0"))
KINDS = ("AgentRun", "Agent", "AgentProvider", "ImplementationSpec")
LINE = re.compile(
    r"^(?P<file>[^:]+): (?P<object>\S+/\S+|\S+ \(document \d+\)): (?P<path>\S+): (?P<message>.+) "
    r"\(value: (?P<value>.*); fix: (?P<fix>.+); see (?P<docs>docs/[\w./-]+(#[\w-]+)?)\)$"
)


def test_mutated_manifests_never_crash_validate(tmp_path: Path) -> None:
    config = OperatorConfig(loops_enabled=True)
    flagged = 0
    for seed in range(SEED, SEED + COUNT):
        case = mutant(seed, KINDS)
        path = tmp_path / f"mutant-{seed}.yaml"
        path.write_text(yaml.safe_dump(case.manifest, allow_unicode=True))
        out = io.StringIO()
        try:
            _checked, problems = check_file(str(path), config, out)
        except Exception as exc:  # the property under test: no input crashes the validator
            raise AssertionError(f"agentrun validate crashed on {case.describe()}: {exc!r}") from exc
        printed = out.getvalue().splitlines()
        # A warning (a template path that names nothing, docs/api.md#runner-templates) is no problem:
        # it is printed, names its field, and does not count.
        warnings = [line for line in printed if ": warning: " in line]
        assert all(line.split(": warning: ", 1)[1].strip() for line in warnings), case.describe()
        lines = [line for line in printed if ": warning: " not in line]
        assert len(lines) == problems, case.describe()
        for line in lines:
            match = LINE.match(line)
            assert match, f"{case.describe()}: not an actionable line: {line}"
            assert match["path"] and match["fix"].strip(), line
        flagged += bool(problems)
    # Most mutations break something; a suite where nothing is flagged would test nothing.
    assert flagged >= COUNT // 3, f"only {flagged} of {COUNT} mutants were flagged"
