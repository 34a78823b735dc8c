"""The docs check: every name the user docs show must be one the code has.

What it reads: `docs/*.md`, `README.md` and `examples/README.md`. What it checks:

- **commands** — every `agentrun …` / `kubectl agentrun …` in a code span or a code block: each
  subcommand word is one the CLI has (`agentrun <subcommand> --help` exits 0), every `--option`
  belongs to that subcommand;
- **metrics** — every `agentrun_…` name is a metric in the Prometheus registry (or one of its
  samples: `_total`, `_bucket`, `_count`, `_sum`), and every `{label}` shown with it is one of its labels;
- **conditions and reasons** — every name the docs give as a condition type (`X=True`, condition `X`,
  `--for=condition=X`, "Condition type, e.g. X, Y") or as a reason (reason `X`, stop reason `X`,
  Event `X`, the Reason/Stop reason/Event column of a table, a troubleshooting heading) is a string
  the code can set: a literal in the product code (the local pod runner's own code for the pages
  about the local default);
- **manifests** — every full AgentRun manifest in a YAML code block passes `agentrun validate`.

A finding names the file, the line and the unknown name.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import re
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import REGISTRY
from prometheus_client.metrics import MetricWrapperBase

from agentrun_operator import cli
from agentrun_operator.api import GROUP
from agentrun_operator.control import reporter
from agentrun_operator.shell import metrics as operator_metrics
from tests.support.source import parse_file

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "operator" / "agentrun_operator"
DEV_PAGES = frozenset({"docs/local-dev.md", "docs/development.md"})
"""Pages about the local default: their reasons are the local pod runner's (a kubelet's) reasons."""


def doc_files(root: Path = REPO) -> list[Path]:
    return sorted([*(root / "docs").glob("*.md"), root / "README.md", root / "examples" / "README.md"])


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    kind: str  # command, option, metric, label, condition, reason, manifest
    name: str
    detail: str = ""

    def __str__(self) -> str:
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.path}:{self.line}: unknown {self.kind} {self.name!r}{detail}"


@dataclass(frozen=True)
class Line:
    number: int  # 1-based
    text: str
    fence: str | None  # the info string of the code block the line is in, None outside blocks


def lines_of(text: str) -> list[Line]:
    out: list[Line] = []
    fence: str | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("```"):
            fence = stripped[3:].strip() if fence is None else None
            continue
        out.append(Line(number, raw, fence))
    return out


_CODE_SPAN = re.compile(r"`([^`]+)`")


def code_fragments(lines: Iterable[Line]) -> Iterator[tuple[int, str]]:
    """(line, text) of every code block line and every inline code span."""
    for line in lines:
        if line.fence is not None:
            yield line.number, line.text
        else:
            for match in _CODE_SPAN.finditer(line.text):
                yield line.number, match.group(1).replace("\\|", "|")  # `a\|b` inside a table


# ----------------------------------------------------------------------------------- commands

_COMMAND = re.compile(r"(?:(?<![\w.\-])|(?<=kubectl-))agentrun[ \t]+(?P<rest>.*)")
_COMMAND_END = re.compile(r"\s\|\s|;|&&|\|\||\)|\"|'|`|\s#|\s>|<|\s\\$")
_STARTS_COMMAND = re.compile(r"(?:^|[;(|&\"`$]|\bkubectl-?)[ \t]*$")
PLACEHOLDER_PUNCTUATION = "[]…,.:"


def commands_in(fragment: str) -> Iterator[str]:
    """The words after each `agentrun` that starts a command (`kubectl get agentrun x` does not)."""
    for match in _COMMAND.finditer(fragment):
        before = re.sub(r"[\w.-]*/$", "", fragment[: match.start()])  # a path: .venv/bin/agentrun
        if _STARTS_COMMAND.search(before):
            yield match.group("rest")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _option(parser: argparse.ArgumentParser, token: str) -> argparse.Action | None:
    return parser._option_string_actions.get(token.split("=", 1)[0])


def _delegated(parser: argparse.ArgumentParser) -> argparse.ArgumentParser | None:
    """`agentrun reporter …` hands every word after it to the reporter's own parser."""
    if any(a.nargs == argparse.REMAINDER for a in parser._actions):
        return reporter.build_parser()
    return None


