"""The docs check (run by `make test`): the user docs name only commands, metrics, conditions and
reasons the code has, and their AgentRun manifests pass `agentrun validate`. The checker itself is
tested on bad pages, so a doc that names something unknown is proven to fail it."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest
import yaml

from agentrun_operator.celeval import CONTEXT_ROOTS
from tests.unit import docs_checker
from tests.unit.docs_checker import REPO, Finding, check_page, doc_files

# Known-pending: names the docs may show before the code that makes them real has landed (the
# check lets exactly these through). Empty: `agentrun cancel` and the `Ready` condition, pending while
# the "operate" work was on its branch, are now checked like every other name.
PENDING_COMMANDS: frozenset[str] = frozenset()
PENDING_NAMES: frozenset[str] = frozenset()


Known = tuple[dict[str, tuple[str, ...]], frozenset[str], frozenset[str]]


@pytest.fixture(scope="module")
def known() -> Known:
    return docs_checker.metric_labels(), docs_checker.product_names(), docs_checker.dev_names()


def _check(path: Path, text: str, known: Known) -> list[Finding]:
    metrics, product, dev = known
    return check_page(path, text, known_metrics=metrics, product=product, dev=dev)


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_page_names_only_what_the_code_has(path: Path, known: Known) -> None:
    metrics, product, dev = known
    findings = check_page(
        path,
        known_metrics=metrics,
        product=product,
        dev=dev,
        pending_commands=PENDING_COMMANDS,
        pending_names=PENDING_NAMES,
    )
    assert not findings, "\n".join(str(f) for f in findings)


def test_the_check_reads_every_kind_of_name_in_the_real_docs() -> None:
    """Guard against a checker that silently finds nothing: the real pages do show each kind."""
    commands = metrics = names = manifests = 0
    for path in doc_files():
        lines = docs_checker.lines_of(path.read_text(encoding="utf-8"))
        rel = path.relative_to(REPO).as_posix()
        commands += sum(1 for _, f in docs_checker.code_fragments(lines) for _ in docs_checker.commands_in(f))
        metrics += sum(1 for line in lines for _ in docs_checker._METRIC.finditer(line.text))
        names += sum(1 for _ in docs_checker.named_conditions_and_reasons(rel, lines))
        for _, text in docs_checker.yaml_blocks(lines):
            with contextlib.suppress(yaml.YAMLError):
                manifests += sum(1 for d in yaml.safe_load_all(text) if docs_checker._is_full_agentrun(d))
    assert commands >= 30 and metrics >= 7 and names >= 40 and manifests >= 1, (
        commands,
        metrics,
        names,
        manifests,
    )


# ----------------------------------------------------------------------------------- bad pages

BAD = Path("docs/bad.md")


def test_unknown_command_names_file_line_and_command(known: Known) -> None:
    text = "# Bad\n\nRun it:\n\n```sh\nkubectl agentrun frobnicate NAME\n```\n"
    findings = _check(BAD, text, known)
    assert [str(f) for f in findings] == [
        "docs/bad.md:6: unknown command 'agentrun frobnicate': not in `agentrun --help`"
    ]


def test_unknown_nested_command_and_option(known: Known) -> None:
    text = (
        "Use `agentrun dev up|explode` and `agentrun validate --strict FILE…`,\n"
        "then `agentrun dev down --purge`.\n"
    )
    findings = _check(BAD, text, known)
    assert [(f.line, f.kind, f.name) for f in findings] == [
        (1, "command", "agentrun dev explode"),
        (1, "option", "--strict"),
    ]


def test_known_commands_in_tables_blocks_and_paths_pass(known: Known) -> None:
    text = (
        "| `agentrun dev up\\|down\\|status` | x |\n"
        "|---|---|\n"
        "```sh\n"
        'eval "$(.venv/bin/agentrun dev env)"\n'
        ".venv/bin/agentrun dev logs POD -c reporter   # a comment\n"
        "agentrun reporter report --path P --fingerprint F\n"
        "helm install agentrun-operator charts/agentrun-operator\n"
        "kubectl patch agentrun my-run --type merge -p '{}'\n"
        "```\n"
        "See `operator/agentrun_operator/cli.py` and `agentrun --version`.\n"
    )
    assert _check(BAD, text, known) == []


def test_unknown_metric_and_label(known: Known) -> None:
    text = (
        "Metrics: `agentrun_iterations_total{result}`, `agentrun_bogus_seconds`,\n"
        "`agentrun_loop_stops_total{phase}` and `agentrun_reconcile_duration_seconds_bucket`.\n"
    )
    findings = _check(BAD, text, known)
    assert [str(f) for f in findings] == [
        "docs/bad.md:1: unknown metric 'agentrun_bogus_seconds': not in the operator's registry",
        "docs/bad.md:2: unknown label 'agentrun_loop_stops_total{phase}': labels: ('reason',)",
    ]


def test_unknown_condition_types(known: Known) -> None:
    text = (
        "The run gets condition `Healthy=True`.\n"
        "`kubectl wait --for=condition=Finished ar/x`\n"
        "Condition type, e.g. InvalidSpec, Sparkly.\n"
        "It has conditions `InvalidSpec` and `Glowing`.\n"
    )
    findings = _check(BAD, text, known)
    assert [(f.line, f.kind, f.name) for f in findings] == [
        (1, "condition", "Healthy"),
        (2, "condition", "Finished"),
        (3, "condition", "Sparkly"),
        (4, "condition", "Glowing"),
    ]
    block = "```sh\nkubectl wait --for=condition=Finished ar/x\n```\n"
    assert [(f.line, f.name) for f in _check(BAD, block, known)] == [(2, "Finished")]


def test_unknown_reasons_in_prose_tables_events_and_headings(known: Known) -> None:
    text = (
        "The step fails with reason `LoopExploded` (or `InvalidSpec`).\n"
        "Stop reason `LoopConditionFalse`; a `LoopWobbled` Event; Warning Event `Nope`.\n"
        "\n"
        "| Stop reason | Step phase |\n"
        "|---|---|\n"
        "| `LoopMaxIterationsReached` | Succeeded |\n"
        "| `LoopGaveUp` | Failed |\n"
        "\n"
        "| Field | Meaning |\n"
        "|---|---|\n"
        "| `NotAReason` | a name in a column that holds no reasons |\n"
    )
    findings = _check(BAD, text, known)
    assert [(f.line, f.kind, f.name) for f in findings] == [
        (1, "reason", "LoopExploded"),
        (2, "reason", "Nope"),
        (2, "reason", "LoopWobbled"),
        (7, "reason", "LoopGaveUp"),
    ]
    headings = _check(Path("docs/troubleshooting.md"), "## `LoopVanished` / `InvalidSpec`\n", known)
    assert [(f.line, f.name) for f in headings] == [(1, "LoopVanished")]


def test_pages_about_the_local_default_may_name_the_pod_runners_reasons(known: Known) -> None:
    text = "The pod fails with reason `UnsupportedVolume`.\n"
    assert _check(Path("docs/local-dev.md"), text, known) == []
    assert [f.name for f in _check(BAD, text, known)] == ["UnsupportedVolume"]


def test_invalid_manifest_fails_with_the_block_line(known: Known) -> None:
    text = (
        "Example:\n"
        "\n"
        "```yaml\n"
        "apiVersion: agents.proompteng.ai/v1alpha1\n"
        "kind: AgentRun\n"
        "metadata: {name: too-long}\n"
        "spec:\n"
        "  workload: {image: busybox, command: [sh, -c, 'true']}\n"
        "  workflow:\n"
        "    steps:\n"
        "      - name: work\n"
        "        loop: {maxIterations: 50}\n"
        "```\n"
        "\n"
        "```yaml\n"
        "loop: {maxIterations: 5000}   # a fragment, not a manifest\n"
        "```\n"
    )
    findings = _check(BAD, text, known)
    assert [(f.line, f.kind, f.name) for f in findings] == [(4, "manifest", "AgentRun/too-long")]
    assert "exceeds this operator's cap of 20" in findings[0].detail


def test_a_valid_manifest_passes(known: Known) -> None:
    text = (
        "```yaml\n"
        "apiVersion: agents.proompteng.ai/v1alpha1\n"
        "kind: AgentRun\n"
        "metadata: {name: ok}\n"
        "spec:\n"
        "  workload: {image: busybox, command: [sh, -c, 'true']}\n"
        "  workflow: {steps: [{name: work, loop: {maxIterations: 3}}]}\n"
        "```\n"
    )
    assert _check(BAD, text, known) == []


def test_pending_names_are_let_through_only_when_listed(known: Known) -> None:
    metrics, product, dev = known
    text = "Run `kubectl agentrun frobnicate NAME`; the run gets condition `Sparkly=True`.\n"
    strict = check_page(BAD, text, known_metrics=metrics, product=product, dev=dev)
    assert [(f.kind, f.name) for f in strict] == [
        ("command", "agentrun frobnicate"),
        ("condition", "Sparkly"),
    ]
    lenient = check_page(
        BAD,
        text,
        known_metrics=metrics,
        product=product,
        dev=dev,
        pending_commands=frozenset({"agentrun frobnicate"}),
        pending_names=frozenset({"Sparkly"}),
    )
    assert lenient == []


def test_every_example_has_a_readme_row_and_an_e2e_test() -> None:
    """examples/README.md states each example's outcome and tests/e2e/test_examples.py checks it."""
    examples = sorted(p.name for p in (REPO / "examples").glob("*.yaml"))
    readme = (REPO / "examples" / "README.md").read_text(encoding="utf-8")
    tests = (REPO / "tests" / "e2e" / "test_examples.py").read_text(encoding="utf-8")
    assert len(examples) >= 17
    assert [e for e in examples if f"| [{e}]({e}) |" not in readme] == []
    assert [e for e in examples if f'apply_example("{e}"' not in tests] == []


