"""The engine registry is the one list of engines: no product module spells an engine's name but
its own and the registry, and everything that lists engines (the catalogue, the drivers, the
reference's dialects, the commands' choices) agrees with it."""

import ast
import re
from pathlib import Path

import pytest

import pytest_rlrollout
from pytest_rlrollout.contract.capabilities import CAPABILITIES
from pytest_rlrollout.contract.catalogue import catalogue, load_json
from pytest_rlrollout.engines import DEFAULT, DIALECTS, ENGINES, FALLBACK, SPECS, load, presumed, spec

PACKAGE = Path(pytest_rlrollout.__file__).parent
# a name inside a longer string that would be a second list: an option naming one engine
SPELT_OPTION = re.compile(r"--(?:rl-)?engine[= ](" + "|".join(ENGINES) + r")\b")


def spellings(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every string constant in `path` that is an engine's name, or that names one
    as an option's value; docstrings are prose and left out."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if node.value in ENGINES:
                found.append((node.lineno, node.value))
            found += [(node.lineno, m.group(1)) for m in SPELT_OPTION.finditer(node.value)]
    return found


def test_no_module_spells_an_engine_but_its_own_and_the_registry():
    """Adding an engine touches its module, not a list somewhere else: a name spelt outside
    engines/<name>.py (a hyphen in the name is an underscore in the module's) and
    engines/registry.py fails here, with where."""
    strays = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for line, name in spellings(path):
            if rel not in ("engines/registry.py", f"engines/{name.replace('-', '_')}.py"):
                strays.append(f"{rel}:{line}: {name!r}")
    assert not strays, "engine names spelt outside their module and the registry:\n" + "\n".join(strays)


def test_the_guard_finds_a_spelling(tmp_path):
    """The scan above can fail: a literal, an option inside a message, never a docstring."""
    probe = tmp_path / "probe.py"
    probe.write_text(f'"""About {ENGINES[1]}."""\nX = "{ENGINES[1]}"\nY = f"pass --rl-engine={ENGINES[2]} here"\n')
    assert spellings(probe) == [(2, ENGINES[1]), (3, ENGINES[2])]


def test_the_catalogue_and_its_schema_describe_the_registered_engines():
    doc = load_json("clauses.json")
    assert tuple(doc["engines"]) == ENGINES
    assert set(catalogue().engines) == set(ENGINES)
    schema = (PACKAGE.parent / "schemas" / "clauses.schema.json").read_text()
    assert f'"{ENGINES[1]}"' not in schema  # no second list: the catalogue checks binding keys against the registry
    for c in catalogue():
        assert set(c.bindings) <= set(ENGINES), c.id


def test_every_engine_resolves_its_driver_dialect_and_capabilities():
    for s in SPECS:
        driver = s.driver_class()
        assert driver.engine == s.name, s.name
        if s.dialect is not None:
            assert callable(load(s.dialect.app)), s.name
            s.dialect.serving.format(transition="ASYNC")
        unknown = (set(s.requires) | set(s.flags)) - set(CAPABILITIES)
        assert not unknown, f"{s.name} names capabilities the vocabulary lacks: {unknown}"
        assert not s.self_hosted or s.async_only, f"{s.name}: a self-hosted engine swaps ASYNC only; say why"
    assert spec(DEFAULT).dialect is not None and spec(FALLBACK).dialect is None
    assert tuple(s.name for s in SPECS if s.dialect) == DIALECTS


def test_an_unknown_engine_is_refused_naming_the_known():
    with pytest.raises(KeyError, match="known: " + ", ".join(ENGINES)):
        spec("tgi")


def test_the_names_given_point_to_an_engine_before_the_preflight():
    """What a run presumes before asking anything: a control plane or a UUID names the engine
    that has one, a deployment path the engine named by paths, a bare URL the fallback."""
    by_path = next(s.name for s in SPECS if s.names == "path")
    controlled = next(s.name for s in SPECS if s.control_plane)
    assert presumed(deployment="accounts/a/deployments/d") == by_path
    assert presumed(deployment="x", control_url="http://control") == controlled
    assert presumed(deployment="3f2b8c1e-6d0a-4e6b-9a55-0c1d2e3f4a5b", uuid=True) == controlled
    assert presumed(deployment=None) == FALLBACK
