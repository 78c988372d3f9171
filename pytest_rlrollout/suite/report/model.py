"""The report's one model: what a run judged, as typed records the collector fills and every
writer reads.

Data flows one way: catalogue → test results (outcome + evidence) → one outcome per clause →
the `Report`. When several tests judge one clause, the most telling outcome wins
(`contract.roll_up`), and its test's evidence is the clause's.

`Report.to_json` is the JSON report's shape (other tools read `clauses[ID]["outcome"]` and each
test's `reason`, `exchanges`, `observed`, `outcome`: those keys stay); `Report.from_json` reads it
back into the same model, so a report on disk can be written again in any format. What the
report says about its run is `report.header`, a soak's figures `report.soak`, a diagnosis
`report.diagnosis`, and reading a field back `report.fields`. This module imports no writer and nothing of pytest.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from pytest_rlrollout.contract import Outcome, catalogue, roll_up
from pytest_rlrollout.numerics.figures import Figures
from pytest_rlrollout.suite.report.diagnosis import DiagnosisSummary
from pytest_rlrollout.suite.report.fields import ReportError, Scalar, as_counts, as_object, as_outcome, as_strings
from pytest_rlrollout.suite.report.header import CONTRACT_DOC, Capability, Contract, Engine, Provenance
from pytest_rlrollout.suite.report.soak import SoakSummary

LEVELS = ("MUST", "SHOULD", "MAY")
FAILED = (Outcome.FAIL, Outcome.ERROR)  # the outcomes a report shows as failures, with their exchanges


# --------------------------------------------------------------------------- what a test saw


@dataclass(frozen=True)
class Upload:
    """What building one snapshot cost a swap test: bytes uploaded, copied inside the bucket by
    the store, hard-linked into a bucket on this machine, written on this machine to build it,
    and the upload as a fraction of a full snapshot."""

    identity: str
    kind: str
    uploaded: int = 0
    copied: int = 0
    of_full: float = 0.0
    linked: int = 0
    written: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "identity": self.identity,
            "kind": self.kind,
            "uploaded": self.uploaded,
            "copied": self.copied,
            "linked": self.linked,
            "written": self.written,
            "of_full": self.of_full,
        }

    @classmethod
    def from_json(cls, doc: Any) -> Upload:
        doc = as_object(doc, "upload")
        return cls(
            str(doc.get("identity", "")),
            str(doc.get("kind", "")),
            doc.get("uploaded", 0),
            doc.get("copied", 0),
            doc.get("of_full", 0.0),
            doc.get("linked", 0),
            doc.get("written", 0),
        )


@dataclass
class Timeline:
    """A swap test's observations over time, for the report's picture: times in seconds from
    the first event (the recorder in `suite.evidence` keeps the run's clock until the test ends)."""

    title: str
    old: str | None = None  # the snapshot served before the swap
    new: str | None = None  # the snapshot signalled
    chunks: list[tuple[float, str | None]] = field(default_factory=list)  # arrival, policy version
    marks: list[tuple[float, str]] = field(default_factory=list)  # signal, answered, served, ...
    replicas: list[tuple[float, int, str]] = field(default_factory=list)  # a replica's status when it changed
    probes: list[tuple[float, float, int]] = field(default_factory=list)  # sent, answered, HTTP status

    def times(self) -> list[float]:
        return [
            *(t for t, _ in self.chunks),
            *(t for t, _ in self.marks),
            *(t for t, _, _ in self.replicas),
            *(t for p in self.probes for t in p[:2]),
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "old": self.old,
            "new": self.new,
            "chunks": [list(c) for c in self.chunks],
            "marks": [list(m) for m in self.marks],
            "replicas": [list(r) for r in self.replicas],
            "probes": [list(p) for p in self.probes],
        }

    @classmethod
    def from_json(cls, doc: Any) -> Timeline:
        doc = as_object(doc, "timeline")
        try:
            return cls(
                title=str(doc.get("title", "timeline")),
                old=doc.get("old"),
                new=doc.get("new"),
                chunks=[(float(t), v) for t, v in doc.get("chunks") or []],
                marks=[(float(t), str(w)) for t, w in doc.get("marks") or []],
                replicas=[(float(t), int(i), str(s)) for t, i, s in doc.get("replicas") or []],
                probes=[(float(s), float(a), int(c)) for s, a, c in doc.get("probes") or []],
            )
        except (TypeError, ValueError) as e:
            raise ReportError(f"timeline {doc.get('title')!r}: {e}") from None


@dataclass
class NumFigures:
    """The NUM figures of one test (the R3 paper's mismatch figures, `numerics.figures.Figures`),
    and which position of a served routing row agreed (NUM-ROUTE-1)."""

    figures: Figures
    alignment: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = self.figures.as_dict()
        return out if self.alignment is None else {**out, "alignment": self.alignment}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> NumFigures:
        """Read leniently: a figure missing or of the wrong kind (a report edited by hand) is kept
        as it is, shown as it is spelt, and costs only the pictures it would draw."""
        required = {f.name: None for f in fields(Figures) if f.default is MISSING and f.default_factory is MISSING}
        given = {f.name: doc[f.name] for f in fields(Figures) if f.name in doc}
        return cls(Figures(**{**required, **given}), doc.get("alignment"))


def figures_from_json(doc: Any) -> tuple[NumFigures | None, dict[str, Scalar]]:
    """A test's `figures` as the JSON has them: the NUM figures (they count tokens), or a few
    named numbers (FID's max |Δ| and tolerance)."""
    if not isinstance(doc, dict):
        return None, {}
    if "tokens" in doc:
        return NumFigures.from_json(doc), {}
    return None, {str(k): v for k, v in doc.items() if isinstance(v, Scalar)}


@dataclass
class TestResult:
    """One test's outcome and the evidence for it."""

    __test__ = False  # a record, not a test class, to pytest's collector

    test: str
    outcome: Outcome = Outcome.PASS
    reason: str = ""  # fail/error: the assertion message; unjudged: why; pass: empty
    observed: str = ""  # what the test observed (what a pass rests on)
    exchanges: list[str] = field(default_factory=list)  # requests and answers behind a failure
    timeline: Timeline | None = None  # a swap test's observations over time
    uploads: list[Upload] = field(default_factory=list)  # snapshots the test built and what they cost
    numerics: NumFigures | None = None  # the NUM figures
    measures: dict[str, Scalar] = field(default_factory=dict)  # a few named numbers (FID's max |Δ|)
    duration: float = 0.0
    # a state-changing test's loads: what the run's plan said (None: not planned) and what it did,
    # in the same figures (swaps, built, uploaded, copied, linked, written)
    planned: dict[str, int] | None = None
    done: dict[str, int] | None = None

    @property
    def off_plan(self) -> list[str]:
        """The figures in which what the test did differs from its plan."""
        if self.planned is None or self.done is None:
            return []
        return [k for k in self.planned if self.planned[k] != self.done.get(k, 0)]

    @property
    def evidence(self) -> str:
        """The one-line case for this outcome: the reason, else the observation."""
        return self.reason or (f"observed: {self.observed}" if self.observed else "")

    @property
    def failed(self) -> bool:
        return self.outcome in FAILED

    def to_json(self) -> dict[str, Any]:
        figures = self.numerics.to_json() if self.numerics is not None else (dict(self.measures) or None)
        return {
            "test": self.test,
            "outcome": str(self.outcome),
            "reason": self.reason,
            "observed": self.observed,
            "exchanges": list(self.exchanges),
            "timeline": self.timeline.to_json() if self.timeline else None,
            "uploads": [u.to_json() for u in self.uploads],
            "figures": figures,
            "duration": self.duration,
            "planned": self.planned,
            "done": self.done,
        }

    @classmethod
    def from_json(cls, doc: Any) -> TestResult:
        doc = as_object(doc, "test")
        name = str(doc.get("test", ""))
        numerics, measures = figures_from_json(doc.get("figures"))
        return cls(
            test=name,
            outcome=as_outcome(doc.get("outcome"), name),
            reason=str(doc.get("reason") or ""),
            observed=str(doc.get("observed") or ""),
            exchanges=list(as_strings(doc.get("exchanges") or [], f"{name}: exchanges")),
            timeline=Timeline.from_json(doc["timeline"]) if doc.get("timeline") else None,
            uploads=[Upload.from_json(u) for u in doc.get("uploads") or []],
            numerics=numerics,
            measures=measures,
            duration=float(doc.get("duration") or 0.0),
            planned=as_counts(doc.get("planned"), f"{name}: planned"),
            done=as_counts(doc.get("done"), f"{name}: done"),
        )


@dataclass
class ClauseResult:
    """One clause's outcome: the roll-up of the tests that judge it, with the deciding test's case."""

    clause: str
    level: str
    area: str
    rule: str
    outcome: Outcome = Outcome.PASS
    evidence: str = ""  # the deciding test's case
    tests: list[TestResult] = field(default_factory=list)
    duration: float = 0.0

    def add(self, t: TestResult) -> None:
        self.tests.append(t)
        self.duration += t.duration
        self.outcome = roll_up([x.outcome for x in self.tests])
        deciding = self.deciding
        self.evidence = deciding.evidence if deciding is not None else ""

    @property
    def deciding(self) -> TestResult | None:
        """The test whose outcome is the clause's (its evidence is the clause's)."""
        return next((t for t in self.tests if t.outcome == self.outcome), None)

    @property
    def failed(self) -> bool:
        return self.outcome in FAILED

    def to_json(self) -> dict[str, Any]:
        return {
            "clause": self.clause,
            "level": self.level,
            "area": self.area,
            "rule": self.rule,
            "outcome": str(self.outcome),
            "evidence": self.evidence,
            "tests": [t.to_json() for t in self.tests],
            "duration": self.duration,
        }

    @classmethod
    def from_json(cls, cid: str, doc: Any) -> ClauseResult:
        doc = as_object(doc, cid)
        try:
            return cls(
                clause=cid,
                level=str(doc["level"]),
                area=str(doc["area"]),
                rule=str(doc["rule"]),
                outcome=as_outcome(doc["outcome"], cid),
                evidence=str(doc.get("evidence") or ""),
                tests=[TestResult.from_json(t) for t in doc.get("tests") or []],
                duration=float(doc.get("duration") or 0.0),
            )
        except KeyError as e:
            raise ReportError(f"{cid}: no {e.args[0]!r}") from None


def in_catalogue_order(clauses: dict[str, ClauseResult]) -> dict[str, ClauseResult]:
    """`clauses` as the catalogue orders them (a clause it does not know, last)."""
    order = {c.id: i for i, c in enumerate(catalogue())}
    return dict(sorted(clauses.items(), key=lambda kv: order.get(kv[0], math.inf)))


# --------------------------------------------------------------------------- the run


Counts = dict[Outcome, int]


@dataclass(frozen=True)
class Summary:
    """Counts of clause outcomes by level and by area."""

    levels: dict[str, Counts]
    areas: dict[str, Counts]

    @classmethod
    def of(cls, clauses: dict[str, ClauseResult]) -> Summary:
        levels: dict[str, Counts] = {}
        areas: dict[str, Counts] = {}
        for c in clauses.values():
            levels.setdefault(c.level, Counter())[c.outcome] += 1
            areas.setdefault(c.area, Counter())[c.outcome] += 1
        ordered = {k: dict(levels[k]) for k in LEVELS if k in levels}
        return cls(
            {**ordered, **{k: dict(v) for k, v in levels.items() if k not in ordered}},
            {k: dict(v) for k, v in areas.items()},
        )

    def groups(self) -> list[tuple[str, dict[str, Counts]]]:
        return [("by level", self.levels), ("by area", self.areas)]

    def to_json(self) -> dict[str, Any]:
        def plain(group: dict[str, Counts]) -> dict[str, dict[str, int]]:
            return {k: {str(o): n for o, n in v.items()} for k, v in group.items()}

        return {"levels": plain(self.levels), "areas": plain(self.areas)}


@dataclass(frozen=True)
class PictureFile:
    """A NUM picture written beside the report: `<stem>.numerics-<key>-<picture>.png`."""

    clause: str
    key: str  # the test's key (`NumericsTest.key`)
    picture: str  # its name (`numerics.pictures.TITLES`)
    file: str

    def to_json(self) -> dict[str, Any]:
        return {"clause": self.clause, "key": self.key, "picture": self.picture, "file": self.file}


@dataclass(frozen=True)
class Pictures:
    """The NUM pictures written beside the report, or why there are none (matplotlib missing)."""

    files: tuple[PictureFile, ...] = ()
    no_pictures: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"pictures": [p.to_json() for p in self.files], "no_pictures": self.no_pictures}

    @classmethod
    def from_json(cls, doc: Any) -> Pictures:
        doc = as_object(doc, "numerics")
        files = tuple(PictureFile(**as_object(p, "numerics: picture")) for p in doc.get("pictures") or [])
        return cls(files, doc.get("no_pictures"))


