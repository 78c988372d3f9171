"""Each conformance test reads as the contract: its docstring is its clause's rule, word for word
(as Gateway API's conformance tests carry their Description), and what it needs of the deployment
is said one way, `suite.marks.requires`. A test whose rule changed in the catalogue, or a new test
without its rule, fails here, naming it."""

import ast

from pytest_rlrollout.contract import catalogue
from pytest_rlrollout.suite.options import CONFORMANCE


def clause_tests():
    """(module, test, clause ID, docstring) of every test marked with one clause."""
    for path in sorted(CONFORMANCE.glob("test_*.py")):
        for f in ast.parse(path.read_text()).body:
            if not (isinstance(f, ast.FunctionDef) and f.name.startswith("test_")):
                continue
            ids = [
                a.value
                for d in f.decorator_list
                if isinstance(d, ast.Call) and getattr(d.func, "id", None) == "clause"
                for a in d.args
                if isinstance(a, ast.Constant)
            ]
            if len(ids) == 1:
                yield path.name, f.name, ids[0], ast.get_docstring(f)


def words(text: str | None) -> str:
    return " ".join((text or "").split())


def test_every_conformance_test_says_its_clauses_rule():
    rules = {c.id: c.rule for c in catalogue()}
    found = list(clause_tests())
    wrong = [
        f"{module}::{test} ({cid}): {words(doc)[:80]!r}"
        for module, test, cid, doc in found
        if words(doc) != words(rules[cid])
    ]
    assert len(found) >= 100 and not wrong, "docstrings that are not their clause's rule:\n" + "\n".join(wrong)


def test_the_capability_gate_is_spelt_one_way():
    """`requires(...)` from suite.marks, never the mark it stands for spelt out (or renamed)."""
    spelt = [
        f"{p.name}:{n}"
        for p in sorted(CONFORMANCE.glob("test_*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if "rl_requires" in line
    ]
    assert not spelt, f"the capability gate spelt out: {spelt}"
