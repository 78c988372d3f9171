"""Reference cases of another model's base (`ReferenceCases.of`): what a live run against a
production-sized model builds HL-POST-5's broken variants from."""

import json

import pytest

from pytest_rlrollout.contract import catalogue
from pytest_rlrollout.snapshot import broken, build, tiny_moe
from pytest_rlrollout.snapshot import safetensors_io as st
from pytest_rlrollout.snapshot.cases import ReferenceCases
from pytest_rlrollout.snapshot.layout import INDEX, SPEC

from ..support import tree_hash

MODEL = "accounts/me/models/another"


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    """The cases of a base that is not the bundled reference (another seed, under its own name)."""
    root = tmp_path_factory.mktemp("other")
    base = tiny_moe.make_base(root / "another-base", seed=7)
    return ReferenceCases.of(root / "cases", base, MODEL)


def test_the_cases_of_another_base_are_valid_and_its_own(other):
    """Every kind validates against the base it was built from, and the LoRA names its model."""
    for kind in ReferenceCases.KINDS:
        report = other[kind].validate()
        assert report.findings == [], (kind, [str(f) for f in report.findings])
    assert other["lora"].base_model == (MODEL,)
    assert other["incremental"].signal["incremental_snapshot_metadata"]["previous_snapshot_identity"] == "another-base"


def test_the_full_case_of_another_base_is_the_base_linked(other):
    """Every shard of the full case is the base's own file (a hard link): nothing is written, and
    a variant of it carries only what it breaks."""
    step = other["full"].snapshot
    files = sorted(set(build.weight_map(step).values()))
    assert files and all((step / f).stat().st_ino == (other.base / f).stat().st_ino for f in files)


@pytest.mark.parametrize("clause", sorted(broken.BREAKERS))
def test_a_variant_of_another_base_breaks_its_clause_and_nothing_it_links(other, tmp_path, clause):
    """A variant links what it leaves alone: building it changes no byte of the base or of the
    case it starts from, and validation finds exactly its clause."""
    start = other[broken.BREAKERS[clause].start]
    roots = [r for r in (other.base, start.snapshot) if r is not None]
    before = [tree_hash(r) for r in roots]
    case = broken.broken_case(clause, other, tmp_path)
    assert [tree_hash(r) for r in roots] == before
    assert {f.clause for f in case.validate().findings} == {clause}


def test_a_plain_checkpoint_is_re_laid_once_and_read_only(tmp_path):
    """A base as `save_pretrained` writes it (one file, no index, no spec) is re-laid under the
    cases' root before anything is built from it; the checkpoint itself is not touched."""
    laid = tiny_moe.make_base(tmp_path / "laid")
    plain = tmp_path / "plain"
    plain.mkdir()
    st.write_file(plain / "model.safetensors", build.checkpoint_entries(laid), {"format": "pt"})
    build.carry_files(laid, plain)
    before = tree_hash(plain)
    cases = ReferenceCases.of(tmp_path / "cases", plain, MODEL)
    assert cases.base != plain and build.layout_problem(cases.base) is None
    assert {(cases.base / n).is_file() for n in (INDEX, SPEC)} == {True}
    assert cases["full"].validate().findings == []
    assert tree_hash(plain) == before
    assert json.loads((cases.base / "config.json").read_text()) == json.loads((plain / "config.json").read_text())


def test_an_unknown_kind_is_a_clear_error(other):
    with pytest.raises(KeyError, match="no reference case 'fp4'"):
        other["fp4"]


def test_every_breaker_is_a_snap_clause():
    assert set(broken.BREAKERS) <= {c.id for c in catalogue().area("SNAP")}
