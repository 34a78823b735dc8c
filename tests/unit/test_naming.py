"""Deterministic Job names (naming.py): flat names unchanged, nested names by address, ≤ 63 chars."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from agentrun_operator import naming

_DNS = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def test_a_top_level_step_keeps_the_name_of_earlier_versions() -> None:
    assert naming.job_name("run", 1, 2, 3) == "run-step-1-iter-2-attempt-3"
    assert naming.job_name("run", 1, 2, 3, ()) == "run-step-1-iter-2-attempt-3"
    # the cut form of the previous version, pinned: a restarted operator must find these Jobs
    assert naming.job_name("r" * 60, 2, 1, 1) == "r" * 30 + "-28cc67e9-step-2-iter-1-attempt-1"


def test_a_nested_step_is_named_by_its_address() -> None:
    assert naming.step_address(("2i4",), 3) == "2i4-3"
    assert naming.job_name("run", 3, 1, 1, ("2i4",)) == "run-step-2i4-3-iter-1-attempt-1"
    assert naming.job_name("run", 1, 2, 1, ("1i3", "2c0")) == "run-step-1i3-2c0-1-iter-2-attempt-1"


segments = st.lists(
    st.tuples(st.integers(1, 50), st.sampled_from("ic"), st.integers(0, 1000)).map(
        lambda t: f"{t[0]}{t[1]}{t[2]}"
    ),
    max_size=10,
)


@given(
    run=st.from_regex(r"[a-z][a-z0-9-]{0,61}[a-z0-9]", fullmatch=True),
    ancestors=segments,
    index=st.integers(1, 50),
    iteration=st.integers(1, 1000),
    attempt=st.integers(1, 101),
)
def test_names_are_valid_short_and_deterministic(
    run: str, ancestors: list[str], index: int, iteration: int, attempt: int
) -> None:
    name = naming.job_name(run, index, iteration, attempt, tuple(ancestors))
    assert len(name) <= 63 and _DNS.match(name), name
    assert name == naming.job_name(run, index, iteration, attempt, tuple(ancestors))
    assert name.endswith(f"-iter-{iteration}-attempt-{attempt}")


def test_cut_names_of_different_addresses_differ() -> None:
    run = "a-rather-long-agent-run-name-for-the-nightly-refactor"
    names = {
        naming.job_name(run, c, 1, 1, (f"{i}i{k}",))
        for i in range(1, 4)
        for k in range(1, 30)
        for c in (1, 2)
    }
    assert len(names) == 3 * 29 * 2
    deep = tuple(f"{i}i{900 + i}" for i in range(1, 11))
    assert len({naming.job_name(run, 1, k, 1, deep) for k in range(1, 200)}) == 199


def test_the_tree_path_drops_the_iterations_of_the_ancestors() -> None:
    assert naming.tree_path("develop/iteration 2/review") == "develop/review"
    assert naming.tree_path("modules/iteration 3/refine") == "modules/refine"
    assert naming.tree_path("a/iteration 1/b/iteration 10/c") == "a/b/c"
    assert naming.tree_path("route/fix") == "route/fix"
    assert naming.tree_path("implement") == "implement"
