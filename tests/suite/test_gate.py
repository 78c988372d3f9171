"""The pytest plugin as users meet it: the exporter gate and the validation fixture."""

import json

import pytest

from pytest_rlrollout.snapshot import broken
from pytest_rlrollout.suite.options import CONFORMANCE


def test_rl_snapshot_runs_the_snap_conformance_tests_on_a_valid_snapshot(pytester, reference):
    result = pytester.runpytest_inprocess(
        f"--rl-snapshot={reference['full'].snapshot}", f"--rl-base={reference.base}", "-rs"
    )
    result.assert_outcomes(passed=16, skipped=10)
    result.stdout.fnmatch_lines(["*rlrollout: snapshot*", "*not-applicable: does not apply to full snapshots*"])


def test_rl_snapshot_fails_exactly_the_broken_clause(pytester, reference, tmp_path):
    case = broken.broken_case("SNAP-INDEX-2", reference, tmp_path)
    result = pytester.runpytest_inprocess(f"--rl-snapshot={case.snapshot}", f"--rl-base={reference.base}")
    result.assert_outcomes(passed=15, failed=1, skipped=10)
    result.stdout.fnmatch_lines(["*SNAP-INDEX-2 ?MUST?*mixes layers 1, 2*", "*FAILED*test_one_layer_per_shard*"])


def test_rl_level_must_does_not_fail_on_should_clauses(pytester, reference, tmp_path):
    case = broken.broken_case("SNAP-TOK-1a", reference, tmp_path)
    args = [f"--rl-snapshot={case.snapshot}", f"--rl-base={reference.base}"]
    pytester.runpytest_inprocess(*args).assert_outcomes(passed=15, failed=1, skipped=10)
    lenient = pytester.runpytest_inprocess(*args, "-o", "rl_level=must", "--rl-report=r.json")
    lenient.assert_outcomes(passed=15, skipped=10, xfailed=1)
    assert lenient.ret == 0
    # the SHOULD clause is still reported as failing
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["clauses"]["SNAP-TOK-1a"]["outcome"] == "fail"
    assert report["summary"]["levels"]["SHOULD"]["fail"] == 1


def test_incremental_gate_with_parent_and_signal(pytester, reference, tmp_path):
    import json

    inc = reference["incremental"]
    signal = tmp_path / "signal.json"
    signal.write_text(json.dumps(inc.signal))
    result = pytester.runpytest_inprocess(
        f"--rl-snapshot={inc.snapshot}",
        f"--rl-base={inc.base}",
        "-o",
        f"rl_parent={inc.parent}",
        "-o",
        f"rl_signal={signal}",
    )
    result.assert_outcomes(passed=20, skipped=6)


def test_explicit_paths_are_left_alone(pytester, reference):
    pytester.makepyfile(test_mine="def test_mine(): pass")
    result = pytester.runpytest_inprocess("test_mine.py", f"--rl-snapshot={reference.base}")
    result.assert_outcomes(passed=1)


def test_validation_fixture_in_user_tests(pytester, reference, tmp_path):
    bad = broken.broken_case("SNAP-SPEC-1", reference, tmp_path)
    pytester.makepyfile(
        f"""
        from pytest_rlrollout.suite.gate import assert_valid

        def test_exporter_output(rl_validate_snapshot):
            assert_valid(rl_validate_snapshot({str(reference["full"].snapshot)!r}, base={str(reference.base)!r}))

        def test_broken_output(rl_validate_snapshot):
            assert_valid(rl_validate_snapshot({str(bad.snapshot)!r}, base={str(reference.base)!r}))
        """
    )
    result = pytester.runpytest_inprocess()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*SNAP-SPEC-1 ?MUST? model.weight.spec.json*"])


def test_unknown_clause_in_a_marker_is_a_usage_error(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.rl_clause("SNAP-NOPE-1")
        def test_x(): pass
        """
    )
    result = pytester.runpytest_inprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*rl_clause names unknown clause*SNAP-NOPE-1*"])


def test_default_run_checks_every_reference_kind(pytester):

    result = pytester.runpytest_inprocess(str(CONFORMANCE / "test_snap.py"))
    result.assert_outcomes(passed=58, skipped=7)  # skipped: QUANT-1/2, INC-6/7 where their condition is absent
    result.stdout.no_fnmatch_line("*does not apply to*")
