"""The catalogue is well formed, every SNAP clause is checked and breakable, and every clause
can be judged by a conformance test."""

import ast
import json
import re

import jsonschema
import pytest

from pytest_rlrollout.contract import catalogue
from pytest_rlrollout.contract.catalogue import DATA, load_json
from pytest_rlrollout.snapshot import broken
from pytest_rlrollout.snapshot import validate as validator
from pytest_rlrollout.suite.options import CONFORMANCE


def test_catalogue_and_schemas_are_valid_json_schema_documents():
    for path in sorted(DATA.glob("*.schema.json")):
        jsonschema.Draft202012Validator.check_schema(json.loads(path.read_text()))
    jsonschema.validate(load_json("clauses.json"), load_json("clauses.schema.json"))


def test_refinements_refine_a_clause_of_the_catalogue():
    cat = catalogue()
    for c in cat:
        if c.refines is not None:
            assert c.refines in cat and cat[c.refines].refines is None, c.id
            assert c.id.startswith(c.refines) and c.area == cat[c.refines].area, c.id


def test_every_area_is_described_and_every_source_named():
    cat = catalogue()
    assert {c.area for c in cat} == set(cat.areas)
    assert {s for c in cat for s in c.source} <= set(cat.sources)


def test_every_x_clause_in_the_schemas_is_a_catalogue_clause():
    cat = catalogue()
    for path in sorted(DATA.glob("*.schema.json")):
        for cid in re.findall(r'"x-clause": "([^"]+)"', path.read_text()):
            assert cid in cat, f"{path.name} tags an unknown clause {cid}"


def test_every_snap_clause_has_one_check_and_one_broken_variant():
    snap = {c.id for c in catalogue().area("SNAP")}
    assert set(validator.CHECKS) == snap
    assert set(broken.BREAKERS) == snap


def test_every_snap_clause_has_exactly_one_conformance_test():
    tree = ast.parse((CONFORMANCE / "test_snap.py").read_text())
    tagged: dict[str, list[str]] = {}
    for fn in [n for n in tree.body if isinstance(n, ast.FunctionDef)]:
        for dec in fn.decorator_list:
            if isinstance(dec, ast.Call) and getattr(dec.func, "id", "") == "clause":
                for arg in dec.args:
                    tagged.setdefault(arg.value, []).append(fn.name)
                # the body asks for the clause it is tagged with
                assert f"expect({dec.args[0].value!r}, rl_observe)" in ast.unparse(fn), fn.name
    snap = {c.id for c in catalogue().area("SNAP")}
    assert set(tagged) == snap
    assert all(len(v) == 1 for v in tagged.values()), tagged


def test_every_clause_but_num_has_a_conformance_test():
    from pytest_rlrollout.suite.docs import judging_tests

    judged = judging_tests()
    assert {c.id for c in catalogue() if c.area != "NUM"} <= set(judged)


def test_unknown_clause_id_is_refused():
    with pytest.raises(KeyError, match="unknown clause"):
        catalogue()["SNAP-NOPE-9"]
    with pytest.raises(KeyError):
        validator.core.check("SNAP-NOPE-9")(lambda s: [])