@dataclass(frozen=True)
class NumericsTest:
    """A test that reports the NUM figures; `key` (the clause, numbered when a clause has several
    such tests) names its pictures."""

    key: str
    clause: ClauseResult
    test: TestResult

    @property
    def figures(self) -> NumFigures:
        assert self.test.numerics is not None  # numerics_tests picks only these
        return self.test.numerics


@dataclass
class Report:
    """One run's report: provenance, the contract it was judged by, the engine and capabilities,
    one result per clause, and the NUM pictures once written (`Report.pictures`)."""

    provenance: Provenance
    contract: Contract
    clauses: dict[str, ClauseResult]
    engine: Engine | None = None
    capabilities: list[Capability] = field(default_factory=list)
    pictures: Pictures | None = None
    soak: SoakSummary | None = None  # a soak's figures (`rlrollout soak`)
    diagnosis: DiagnosisSummary | None = None  # where a logprob gap comes from (`rlrollout diagnose`)

    @classmethod
    def judged(
        cls, clauses: dict[str, ClauseResult], provenance: Provenance, discovery: dict[str, Any] | None = None
    ) -> Report:
        """The report of `clauses` (put in the catalogue's order), with the engine and capabilities
        the run discovered (`remote.discovery.Discovery.as_dict`)."""
        engine = Engine(discovery["engine"], discovery["decided"], discovery.get("version")) if discovery else None
        ordered = in_catalogue_order(clauses)
        return cls(provenance, Contract(catalogue().version), ordered, engine, Capability.table(discovery))

    @property
    def summary(self) -> Summary:
        return Summary.of(self.clauses)

    @property
    def title(self) -> str:
        what = "diagnosis" if self.diagnosis is not None and not self.clauses else "conformance"
        return f"RL-rollout {what}: {self.provenance.deployment}"

    def failures(self) -> list[tuple[ClauseResult, TestResult]]:
        """Every failed or broken test, with its clause."""
        return [(c, t) for c in self.clauses.values() for t in c.tests if t.failed]

    def counts(self) -> Counts:
        """How many clauses had each outcome."""
        return Counter(c.outcome for c in self.clauses.values())

    def numerics_tests(self) -> list[NumericsTest]:
        out: list[NumericsTest] = []
        for cid, c in self.clauses.items():
            mine = [t for t in c.tests if t.numerics is not None]
            out += [NumericsTest(cid.lower() + (f"-{i + 1}" if i else ""), c, t) for i, t in enumerate(mine)]
        return out

    def to_json(self) -> dict[str, Any]:
        out = {
            "provenance": self.provenance.to_json(),
            "contract": self.contract.to_json(),
            "engine": self.engine.to_json() if self.engine else None,
            "capabilities": [c.to_json() for c in self.capabilities],
            "summary": self.summary.to_json(),
            "clauses": {k: v.to_json() for k, v in self.clauses.items()},
        }
        if self.pictures is not None:
            out["numerics"] = self.pictures.to_json()
        if self.soak is not None:
            out["soak"] = self.soak.to_json()
        if self.diagnosis is not None:
            out["diagnosis"] = self.diagnosis.to_json()
        return out

    @classmethod
    def from_json(cls, doc: Any) -> Report:
        """A report as `to_json` wrote it (its summary is recomputed from the clauses); ReportError
        saying what is wrong otherwise."""
        doc = as_object(doc, "report")
        try:
            contract, engine = as_object(doc["contract"], "contract"), doc.get("engine")
            return cls(
                provenance=Provenance.from_json(doc["provenance"]),
                contract=Contract(str(contract["version"]), str(contract.get("document", CONTRACT_DOC))),
                clauses={
                    str(k): ClauseResult.from_json(str(k), v) for k, v in as_object(doc["clauses"], "clauses").items()
                },
                engine=Engine(str(engine["name"]), str(engine["decided"]), engine.get("version")) if engine else None,
                capabilities=[Capability.from_json(c) for c in doc.get("capabilities") or []],
                pictures=Pictures.from_json(doc["numerics"]) if doc.get("numerics") is not None else None,
                soak=SoakSummary.from_json(doc["soak"]) if doc.get("soak") is not None else None,
                diagnosis=DiagnosisSummary.from_json(doc["diagnosis"]) if doc.get("diagnosis") is not None else None,
            )
        except KeyError as e:
            raise ReportError(f"report: no {e.args[0]!r}") from None
        except TypeError as e:
            raise ReportError(f"report: {e}") from None
