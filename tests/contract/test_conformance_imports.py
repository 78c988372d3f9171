"""The conformance modules read as the contract: they take from the suite only its documented
surface (its marks, its outcomes, `suite.testing`, and the fixtures), never the suite's own
plumbing, so that a test of one's own can be written from the same few names."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from pytest_rlrollout.suite import testing

CONFORMANCE = Path(__file__).resolve().parents[2] / "conformance"
MODULES = sorted(CONFORMANCE.glob("*.py"))
# the suite's documented modules: what a test may import from `pytest_rlrollout.suite`
DOCUMENTED = ("pytest_rlrollout.suite.marks", "pytest_rlrollout.suite.outcomes", "pytest_rlrollout.suite.testing")


def imports(path: Path) -> list[tuple[int, str, list[str], str]]:
    """Every `pytest_rlrollout` import of a file: (line, module, names, the statement)."""
    source = path.read_text()
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pytest_rlrollout"):
            out.append((node.lineno, node.module, [a.name for a in node.names], ast.get_source_segment(source, node)))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("pytest_rlrollout"):
                    out.append((node.lineno, alias.name, [], ast.get_source_segment(source, node)))
    return out


def wrong(module: str, names: list[str]) -> str | None:
    """Why an import of `names` from `module` reaches past the documented surface (None: it does not)."""
    private = [n for n in [*module.split("."), *names] if n.startswith("_")]
    if private:
        return f"private name(s) {private}"
    if module == "pytest_rlrollout" and "suite" in names:
        return "the suite package itself; import from its documented modules"
    if module == "pytest_rlrollout.suite" or module.startswith("pytest_rlrollout.suite."):
        if module not in DOCUMENTED:
            return f"{module} is the suite's own; import from {', '.join(DOCUMENTED)}"
        public = importlib.import_module(module).__all__
        beyond = [n for n in names if n not in public]
        if not names or beyond:
            return f"{beyond or 'the module itself'} not in {module}.__all__"
    return None


def test_the_conformance_modules_are_found():
    assert len(MODULES) > 10, MODULES


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_conformance_imports_only_the_documented_surface(path):
    found = [
        f"{path.relative_to(CONFORMANCE.parent)}:{line}: {statement} ({why})"
        for line, module, names, statement in imports(path)
        if (why := wrong(module, names)) is not None
    ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_conformance_requests_no_private_fixture(path):
    """A fixture of the suite a test needs is a documented one (a module's own fixtures are its own)."""
    tree = ast.parse(path.read_text())
    found = [
        f"{path.relative_to(CONFORMANCE.parent)}:{fn.lineno}: {fn.name} requests {arg.arg}"
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef) and fn.name.startswith("test_")
        for arg in fn.args.args
        if arg.arg.startswith("_")
    ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("module", "names", "why"),
    [
        ("pytest_rlrollout.suite.observe", ["with_stream"], "the suite's own"),
        ("pytest_rlrollout.suite.swaps", ["completed"], "the suite's own"),
        ("pytest_rlrollout.suite.outcomes", ["outcome_of"], "not in pytest_rlrollout.suite.outcomes.__all__"),
        ("pytest_rlrollout.suite.testing", ["_private"], "private name"),
        ("pytest_rlrollout.remote._internal", ["x"], "private name"),
        ("pytest_rlrollout.suite", ["testing"], "the suite's own"),
        ("pytest_rlrollout", ["suite"], "the suite package itself"),
    ],
)
def test_an_import_past_the_surface_is_named(module, names, why):
    assert why in (wrong(module, names) or ""), wrong(module, names)


@pytest.mark.parametrize(
    ("module", "names"),
    [
        ("pytest_rlrollout.suite.testing", ["with_stream", "CACHED_PREFIX"]),
        ("pytest_rlrollout.suite.marks", ["clause", "requires"]),
        ("pytest_rlrollout.runs.plan", ["served"]),
    ],
)
def test_an_import_of_the_surface_passes(module, names):
    assert wrong(module, names) is None


def test_a_wrong_import_is_reported_with_its_file_and_line(tmp_path):
    path = tmp_path / "test_x.py"
    path.write_text("import pytest\n\nfrom pytest_rlrollout.suite.shared import part\n")
    assert imports(path) == [
        (3, "pytest_rlrollout.suite.shared", ["part"], "from pytest_rlrollout.suite.shared import part")
    ]


@pytest.mark.parametrize("module", DOCUMENTED)
def test_every_documented_name_is_documented(module):
    """Every name of the documented surface is in its `__all__` and says what it is: a function or
    class by its docstring; `suite.testing` names each in its module docstring too."""
    m = importlib.import_module(module)
    for name in m.__all__:
        value = getattr(m, name)  # (an AttributeError names a name __all__ lists and the module lacks)
        if callable(value) and not isinstance(value, pytest.MarkDecorator):
            doc = (value.__doc__ or "").strip()
            # (a dataclass without a docstring of its own gets its signature as one)
            assert doc and not doc.startswith(f"{name}("), f"{module}.{name} has no docstring"
    if m is testing:
        undescribed = [n for n in m.__all__ if f"`{n}`" not in m.__doc__]
        assert not undescribed, f"suite.testing's docstring does not describe {undescribed}"
