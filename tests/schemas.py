"""Hypothesis strategies of hostile JSON schemas (any nesting of arrays, objects, anyOf, allOf,
``$ref`` and literals, with huge counts, keys, numbers and strings), shared by the unit test of
schema instances (tests/unit/core/test_schema_instance.py) and the hostile-input integration
test (tests/integration/test_hostile_input.py)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

KEYS = st.sampled_from(["a", "path", "command", "k" * 300, "\x00"])
NUMBERS = st.one_of(
    st.integers(-(10**5), 10**5),
    st.integers(10**300, 10**400),
    st.floats(allow_nan=True, allow_infinity=True),
)
COUNTS = st.one_of(st.integers(0, 50), st.integers(1000, 10**12))
LITERALS = st.recursive(
    st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=5), st.just("y" * 20_000)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=8,
)


def _schemas(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.fixed_dictionaries(
            {"type": st.just("array"), "items": inner}, optional={"minItems": COUNTS}
        ),
        st.fixed_dictionaries(
            {"type": st.just("object"), "properties": st.dictionaries(KEYS, inner, max_size=3)},
            optional={"required": st.lists(KEYS, max_size=3)},
        ),
        st.fixed_dictionaries({"anyOf": st.lists(inner, min_size=1, max_size=3)}),
        st.fixed_dictionaries({"allOf": st.lists(inner, min_size=1, max_size=3)}),
        st.fixed_dictionaries({"$ref": st.sampled_from(["#", "#/$defs/x", "#/nowhere"])}),
    )


LEAVES = st.one_of(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["string", "integer", "number", "boolean", "null"])},
        optional={
            "minLength": COUNTS,
            "maxLength": st.integers(-5, 50),
            "minimum": NUMBERS,
            "maximum": NUMBERS,
            "exclusiveMinimum": NUMBERS,
        },
    ),
    st.fixed_dictionaries({"const": LITERALS}),
    st.fixed_dictionaries({"default": LITERALS}),
    st.fixed_dictionaries({"enum": st.lists(LITERALS, min_size=1, max_size=2)}),
    st.just({}),
    st.just(True),
)
SCHEMAS = st.recursive(LEAVES, _schemas, max_leaves=12)
