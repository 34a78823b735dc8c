"""The runner contract's `{{ dotted.path }}` templates render as the original controller's do."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from agentrun_operator.jobs.template import lookup, render, unresolved_paths

CONTEXT = {
    "agentRun": {"name": "fix-1", "uid": "u-1", "namespace": "team"},
    "agent": {"name": "codex", "config": {"model": "o3", "depth": 2, "tools": ["git", "sh"]}, "env": []},
    "parameters": {"repository": "acme/app", "empty": ""},
    "inputs": {"repository": "acme/app"},
    "vcs": {},
    "flag": True,
    "ratio": 2.0,
    "half": 0.5,
    "none": None,
}


def test_a_string_renders_as_itself_whatever_the_whitespace() -> None:
    for template in (
        "{{agentRun.name}}",
        "{{ agentRun.name }}",
        "{{  agentRun . name  }}",
        "{{\tagentRun.name\n}}",
    ):
        assert render(template, CONTEXT) == "fix-1", template


def test_unknown_paths_lists_strings_and_null_render_empty() -> None:
    assert render("[{{ agentRun.missing }}]", CONTEXT) == "[]"
    assert render("[{{ nothing.at.all }}]", CONTEXT) == "[]"
    assert render("[{{ agent.config.tools.0 }}]", CONTEXT) == "[]"  # no indexing into lists
    assert render("[{{ agentRun.name.length }}]", CONTEXT) == "[]"  # nor into strings
    assert render("[{{ none }}]", CONTEXT) == "[]"
    assert render("[{{ parameters.empty }}]", CONTEXT) == "[]"


def test_other_values_render_as_compact_json() -> None:
    assert render("{{ agent.config }}", CONTEXT) == '{"model":"o3","depth":2,"tools":["git","sh"]}'
    assert render("{{ agent.config.tools }}", CONTEXT) == '["git","sh"]'
    assert render("{{ agent.config.depth }}", CONTEXT) == "2"
    assert render("{{ flag }}", CONTEXT) == "true"
    assert render("{{ ratio }}", CONTEXT) == "2"  # a JavaScript number
    assert render("{{ half }}", CONTEXT) == "0.5"
    assert render("{{ vcs }}", CONTEXT) == "{}"


def test_empty_parts_are_skipped_and_a_blank_path_is_the_whole_context() -> None:
    assert render("{{ agentRun..name }}", CONTEXT) == "fix-1"
    assert render("{{ .agentRun.name. }}", CONTEXT) == "fix-1"
    assert json.loads(render("{{ }}", {"a": 1})) == {"a": 1}
    assert render("{{}}", CONTEXT) == "{{}}"  # not a placeholder: the path needs a character


def test_text_around_and_between_placeholders_is_kept() -> None:
    template = "--repo={{ parameters.repository }} --run {{agentRun.namespace}}/{{agentRun.name}} }} {{"
    assert render(template, CONTEXT) == "--repo=acme/app --run team/fix-1 }} {{"


def test_a_rendered_value_is_not_rendered_again() -> None:
    assert render("{{ a }}", {"a": "{{ b }}", "b": "no"}) == "{{ b }}"


def test_unresolved_paths_are_the_holes() -> None:
    template = "{{ agentRun.name }} {{ parameters.head }} {{ none }} {{ nothing }}"
    assert list(unresolved_paths(template, CONTEXT)) == ["parameters.head", "none", "nothing"]


_KEY = st.text(alphabet="abcdefghij_-", min_size=1, max_size=6)
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet="xyz {}.", max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEY, inner, max_size=3),
    max_leaves=8,
)


@given(st.text(alphabet=st.characters(blacklist_characters="{"), max_size=40), st.dictionaries(_KEY, _VALUES))
def test_text_without_placeholders_is_unchanged(text: str, context: dict[str, object]) -> None:
    assert render(text, context) == text


@given(st.dictionaries(_KEY, _VALUES, min_size=1), st.data())
def test_a_top_level_key_renders_as_its_value(context: dict[str, object], data: st.DataObject) -> None:
    key = data.draw(st.sampled_from(sorted(context)))
    value = context[key]
    rendered = render(f"<{{{{ {key} }}}}>", context)
    if value is None:
        assert rendered == "<>"
    elif isinstance(value, str):
        assert rendered == f"<{value}>"
    else:
        assert json.loads(rendered[1:-1]) == value


@given(st.lists(_KEY, min_size=1, max_size=4), _VALUES)
def test_a_nested_path_finds_what_was_put_there(parts: list[str], value: object) -> None:
    context: object = value
    for part in reversed(parts):
        context = {part: context}
    assert isinstance(context, dict)
    assert lookup(context, " . ".join(parts)) == value