# --------------------------------------------------------------- the CEL context, counted and listed

_NUMBER_WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9}
_COUNT = re.compile(rf"\b({'|'.join(_NUMBER_WORDS)})\s+(?:CEL\s+)?variables\b", re.IGNORECASE)
_LISTED = re.compile(r"\bthe context (?:is|has) ((?:`?[a-z]+`?,\s*(?:and\s+)?)+`?[a-z]+`?)")


def cel_context_findings(rel: str, text: str) -> list[str]:
    """Where a page counts the CEL variables (cel.md, or a line that says CEL) or lists them ("the
    context is `iteration`, `step`, …") differently from the evaluator's CONTEXT_ROOTS."""
    found: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        if rel.endswith("cel.md") or "CEL" in line:
            for match in _COUNT.finditer(line):
                if _NUMBER_WORDS[match[1].lower()] != len(CONTEXT_ROOTS):
                    found.append(f"{rel}:{number}: {match[0]!r}, but the context has {len(CONTEXT_ROOTS)}")
        for match in _LISTED.finditer(line):
            names = set(re.findall(r"[a-z]+", match[1])) - {"and"}
            if names != CONTEXT_ROOTS:
                missing = ", ".join(sorted(CONTEXT_ROOTS - names)) or "none"
                extra = ", ".join(sorted(names - CONTEXT_ROOTS)) or "none"
                found.append(f"{rel}:{number}: lists the CEL context without {missing} (and with {extra})")
    return found


