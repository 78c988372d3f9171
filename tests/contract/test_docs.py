"""The project's contract document is generated from the catalogue and committed in step."""

from pathlib import Path

from pytest_rlrollout.cli import main
from pytest_rlrollout.contract import catalogue
from pytest_rlrollout.suite.docs import contract_markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "contract.md"


def test_docs_contract_md_is_the_generated_document(capsys):
    assert main(["clauses", "--format", "md"]) == 0
    generated = capsys.readouterr().out
    assert generated == contract_markdown()
    assert DOC.read_text() == generated, "docs/contract.md is stale: rlrollout clauses --format md > docs/contract.md"


def test_every_clause_has_its_rule_and_what_judges_it():
    doc = contract_markdown()
    for c in catalogue():
        section = doc.split(f"### {c.id} ({c.level})\n", 1)[1].split("\n### ", 1)[0]
        assert c.rule in section
        if c.area != "NUM":
            assert "Judged by: " in section and "no conformance test yet" not in section, c.id
        if c.area not in ("NUM",):
            assert "Can fail: " in section, f"{c.id} names no fault switch or broken snapshot"


ENGINES = DOC.parent / "engines"


def test_docs_engines_is_the_matrix_of_the_reports_beside_it():
    """docs/engines.{md,html}: `rlrollout matrix docs/engines/*.json --out docs/engines`, as
    committed (`python -m tests.engines.publish` makes the reports and the page); every column
    says how it was run."""
    from pytest_rlrollout.suite.matrix import html, load, markdown

    columns = load(sorted(ENGINES.glob("*.json")), page=DOC.parent)
    assert {c.name for c in columns} >= {
        "coreweave-reference",
        "fireworks-reference",
        "vllm-reference",
        "vllm-0.32-cpu",
        "openai-transformers-serve",
    }
    stale = "is stale: python -m tests.engines.publish (or rlrollout matrix docs/engines/*.json --out docs/engines)"
    assert (DOC.parent / "engines.md").read_text() == markdown(columns), f"docs/engines.md {stale}"
    assert (DOC.parent / "engines.html").read_text() == html(columns), f"docs/engines.html {stale}"
    for c in columns:
        real = not c.name.endswith("-reference")
        assert c.how.startswith("a real deployment" if real else "the reference deployment's"), (c.name, c.how)
