"""The bounded reading of untrusted files: the shape of a JSON document counted without parsing it
must be the shape the parser then builds, whichever path (fast or exact) counted it."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from pytest_rlrollout.snapshot import untrusted

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# strings full of what the counting must not count: brackets, separators, quotes, backslashes
TRICKY = hs.text(alphabet='[]{},:"\\ ab\n\u00e9\U0001f600', max_size=6)
DOCS = hs.recursive(
    hs.none() | hs.booleans() | hs.integers() | hs.floats(allow_nan=False) | TRICKY,
    lambda inner: hs.lists(inner, max_size=4) | hs.dictionaries(TRICKY, inner, max_size=4),
    max_leaves=30,
)


def walked(doc: object, level: int = 1) -> tuple[int, int, int]:
    """(depth, objects, items) of a parsed document, as shape_of counts them."""
    if isinstance(doc, list):
        inner = [walked(x, level + 1) for x in doc]
        return (
            max([level, *(d for d, _, _ in inner)]),
            sum(o for _, o, _ in inner),
            1 + max(len(doc) - 1, 0) + sum(i for _, _, i in inner),
        )
    if isinstance(doc, dict):
        inner = [walked(x, level + 1) for x in doc.values()]
        return (
            max([level, *(d for d, _, _ in inner)]),
            1 + sum(o for _, o, _ in inner),
            1 + len(doc) + max(len(doc) - 1, 0) + sum(i for _, _, i in inner),
        )
    return level - 1, 0, 0


@SETTINGS
@given(DOCS, hs.booleans(), hs.booleans())
def test_the_counted_shape_is_the_parsed_shape(doc, ascii_only, indent):
    raw = json.dumps(doc, ensure_ascii=ascii_only, indent=2 if indent else None).encode()
    shape = untrusted.shape_of(raw)
    assert (shape.depth, shape.objects, shape.items) == walked(doc)
    assert shape.keys == (len(doc) if isinstance(doc, dict) else 0)
    assert untrusted.loads(raw) == doc


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"[" * 65 + b"]" * 65, "nested deeper than 64"),
        (b'["\\"' + b"]" * 70 + b'"' + b"[" * 70, "nested deeper than 64"),  # an escaped quote hides nothing
        (b"[" + b"0," * 2_200_000 + b"0]", "more than 2097152 JSON items"),
        (b'{"a": 1e999}', None),  # accepted as Python's json reads it, unless strict
        (b"\xef\xbb\xbf{}", "not valid JSON"),
        (b'{"a": "\xff"}', "not UTF-8"),
        (b"[" + b"9" * 5000 + b"]", "not valid JSON"),
    ],
)
def test_refusals_name_the_bound(raw, why):
    if why is None:
        untrusted.loads(raw)
        with pytest.raises(untrusted.BadJSON, match="out of range"):
            untrusted.loads(raw, strict=True)
        return
    with pytest.raises(untrusted.BadJSON, match=why):
        untrusted.loads(raw)


def test_brackets_inside_strings_do_not_nest():
    raw = json.dumps({"a": "[" * 1000, "b": ["{" * 1000]}).encode()
    assert untrusted.shape_of(raw) == untrusted.Shape(depth=2, objects=1, items=5, keys=2)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain name.safetensors", "plain name.safetensors"),
        ("a\nb", "a\\nb"),
        ("\x1b[31mred", "\\x1b[31mred"),
        ("bad\udcff.safetensors", "bad\\udcff.safetensors"),
        ("\u202egnp", "\\u202egnp"),
        ("\x9b31m", "\\x9b31m"),
        ("naïve 😀", "naïve 😀"),
    ],
)
def test_printable_escapes_what_a_terminal_would_act_on(text, shown):
    assert untrusted.printable(text) == shown
    assert untrusted.printable(text).isprintable()


def test_shown_cuts_values_to_size():
    assert untrusted.shown(["a", "b"]) == "['a', 'b']"
    long = untrusted.shown("x" * 100_000)
    assert len(long) < 400 and long.endswith("(100002 characters)")
    assert untrusted.shown(10**5000) == f"<an integer of {(10**5000).bit_length()} bits>"