def test_the_docs_count_and_list_the_cel_variables_the_evaluator_has() -> None:
    findings = [
        finding
        for path in doc_files()
        for finding in cel_context_findings(
            path.relative_to(REPO).as_posix(), path.read_text(encoding="utf-8")
        )
    ]
    assert not findings, "\n".join(findings)


def test_the_cel_context_check_catches_a_wrong_count_and_a_short_list() -> None:
    assert cel_context_findings("docs/cel.md", "Only the four variables above exist") == [
        "docs/cel.md:1: 'four variables', but the context has 5"
    ]
    short = "| `undeclared reference` | the context is `iteration`, `step`, `run`, `steps` |"
    assert cel_context_findings("docs/troubleshooting.md", short) == [
        "docs/troubleshooting.md:1: lists the CEL context without outputs (and with none)"
    ]
    assert cel_context_findings("docs/concepts.md", "the context is the same as for `when`") == []
    assert cel_context_findings("docs/operator.md", "three variables of the chart") == []


_TURNAROUND_BAR = re.compile(r"turnaround[^.;]{0,80}?p95 ≤ (\d+) ms", re.IGNORECASE)
_CPU_PERCENTILE = re.compile(r"CPU per iteration p\d\d", re.IGNORECASE)


def quality_bar_findings(pages: dict[str, str]) -> list[str]:
    """The turnaround bar (p95 ≤ N ms) is the same number on every page, and operator CPU per
    iteration is never given as a percentile (the benchmark divides total CPU by iterations)."""
    bars: dict[str, set[str]] = {}
    findings: list[str] = []
    for rel, text in pages.items():
        flat = " ".join(text.replace("*", "").split())
        for match in _TURNAROUND_BAR.finditer(flat):
            bars.setdefault(match[1], set()).add(rel)
        findings += [f"{rel}: {m[0]!r}: the benchmark gives a mean" for m in _CPU_PERCENTILE.finditer(flat)]
    if len(bars) > 1:
        findings.append(
            "turnaround bars disagree: " + "; ".join(f"{n} ms in {sorted(p)}" for n, p in bars.items())
        )
    return findings


def test_the_quality_bars_agree_across_the_docs() -> None:
    pages = {path.relative_to(REPO).as_posix(): path.read_text(encoding="utf-8") for path in doc_files()}
    assert sum("p95 ≤" in text for text in pages.values()) >= 2  # the check reads the real bars
    assert quality_bar_findings(pages) == []


def test_the_quality_bar_check_catches_the_old_contradiction() -> None:
    design = (
        "iteration turnaround (pod terminated\n→ next Job created) p95 ≤ 100 ms; "
        "operator CPU per iteration p95 ≤ 10 ms"
    )
    operator = "**Turnaround p95 ≤ 50 ms at 5 x\n20: met**"
    assert quality_bar_findings({"docs/design.md": design, "docs/operator.md": operator}) == [
        "docs/design.md: 'CPU per iteration p95': the benchmark gives a mean",
        "turnaround bars disagree: 100 ms in ['docs/design.md']; 50 ms in ['docs/operator.md']",
    ]