def help_exits_zero(words: list[str]) -> bool:
    """`agentrun WORDS --help` exits 0 (run in this process; its output is discarded)."""
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        try:
            cli.main([*words, "--help"])
        except SystemExit as exc:
            return exc.code in (0, None)
    return False


def check_command(path: str, number: int, rest: str) -> list[Finding]:
    """One documented command line (the words after `agentrun`)."""
    end = _COMMAND_END.search(rest)
    words = [w.strip(PLACEHOLDER_PUNCTUATION) for w in (rest[: end.start()] if end else rest).split()]
    words = [w for w in words if w]
    findings: list[Finding] = []
    parser = cli.build_parser()
    chain: list[str] = []
    choosing = True  # the next plain word names a subcommand
    skip_value = False
    for word in words:
        if skip_value:
            skip_value = False
            continue
        if word.startswith("-"):
            if word in ("-", "--"):
                break
            action = _option(parser, word)
            if action is None:
                usage = " ".join(["agentrun", *chain])
                findings.append(Finding(path, number, "option", word, f"`{usage}` has no such option"))
            elif action.nargs != 0 and "=" not in word:
                skip_value = True
            continue
        choices = _subparsers(parser) if choosing else {}
        if not choices:
            choosing = False
            continue
        alternatives = word.split("|")
        unknown = [w for w in alternatives if w not in choices]
        for name in unknown:
            findings.append(
                Finding(
                    path, number, "command", " ".join(["agentrun", *chain, name]), "not in `agentrun --help`"
                )
            )
        for name in alternatives:
            if name not in unknown and not help_exits_zero([*chain, name]):
                findings.append(
                    Finding(
                        path,
                        number,
                        "command",
                        " ".join(["agentrun", *chain, name]),
                        "--help does not exit 0",
                    )
                )
        if unknown or len(alternatives) > 1:
            break
        chain.append(word)
        parser = choices[word]
        delegated = _delegated(parser)
        if delegated is not None:
            parser = delegated
    return findings


def check_commands(path: str, lines: list[Line]) -> list[Finding]:
    findings: list[Finding] = []
    for number, fragment in code_fragments(lines):
        for rest in commands_in(fragment):
            findings.extend(check_command(path, number, rest))
    return findings


# ----------------------------------------------------------------------------------- metrics

_METRIC = re.compile(r"(?<![\w./\-])(agentrun_[a-z0-9_]+)(?!\w|/|\.\w)(?:\{([a-z_, ]+)\})?")
_NOT_METRICS = frozenset({"agentrun_operator", "agentrun_devcluster"})


def metric_labels() -> dict[str, tuple[str, ...]]:
    """Every sample name of our metrics in the registry, with the labels of its metric."""
    labels: dict[str, tuple[str, ...]] = {}
    by_name = {
        m._name: tuple(m._labelnames)
        for m in vars(operator_metrics).values()
        if isinstance(m, MetricWrapperBase)
    }
    for family in REGISTRY.collect():
        if not family.name.startswith("agentrun_"):
            continue
        suffixes = {
            "counter": ("", "_total", "_created"),
            "histogram": ("", "_bucket", "_count", "_sum", "_created"),
            "summary": ("", "_count", "_sum", "_created"),
        }.get(family.type, ("",))
        own = by_name.get(family.name) or by_name.get(family.name + "_total") or ()
        for suffix in suffixes:
            labels[family.name + suffix] = own + (("le",) if suffix == "_bucket" else ())
    return labels


def check_metrics(path: str, lines: list[Line], known: dict[str, tuple[str, ...]]) -> list[Finding]:
    findings: list[Finding] = []
    for line in lines:
        for match in _METRIC.finditer(line.text):
            name, shown = match.group(1), match.group(2)
            if name in _NOT_METRICS:
                continue
            if name not in known:
                findings.append(Finding(path, line.number, "metric", name, "not in the operator's registry"))
                continue
            for label in (shown or "").replace(" ", "").split(","):
                if label and label not in known[name]:
                    findings.append(
                        Finding(path, line.number, "label", f"{name}{{{label}}}", f"labels: {known[name]}")
                    )
    return findings


