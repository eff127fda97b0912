"""Hostlist expansion/compression and name/job-id validation (pure)."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm.errors import HostlistError, InvalidJobId, InvalidNodeName, SlurmUsageError
from slurm.hostlist import (
    compress,
    expand,
    sort_unique,
    validate_job_id,
    validate_node_name,
    validate_step_id,
)
from supervisor.errors import exit_code_of


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("node[01-03,7],gpu-a[1-2]-x", ["node01", "node02", "node03", "node7", "gpu-a1-x", "gpu-a2-x"]),
        ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),  # first group varies slowest, like Slurm
        ("node[1-10]", [f"node{i}" for i in range(1, 11)]),
        ("node[01-10]", [f"node{i:02d}" for i in range(1, 11)]),
        ("a[1-02]", ["a1", "a2"]),  # the low bound sets the width, as in Slurm
        ("a[001-10]", [f"a{i:03d}" for i in range(1, 11)]),
        ("a[1-2],b", ["a1", "a2", "b"]),
        ("a,,b", ["a", "b"]),
        ("a,a", ["a", "a"]),  # expand keeps duplicates, like `scontrol show hostnames`
        ("[1-2]", ["1", "2"]),
        ("a.b[1-2],a_b7", ["a.b1", "a.b2", "a_b7"]),
        ("  node1 ", ["node1"]),
        ("", []),
    ],
)
def test_expand_examples(expr: str, names: list[str]) -> None:
    assert expand(expr) == names


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        ("a[1-[2-3]]", "nested"),
        ("a[3-1]", "backwards"),
        ("a[]", "bad range"),
        ("a[1-2,]", "bad range"),
        ("a[x]", "bad range"),
        ("a[1", "never closed"),
        ("a1]", "without '['"),
        ("-rf", "invalid node name"),
        ("a;b", "invalid node name"),
        ("a b", "invalid node name"),
        ("n$(id)", "invalid node name"),
        ("n[1-99999999]", "more than"),
    ],
)
def test_expand_rejects_bad_expressions_with_a_clear_error(expr: str, problem: str) -> None:
    with pytest.raises(HostlistError) as info:
        expand(expr)
    assert problem in info.value.problem
    assert isinstance(info.value, SlurmUsageError) and exit_code_of(info.value) == 2
    assert "\n" not in info.value.one_line()


@pytest.mark.parametrize(
    ("names", "expr"),
    [
        (["node3", "node1", "node2", "node7"], "node[1-3,7]"),
        (["node10", "node9"], "node[9-10]"),
        (["node09", "node10"], "node[09-10]"),
        (["n01", "n1"], "n[1,01]"),  # different names: both kept, unpadded first
        (["b1", "a"], "a,b1"),
        (["node", "node1", "nodeb"], "node,node1,nodeb"),
        (["r1n01", "r1n02", "r2n01"], "r1n[01-02],r2n01"),
        (["gpu-a1-x"], "gpu-a1-x"),
        (["node1", "node1"], "node1"),
        ([], ""),
    ],
)
def test_compress_examples(names: list[str], expr: str) -> None:
    assert compress(names) == expr


def test_compress_validates_names() -> None:
    with pytest.raises(InvalidNodeName):
        compress(["node1", "--all"])


@pytest.mark.parametrize("name", ["node1", "gpu-a1-x", "n.example", "a_b", "1", "x" * 64])
def test_valid_node_names(name: str) -> None:
    assert validate_node_name(name) == name


@pytest.mark.parametrize("name", ["", "-x", "a b", "a;b", "a/b", "a[1]", "x" * 65, "nöde", "a\nb", "$HOME"])
def test_invalid_node_names(name: str) -> None:
    with pytest.raises(InvalidNodeName):
        validate_node_name(name)


@pytest.mark.parametrize(("value", "canonical"), [("123", "123"), ("123_4", "123_4"), ("123+1", "123+1"), (42, "42")])
def test_valid_job_ids(value: str | int, canonical: str) -> None:
    assert validate_job_id(value) == canonical


@pytest.mark.parametrize("value", ["", "abc", "12a", "-1", "123_", "123+", "1_2_3", "0", "012", "1 2", "--all",
                                   "123.0", 0, -5, True, None, "1" * 11])  # fmt: skip
def test_invalid_job_ids(value: object) -> None:
    with pytest.raises(InvalidJobId):
        validate_job_id(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["123.0", "123.batch", "123.extern", "123_4.1", "123+1.2"])
def test_valid_step_ids(value: str) -> None:
    assert validate_step_id(value) == value


@pytest.mark.parametrize("value", ["123", "123.", ".0", "123.0.1", "123.foo", "0.1", "-1.0", "123.0;x"])
def test_invalid_step_ids(value: str) -> None:
    with pytest.raises(InvalidJobId):
        validate_step_id(value)


# ------------------------------------------------------------------------------------------- properties

_prefix = st.text(alphabet="abcxyz-._", min_size=1, max_size=4).filter(lambda p: p[0] not in "-._")
_digits = st.integers(min_value=0, max_value=300).flatmap(
    lambda n: st.sampled_from([str(n), f"{n:02d}", f"{n:03d}"])
)
_name = st.one_of(st.builds(lambda p, d: p + d, _prefix, _digits), _prefix)
_names = st.lists(_name, max_size=40)


@settings(max_examples=300, deadline=None)
@given(_names)
def test_expand_of_compress_is_sorted_unique(names: list[str]) -> None:
    assert expand(compress(names)) == sort_unique(names)
    assert len(set(names)) == len(sort_unique(names))


@settings(max_examples=300, deadline=None)
@given(_names)
def test_compress_of_expand_round_trips(names: list[str]) -> None:
    expr = compress(names)
    assert compress(expand(expr)) == expr
    assert expand(compress(expand(expr))) == expand(expr)


_range = st.tuples(st.integers(0, 120), st.integers(0, 15), st.sampled_from([1, 2, 3]))


@settings(max_examples=200, deadline=None)
@given(st.lists(_range, min_size=1, max_size=4), _prefix, st.sampled_from(["", "-x"]))
def test_expand_matches_a_direct_model_of_bracket_ranges(ranges: list[tuple[int, int, int]], prefix: str,
                                                          suffix: str) -> None:
    body = ",".join(f"{lo:0{w}d}-{lo + span:0{w}d}" if span else f"{lo:0{w}d}" for lo, span, w in ranges)
    expected = [f"{prefix}{n:0{w}d}{suffix}" for lo, span, w in ranges for n in range(lo, lo + span + 1)]
    assert expand(f"{prefix}[{body}]{suffix}") == expected


@pytest.mark.parametrize("expr", [
    "a" * 6000 + "[0-1048575]",  # issue 22: a 6 KB prefix times 2^20 hosts reached 2 GiB before the length check
    "n[0-1048575],m[0-1]",  # over the cap only together
    "n[0-1023][0-1023][0-3]",  # the product of the groups
    "n[" + "9" * 5000 + "]",  # int() of a 5,000-digit number is a ValueError in Python, never a HostlistError
    "-x[1-2]", "n[1-2]-" + "y" * 70,
])  # fmt: skip
def test_a_hostile_hostlist_is_refused_before_anything_is_built(expr: str) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(HostlistError):
            expand(expr)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # refused from its parse (under 1 MiB), never from a million names built first


def test_a_caller_may_cap_the_expansion_lower() -> None:
    assert expand("n[1-4]", limit=4) == ["n1", "n2", "n3", "n4"]
    with pytest.raises(HostlistError, match="more than 3 hosts"):
        expand("n[1-4]", limit=3)
    with pytest.raises(HostlistError, match="more than 3 hosts"):
        expand("n[1-2],m[1-2]", limit=3)
