"""The catalogue is complete, consistent with SPEC.md, and every SNAP clause is checked and breakable."""

import ast
import json
import re
from pathlib import Path

import jsonschema
import pytest

from pytest_rlrollout import broken, validator
from pytest_rlrollout.catalogue import catalogue, data_dir, schema

from .conftest import SPEC_MD


def spec_clauses() -> dict[str, str]:
    if not SPEC_MD.exists():
        pytest.skip(f"{SPEC_MD} is not beside this checkout")
    rows = re.findall(r"^\| ([A-Z0-9]+(?:-[A-Z0-9]+)+) \| (MUST|SHOULD|MAY) \|", SPEC_MD.read_text(), re.M)
    return dict(rows)


def test_catalogue_has_every_spec_clause_at_its_level():
    spec = spec_clauses()
    assert len(spec) == 80
    cat = catalogue()
    for cid, level in spec.items():
        assert cid in cat, f"{cid} is in SPEC.md but not in schemas/clauses.json"
        assert cat[cid].level == level, cid


def test_project_clauses_only_refine_spec_clauses():
    spec = spec_clauses()
    for c in catalogue():
        if c.id not in spec:
            assert c.refines in spec, f"{c.id} is neither a SPEC.md clause nor a refinement of one"
            assert c.id.startswith(c.refines), c.id


def test_catalogue_and_schemas_are_valid_json_schema_documents():
    for path in sorted(data_dir("schemas").glob("*.schema.json")):
        jsonschema.Draft202012Validator.check_schema(json.loads(path.read_text()))
    jsonschema.validate(json.loads((data_dir("schemas") / "clauses.json").read_text()), schema("clauses"))


def test_every_x_clause_in_the_schemas_is_a_catalogue_clause():
    cat = catalogue()
    for path in sorted(data_dir("schemas").glob("*.schema.json")):
        for cid in re.findall(r'"x-clause": "([^"]+)"', path.read_text()):
            assert cid in cat, f"{path.name} tags an unknown clause {cid}"


def test_every_snap_clause_has_one_check_and_one_broken_variant():
    snap = {c.id for c in catalogue().area("SNAP")}
    assert set(validator.CHECKS) == snap
    missing = snap - set(broken.BREAKERS)
    assert not missing, f"SNAP clauses without a broken variant: {sorted(missing)}"


def test_every_snap_clause_has_exactly_one_conformance_test():
    tree = ast.parse((data_dir("conformance") / "test_snap.py").read_text())
    tagged: dict[str, list[str]] = {}
    for fn in [n for n in tree.body if isinstance(n, ast.FunctionDef)]:
        for dec in fn.decorator_list:
            if isinstance(dec, ast.Call) and getattr(dec.func, "id", "") == "clause":
                for arg in dec.args:
                    tagged.setdefault(arg.value, []).append(fn.name)
                # the body asks for the clause it is tagged with
                assert f"expect({dec.args[0].value!r})" in ast.unparse(fn), fn.name
    snap = {c.id for c in catalogue().area("SNAP")}
    assert set(tagged) == snap
    assert all(len(v) == 1 for v in tagged.values()), tagged


def test_unknown_clause_id_is_refused():
    with pytest.raises(KeyError, match="unknown clause"):
        catalogue()["SNAP-NOPE-9"]
    with pytest.raises(KeyError):
        validator.check("SNAP-NOPE-9")(lambda s: [])


def test_catalogue_is_shipped_where_the_package_finds_it():
    assert Path(data_dir("schemas"), "clauses.json").is_file()