# ----------------------------------------------------------------------------------- conditions, reasons

_NAME = r"[A-Z][A-Za-z0-9]+"
_MORE = re.compile(rf"^\s*(?:,|/|\bor\b|\band\b|\(or)\s*`({_NAME})`\)?")
_CONDITION_STATUS = re.compile(rf"`({_NAME})=(?:True|False|Unknown)`")
_CONDITION_WAIT = re.compile(rf"--for=condition=({_NAME})")
_CONDITION_WORD = re.compile(rf"\b[Cc]onditions?(?: types?)?:? `({_NAME})`")
_CONDITION_EG = re.compile(rf"\b[Cc]onditions?(?: types?)?, e\.g\. ((?:{_NAME}(?:, | or | and )?)+)")
_REASON_WORD = re.compile(rf"\b[Rr]easons?:? `({_NAME})`")
_EVENT_BEFORE = re.compile(rf"\bEvents? `({_NAME})`")
_EVENT_AFTER = re.compile(rf"`({_NAME})` Events?\b")
_HEADING = re.compile(r"^#{2,}\s+(.*)")
_BACKTICKED = re.compile(rf"`({_NAME})`")
REASON_COLUMNS = frozenset({"reason", "stop reason", "event"})


def _with_followers(line: str, match: re.Match[str]) -> Iterator[str]:
    """The matched name and the names listed right after it (`A`, `B` or `C`)."""
    yield match.group(1)
    rest = line[match.end() :]
    while (more := _MORE.match(rest)) is not None:
        yield more.group(1)
        rest = rest[more.end() :]


def _cells(row: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))]


def named_conditions_and_reasons(path: str, lines: list[Line]) -> Iterator[tuple[int, str, str]]:
    """(line, kind, name) of every name the page gives as a condition type or a reason."""
    reason_columns: list[int] = []
    troubleshooting = path.endswith("troubleshooting.md")
    for index, line in enumerate(lines):
        text = line.text
        if line.fence is not None:  # code: only `kubectl wait --for=condition=X` names a condition
            for match in _CONDITION_WAIT.finditer(text):
                yield line.number, "condition", match.group(1)
            continue
        for pattern in (_CONDITION_STATUS, _CONDITION_WAIT, _CONDITION_WORD):
            for match in pattern.finditer(text):
                for name in _with_followers(text, match):
                    yield line.number, "condition", name
        for match in _CONDITION_EG.finditer(text):
            for name in re.findall(_NAME, match.group(1)):
                yield line.number, "condition", name
        for pattern in (_REASON_WORD, _EVENT_BEFORE):
            for match in pattern.finditer(text):
                for name in _with_followers(text, match):
                    yield line.number, "reason", name
        for match in _EVENT_AFTER.finditer(text):
            yield line.number, "reason", match.group(1)
        heading = _HEADING.match(text)
        if troubleshooting and heading:
            for name in _BACKTICKED.findall(heading.group(1)):
                yield line.number, "reason", name
        # Tables: a header row followed by `|---|`; names in its Reason / Stop reason / Event columns.
        if text.lstrip().startswith("|"):
            following = lines[index + 1].text if index + 1 < len(lines) else ""
            if re.match(r"^\s*\|[\s:|-]+\|\s*$", following) and "-" in following:
                reason_columns = [i for i, c in enumerate(_cells(text)) if c.lower() in REASON_COLUMNS]
                continue
            cells = _cells(text)
            for column in reason_columns:
                if column < len(cells):
                    for name in _BACKTICKED.findall(cells[column]):
                        yield line.number, "reason", name
        else:
            reason_columns = []


def settable_names(*roots: Path, exclude: Iterable[Path] = ()) -> frozenset[str]:
    """Every CamelCase string literal in the Python code under `roots`: what that code can set."""
    excluded = [p.resolve() for p in exclude]
    names: set[str] = set()
    for root in roots:
        for source in root.rglob("*.py"):
            if any(source.resolve().is_relative_to(e) for e in excluded):
                continue
            for node in ast.walk(parse_file(source)):
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and re.fullmatch(_NAME, node.value)
                ):
                    names.add(node.value)
    return frozenset(names)


