"""Offline fuzz: mutated files through `agentrun validate` (the CLI's `main`, and a sample through the
installed command in a subprocess) and the webhook's `review`; they never raise, and the CLI prints
one actionable line per problem (field path, value, fix, docs anchor) or says the objects are valid.

The files come from `mutate.mutant_file`: valid documents of every kind (AgentRun, Agent,
AgentProvider, ImplementationSpec, VersionControlProvider), alone or as a whole example file, with
edits at every depth (the envelope — `kind`, `metadata`, `metadata.name` — as often as the spec).
- a hypothesis property (`st.randoms()`: failures shrink to the smallest edit list);
- a seeded run: `AGENTRUN_FUZZ_OFFLINE` files (default 300) from seed `AGENTRUN_FUZZ_SEED` (default 0),
  replayable one by one; `AGENTRUN_FUZZ_SUBPROCESS` of them (default 4) also through the command.
docs/development.md#fuzz has the 10,000-file measurement's command.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun_operator.cli import main
from agentrun_operator.config import OperatorConfig
from agentrun_operator.webhook import review
from tests.fuzz.mutate import MutantFile, mutant_file, valid_files

COUNT = int(os.environ.get("AGENTRUN_FUZZ_OFFLINE", "300"))
SEED = int(os.environ.get("AGENTRUN_FUZZ_SEED", "0"))
SUBPROCESS = int(os.environ.get("AGENTRUN_FUZZ_SUBPROCESS", "4"))
CONFIG = OperatorConfig(loops_enabled=True)
LINE = re.compile(
    r"^(?P<file>[^:]+): (?P<object>\S+/\S+|\S+ \(document \d+\)): (?P<path>\S+): (?P<message>.+) "
    r"\(value: (?P<value>.*); fix: (?P<fix>.+); see (?P<docs>docs/[\w./-]+(#[\w-]+)?)\)$"
)
WARNING = re.compile(r"^(?P<file>[^:]+): (?P<object>\S+/\S+|\S+ \(document \d+\)): warning: \S+: .+$")
AGENTRUN = Path(sys.executable).with_name("agentrun")  # the installed command of this venv


def run_cli(path: Path) -> tuple[int, str, str]:
    """`agentrun validate PATH` in this process: (exit status, stdout, stderr); raising is the bug."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["validate", str(path)])
    return status, out.getvalue(), err.getvalue()


def assert_one_line_per_problem(case: str, status: int, out: str, err: str) -> int:
    """Every printed line is a problem or a warning line; the summary agrees with them; returns the
    number of problems."""
    assert "Traceback" not in out + err, f"{case}:\n{err}"
    problems = 0
    for line in out.splitlines():
        if WARNING.match(line):
            continue
        match = LINE.match(line)
        assert match, f"{case}: not one actionable line: {line!r}"
        assert match["fix"].strip() and match["path"], f"{case}: {line}"
        problems += 1
    summary = err.strip().splitlines()
    if problems:
        assert status == 1, f"{case}: {problems} problem(s) but exit status {status}"
        assert summary == [f"{problems} problem(s) found in 1 file(s)"], f"{case}: {err}"
    else:
        assert status == 0, f"{case}: exit status {status} without a problem line:\n{out}{err}"
        assert len(summary) == 1 and re.fullmatch(r"\d+ object\(s\) valid", summary[0]), f"{case}: {err}"
    return problems


def assert_review_never_raises(case: MutantFile) -> None:
    """The webhook's decision on every document that is an object (the API server sends no other)."""
    for body in case.documents:
        if isinstance(body, dict):
            verdict = review(body, None, "CREATE", CONFIG)
            assert verdict.allowed or verdict.message.strip(), case.describe()


def check(case: MutantFile, path: Path) -> int:
    path.write_text(case.text(), encoding="utf-8")
    status, out, err = run_cli(path)
    assert_review_never_raises(case)
    return assert_one_line_per_problem(case.describe(), status, out, err)


@pytest.mark.parametrize("name", [name for name, _ in valid_files()])
def test_the_unmutated_files_are_valid(name: str, tmp_path: Path) -> None:
    """The generator starts from valid files: each passes as it is (so a problem is the edit's)."""
    docs = dict(valid_files())[name]
    case = MutantFile((name,), (), docs)
    assert check(case, tmp_path / name) == 0


@settings(max_examples=200)
@given(rng=st.randoms(use_true_random=False))
def test_mutated_files_never_crash_validate_or_the_webhook(rng: random.Random) -> None:
    case = mutant_file(rng)
    with tempfile.TemporaryDirectory() as directory:  # not tmp_path: one per example, not per test
        check(case, Path(directory) / "mutant.yaml")


def test_seeded_mutants_never_crash_validate(tmp_path: Path) -> None:
    flagged = 0
    for seed in range(SEED, SEED + COUNT):
        case = mutant_file(random.Random(seed))
        flagged += bool(check(case, tmp_path / f"mutant-{seed}.yaml"))
    print(f"validate fuzz: {COUNT} files from seed {SEED}: no traceback, {flagged} with problems")
    # Most mutations break something; a suite where nothing is flagged would test nothing.
    assert flagged >= COUNT // 3, f"only {flagged} of {COUNT} mutants were flagged"


def test_a_sample_through_the_installed_command(tmp_path: Path) -> None:
    """The real entry point in its own process: the same lines and status as in-process, no traceback."""
    for seed in range(SEED, SEED + SUBPROCESS):
        case = mutant_file(random.Random(seed))
        path = tmp_path / f"mutant-{seed}.yaml"
        path.write_text(case.text(), encoding="utf-8")
        proc = subprocess.run([str(AGENTRUN), "validate", str(path)], capture_output=True, text=True)
        assert_one_line_per_problem(
            f"seed {seed}: {case.describe()}", proc.returncode, proc.stdout, proc.stderr
        )
        assert (proc.returncode, proc.stdout) == run_cli(path)[:2], f"seed {seed}: {case.describe()}"
