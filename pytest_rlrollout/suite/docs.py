"""The project's contract document, generated from the catalogue: each clause's rule, level and
decision, the conformance tests that judge it, and the fault switch or broken snapshot that
proves those tests can fail. `rlrollout clauses --format md` prints it; `docs/contract.md` is
a committed copy kept in step by a test."""

from __future__ import annotations

import importlib.util
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from pytest_rlrollout.contract import SEVERITY, Clause, Outcome, catalogue
from pytest_rlrollout.contract.capabilities import CAPABILITIES, Capability
from pytest_rlrollout.engines import ENGINES
from pytest_rlrollout.suite.options import CONFORMANCE

OUTCOMES: dict[Outcome, str] = {
    Outcome.PASS: "the clause holds, on an observation",
    Outcome.FAIL: "the deployment (or snapshot) violates the clause; the report shows the exchange",
    Outcome.UNSUPPORTED: "the deployment lacks an optional capability",
    Outcome.NOT_APPLICABLE: "the clause does not apply (a dense model, another snapshot kind, the other transition)",
    Outcome.INCONCLUSIVE: "the observation could not be made; never silently a pass",
    Outcome.ERROR: "the suite itself broke",
}


def judging_tests() -> dict[str, list[str]]:
    """Clause → the conformance tests tagged with it (`module::test[param]`), read from the
    tests' own markers."""
    out: dict[str, list[str]] = defaultdict(list)
    for path in sorted(CONFORMANCE.glob("test_*.py")):
        module = _load(path)
        for name, fn in vars(module).items():
            if not (name.startswith("test_") and callable(fn)):
                continue
            for clause, param in _clauses_of(getattr(fn, "pytestmark", [])):
                out[clause].append(f"{path.name}::{name}" + (f"[{param}]" if param else ""))
    return {k: sorted(set(v)) for k, v in out.items()}


def _load(path: Path) -> ModuleType:
    """A conformance module, imported from its file: the modules are files shipped beside the
    package (a directory, not a package to import by name)."""
    spec = importlib.util.spec_from_file_location(f"rlrollout_conformance_{path.stem}", path)
    assert spec is not None and spec.loader is not None, path
    if spec.name in sys.modules:  # loaded once per process, as an import would be
        return sys.modules[spec.name]
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _clauses_of(marks: list) -> Iterator[tuple[str, str | None]]:
    for mark in marks:
        if mark.name == "rl_clause":
            for clause in mark.args:
                yield clause, None
        elif mark.name == "parametrize":
            for value in mark.args[1]:
                for inner in getattr(value, "marks", ()):
                    if inner.name == "rl_clause":
                        yield from ((clause, value.id) for clause in inner.args)


def _capability_row(c: Capability) -> str:
    required = ", ".join(sorted(e for e in ENGINES if c.required(e))) or "-"
    flags = "; ".join(f"{e}: {flag}" for e in ENGINES if (flag := c.flag(e)) is not None) or "-"
    return (
        f"| `{c.name}` | {c.about} | {c.probe} | {required}{' (observation only)' if c.observable else ''} | {flags} |"
    )


def contract_markdown() -> str:
    from pytest_rlrollout.reference.faults import FAULTS, clause_of
    from pytest_rlrollout.snapshot.broken import BREAKERS
    from pytest_rlrollout.snapshot.validate import CHECKS

    cat = catalogue()
    tests = judging_tests()
    lines = [
        "# The RL-rollout deployment contract",
        "",
        "Generated from the clause catalogue (`schemas/clauses.json`) by",
        "`rlrollout clauses --format md`; a test keeps this copy in step. Clause IDs are fixed.",
        "",
        "## Levels",
        "",
        *(f"- **{level}**: {text}" for level, text in cat.levels.items()),
        "",
        "## Outcomes",
        "",
        "Every clause of a report has one outcome; when several tests judge a clause, the first of",
        "this list among theirs wins, except that a test with nothing to judge on the deployment (a",
        "variant that is `not-applicable`, an optional feature `unsupported`) counts only when no test",
        "of the clause judged it.",
        "",
        *(f"- `{o}`: {OUTCOMES[o]}" for o in SEVERITY),
        "",
        "## Engines",
        "",
        "A clause states an intent; each engine expresses it on its own wire, its *binding*. A",
        "deployment is judged as one engine (`--rl-engine`, or decided by the preflight's probes); a",
        'clause without a binding on that engine is `not-applicable` ("no vllm binding"), one whose',
        "binding needs a server flag that is off is `unsupported` naming the flag.",
        "",
        *(f"- **{name}**: {text}" for name, text in cat.engines.items()),
        "",
        "## Capabilities",
        "",
        "Discovered before any test by probes that change nothing. A test needing one the deployment",
        "lacks is `fail` when its engine requires it and the clause is MUST, `unsupported` otherwise",
        "(naming the server flag that turns it on, where the engine has one), and `inconclusive` when",
        "the capability only lets the suite observe the clause.",
        "",
        "| capability | what it is | probe | required by | turned on by |",
        "|---|---|---|---|---|",
        *map(_capability_row, CAPABILITIES.values()),
        "",
        "## Sources",
        "",
        *(f"- **{key}**: {text}" for key, text in cat.sources.items()),
    ]
    by_area: dict[str, list[Clause]] = defaultdict(list)
    for c in cat:
        by_area[c.area].append(c)
    for area, about in cat.areas.items():
        lines += ["", f"## {area}: {about['title']}", "", about["about"]]
        for c in by_area[area]:
            lines += ["", f"### {c.id} ({c.level})", "", c.rule, "", "Bindings:", ""]
            lines += [f"- {engine}: {c.bindings[engine]}" for engine in c.engines]
            if c.refines:
                lines += ["", f"Refines {c.refines}."]
            if c.decision:
                lines += ["", f"Decision: {c.decision}"]
            judged = []
            if c.id in CHECKS:
                judged.append("the validator's check")
            judged += [f"`{t}`" for t in tests.get(c.id, [])]
            lines += ["", "Judged by: " + (", ".join(judged) if judged else "no conformance test yet")]
            proofs = []
            proofs += [f"fault switch `{f}`: {what}" for f, what in FAULTS.items() if clause_of(f) == c.id]
            if c.id in BREAKERS:
                proofs.append(f"broken snapshot: {BREAKERS[c.id].what}")
            if proofs:
                lines += ["", "Can fail: " + "; ".join(proofs) + "."]
            lines += ["", f"Sources: {', '.join(c.source)}."]
    return "\n".join(lines) + "\n"