def dev_cluster_roots() -> list[Path]:
    """The local default's code: its own distribution under operator/devcluster/."""
    return [PACKAGE.parent / "devcluster" / "agentrun_devcluster"]


def product_names() -> frozenset[str]:
    return settable_names(PACKAGE, exclude=dev_cluster_roots())


def dev_names() -> frozenset[str]:
    return settable_names(PACKAGE, *dev_cluster_roots())


def check_conditions_and_reasons(
    path: str, lines: list[Line], known: frozenset[str], pending: frozenset[str] = frozenset()
) -> list[Finding]:
    findings: list[Finding] = []
    for number, kind, name in named_conditions_and_reasons(path, lines):
        if name not in known and name not in pending:
            findings.append(Finding(path, number, kind, name, "no code sets it"))
    return findings


# ----------------------------------------------------------------------------------- manifests


def yaml_blocks(lines: list[Line]) -> Iterator[tuple[int, str]]:
    """(first line, text) of every ```yaml block."""
    start: int | None = None
    body: list[str] = []
    previous = 0
    for line in [*lines, Line(10**9, "", None)]:
        inside = line.fence is not None and line.fence.split()[:1] in (["yaml"], ["yml"])
        if inside and (start is None or line.number != previous + 1):
            if start is not None:
                yield start, "\n".join(body)
            start, body = line.number, []
        if inside:
            body.append(line.text)
            previous = line.number
        elif start is not None:
            yield start, "\n".join(body)
            start, body = None, []
    return


def _is_full_agentrun(doc: Any) -> bool:
    return (
        isinstance(doc, dict)
        and doc.get("kind") == "AgentRun"
        and str(doc.get("apiVersion", "")).startswith(GROUP + "/")
        and isinstance(doc.get("metadata"), dict)
        and isinstance(doc.get("spec"), dict)
    )


def check_manifests(path: str, lines: list[Line]) -> list[Finding]:
    findings: list[Finding] = []
    for start, text in yaml_blocks(lines):
        try:
            docs = list(yaml.safe_load_all(text))
        except yaml.YAMLError:
            continue  # a fragment with placeholders, not a manifest
        runs = [d for d in docs if _is_full_agentrun(d)]
        if not runs:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            manifest = Path(tmp) / "manifest.yaml"
            manifest.write_text(text, encoding="utf-8")
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                code = cli.main(["validate", str(manifest)])
        if code != 0:
            names = ", ".join(f"AgentRun/{r['metadata'].get('name')}" for r in runs)
            detail = " ".join(out.getvalue().replace(str(manifest), "manifest").split())
            findings.append(Finding(path, start, "manifest", names, f"agentrun validate: {detail}"))
    return findings


# ----------------------------------------------------------------------------------- all of it


def check_page(
    path: Path,
    text: str | None = None,
    root: Path = REPO,
    known_metrics: dict[str, tuple[str, ...]] | None = None,
    product: frozenset[str] | None = None,
    dev: frozenset[str] | None = None,
    pending_commands: frozenset[str] = frozenset(),
    pending_names: frozenset[str] = frozenset(),
) -> list[Finding]:
    """Every finding of one page; `pending_*` are names another branch is about to make real."""
    rel = path.relative_to(root).as_posix() if path.is_absolute() else path.as_posix()
    lines = lines_of(path.read_text(encoding="utf-8") if text is None else text)
    names = (dev if dev is not None else dev_names()) if rel in DEV_PAGES else product
    findings = [
        f for f in check_commands(rel, lines) if not (f.kind == "command" and f.name in pending_commands)
    ]
    findings += check_metrics(rel, lines, known_metrics if known_metrics is not None else metric_labels())
    findings += check_conditions_and_reasons(
        rel, lines, names if names is not None else product_names(), pending_names
    )
    findings += check_manifests(rel, lines)
    return findings
