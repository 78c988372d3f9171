"""The docs site's generated pages are what their sources make of them now, as committed:
scripts/reference_pages.py writes them, and says which are stale."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "reference_pages.py"

pytestmark = pytest.mark.xdist_group("reference_pages")  # one worker makes the pages once for all its tests


def _script() -> ModuleType:
    # scripts/ is a folder of commands, not a package: the script is loaded from its file
    spec = importlib.util.spec_from_file_location("reference_pages", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses and pytest look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def script() -> ModuleType:
    return _script()


@pytest.fixture(scope="module")
def pages(script: ModuleType) -> dict[Path, str]:
    return script.pages()


def test_every_generated_page_is_committed_in_step(script, pages):
    stale = [str(p.relative_to(script.ROOT)) for p in script.stale(pages)]
    assert not stale, f"stale: {', '.join(stale)}; regenerate every page with {script.COMMAND}"


def test_the_five_pages(script, pages):
    docs = script.DOCS
    assert {p.relative_to(docs).as_posix() for p in pages if p.suffix == ".md"} == {
        "contract.md",
        "engines.md",
        "reference/settings.md",
        "reference/commands.md",
        "reference/fixtures.md",
    }


def test_check_names_each_stale_page_and_the_command(script, tmp_path, monkeypatch, capsys):
    kept, changed, missing = (tmp_path / "docs" / name for name in ("kept.md", "changed.md", "missing.md"))
    kept.parent.mkdir()
    kept.write_text("as generated\n")
    changed.write_text("edited by hand\n")
    monkeypatch.setattr(script, "ROOT", tmp_path)
    monkeypatch.setattr(script, "pages", lambda: {p: "as generated\n" for p in (kept, changed, missing)})
    assert script.main(["--check"]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"docs/{name} is stale: python scripts/reference_pages.py" for name in ("changed.md", "missing.md")
    ]
    assert changed.read_text() == "edited by hand\n" and not missing.exists()  # --check writes nothing
    assert script.main([]) == 0
    assert {p.read_text() for p in (kept, changed, missing)} == {"as generated\n"}
    assert script.main(["--check"]) == 0


def test_settings_page_has_every_key_and_option(script, pages):
    from pytest_rlrollout.suite.settings import SETTINGS

    page = pages[script.REFERENCE / "settings.md"]
    for s in SETTINGS:
        assert f"\n### `{s.key}`\n" in page, s.key
        assert s.option is None or f"[`{s.option}`](#{s.key})" in page, s.option
        assert s.ini or "Option only" in page.split(f"### `{s.key}`")[1].split("###")[0], s.key


def test_commands_page_has_every_command_and_its_arguments(script, pages):
    from pytest_rlrollout.cli import parser
    from pytest_rlrollout.cli.soak import OPTIONS

    page = pages[script.REFERENCE / "commands.md"]
    [commands] = [a for a in parser()._actions if a.choices and a.dest == "command"]
    for name in commands.choices:
        assert f"\n## `rlrollout {name}`\n" in page, name
    validate = page.split("## `rlrollout validate`")[1].split("\n## ")[0]
    assert "- `--level`: fail on MUST findings only, or on SHOULD too (one of `must`, `should`" in validate
    soak = page.split("## `rlrollout soak`")[1].split("\n## ")[0]
    assert all(f"- `{flag}`: " in soak for flag in OPTIONS), "the soak's own options come from its own parser"


def test_fixtures_page_is_the_plugins_fixtures_as_pytest_finds_them(script, pages):
    page = pages[script.REFERENCE / "fixtures.md"]
    for name, scope in (("rl_deployment", "session"), ("rl_session", "function"), ("rl_test", "function")):
        assert f"## `{name}`\n\nScope: {scope}\n" in page, name
    assert "_rl_snapshots" not in page  # the plugin's plumbing is not for tests of one's own


def test_a_fixture_without_a_docstring_stops_the_page(script):
    def rl_undocumented() -> int:
        return 1

    plugin = ModuleType("pytest_rlrollout.suite.someday")  # as if the plugin had one more module
    rl_undocumented.__module__ = plugin.__name__
    plugin.rl_undocumented = pytest.fixture(rl_undocumented)
    with pytest.raises(ValueError, match=r"fixtures without a docstring.*: rl_undocumented$"):
        script.plugin_fixtures(plugin)
