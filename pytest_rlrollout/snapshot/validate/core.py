"""The validator's core: what a check sees (`Subject`), the check registry, and `validate`.

Each check carries exactly one clause ID and reports problems of that clause only. A check
whose input could not be read (because another clause already failed) is `inconclusive`
instead of piling up follow-on findings, so one defect yields one clause's finding.
The validator only reads: it opens files read-only and never writes into a snapshot.
The checks themselves live beside this module, one module per area.

Everything in a snapshot, and the signal, is untrusted input: whatever it holds ends as
findings (or, for a signal file that is not a JSON object, a ValueError) within fixed bounds,
far above real snapshots (a 30B MoE: ~50 files, ~19k tensors, headers of ~50 KB):

- files: regular files only (FIFOs, sockets, devices, directories are named, never opened);
  symlinks only when they stay inside the snapshot; JSON files at most 32 MiB, nested at
  most 64 deep, at most 2,097,152 items (`untrusted`);
- safetensors headers: at most 32 MiB, 65,536 tensors, names of 1,024 characters, rank 64
  (`safetensors_io`); at most MAX_FILES files and MAX_TENSORS tensors read per snapshot;
- findings: at most MAX_FINDINGS per clause and MAX_SCHEMA_PROBLEMS per document, messages
  cut to MAX_MESSAGE characters (`Report.text()` also prints them escaped: names can hold
  newlines and terminal escapes).
"""

from __future__ import annotations

import itertools
import os
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

from pytest_rlrollout.contract import Level, Outcome, Verdict, catalogue, schemas
from pytest_rlrollout.contract.schemas import is_plain_shard_name
from pytest_rlrollout.snapshot import dtypes, untrusted
from pytest_rlrollout.snapshot import safetensors_io as st
from pytest_rlrollout.snapshot.layout import CONFIG, INDEX, SPEC, Kind, SnapshotDir, UnsafePath

SHOWN = 5  # names quoted per message before "and N more"
EXAMPLES = 3  # findings of one cause that text() names before it only counts them
# Bounds on what a hostile snapshot can make the validator read and report (module docstring).
MAX_FILES = 4096  # safetensors files whose headers are read (one layer per shard: ~100 real ones)
# tensors read over all headers: the largest open models hold ~150k; reading one costs ~15 us
MAX_TENSORS = 1 << 18
MAX_FINDINGS = 1000  # per clause; one more finding says the rest were not listed
MAX_SCHEMA_PROBLEMS = 100  # per document
MAX_MESSAGE = 1000  # characters of a finding's message (and a verdict's reason)
MAX_FILE = 300  # characters of a finding's file name (an index can name files of any length)
# A hot-load body is a few hundred bytes; jsonschema sorts unknown fields to name them (1 s for 500k)
MAX_SIGNAL_BYTES = 1 << 20


@dataclass(frozen=True)
class Finding:
    clause: str
    level: Level
    file: str | None
    message: str

    def __str__(self) -> str:
        where = f"{self.file}: " if self.file else ""
        return f"{self.clause} [{self.level}] {where}{self.message}"


@dataclass(frozen=True)
class Context:
    """What the validator knows besides the snapshot directory itself.

    Offline, an exporter passes the base and (for a diff) the parent snapshot; at hot-load
    time the deployment also passes the signal body and what its replicas serve.
    """

    base: Path | None = None
    parent: Path | None = None
    signal: Mapping[str, Any] | None = None
    identity: str | None = None  # default: the signal's identity, else the directory name
    parent_identity: str | None = None  # default: the parent directory name
    served: tuple[str | None, ...] | None = None  # current identity of every replica
    ledger_reset: bool = False
    base_model: tuple[str, ...] = ()  # names adapter_config.json may use for the base
    verify_data: bool = True  # decode ARC2 payloads (reads tensor data)
    hf_config: bool = True  # ask transformers, when installed, whether it knows the model_type


@dataclass
class Report:
    snapshot: str
    kind: Kind
    identity: str
    findings: list[Finding] = field(default_factory=list)
    verdicts: dict[str, Verdict] = field(default_factory=dict)

    def failures(self, level: Level = "SHOULD") -> list[Finding]:
        """Findings that fail at this level: MUST only, or MUST and SHOULD."""
        keep = {"MUST"} if level == "MUST" else {"MUST", "SHOULD", "MAY"}
        return [f for f in self.findings if f.level in keep]

    def ok(self, level: Level = "SHOULD") -> bool:
        return not self.failures(level)

    def of(self, clause: str) -> list[Finding]:
        return [f for f in self.findings if f.clause == clause]

    def as_dict(self, level: Level = "SHOULD") -> dict[str, Any]:
        """Every finding, one entry each (grouping is text()'s alone); `valid` is `ok(level)`."""
        level = _level(level)
        return {
            "snapshot": self.snapshot,
            "kind": self.kind,
            "identity": self.identity,
            "level": level,
            "valid": self.ok(level),
            "findings": [asdict(f) for f in self.findings],
            "clauses": {k: {"outcome": v.outcome, "reason": v.reason} for k, v in sorted(self.verdicts.items())},
        }

    def text(self, level: Level = "SHOULD") -> str:
        """The report for a terminal: findings of one cause beyond EXAMPLES are folded into one line,
        and the verdict is the one `ok(level)` (the exit code) gives. Every line is printable:
        a name holding a newline or a terminal escape is shown escaped (\\n, \\x1b), so it can
        neither forge a finding line nor reach the terminal."""
        level = _level(level)
        lines = [f"{self.snapshot}: {self.kind} snapshot, identity {untrusted.brief(self.identity)}"]
        shown = finding_lines(self.findings)
        lines += [f"  {line}" for line in shown]
        if len(shown) < len(self.findings):
            lines.append("  (--format json lists every finding)")
        counts = Counter(v.outcome.value for v in self.verdicts.values())
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        lines.append(f"{self._verdict(level)}: {len(self.findings)} finding(s); clauses: {summary}")
        return "\n".join(map(untrusted.printable, lines))

    def _verdict(self, level: Level) -> str:
        if not self.findings:
            return "valid"
        if self.failures("MUST"):
            return "INVALID"
        if self.ok(level):
            return "valid with SHOULD findings"
        # only SHOULD (or MAY) findings, judged at a level that fails them: say so, or the
        # text would read "valid" while the command exits 1
        return f"INVALID at level {level} (valid with SHOULD findings at level MUST)"


def _level(level: str) -> Level:
    """Levels compare upper-case (failures() tests == "MUST"); "must" from an API caller means the same."""
    up = level.upper()
    if up not in ("MUST", "SHOULD", "MAY"):
        raise ValueError(f"level {level!r}: not MUST, SHOULD or MAY")
    return up  # type: ignore[return-value]


# --------------------------------------------------------------------------- folding findings for text()

# A file or tensor name: dotted or slashed, with a letter in its first part (so 5.2 stays a number).
# Possessive runs and a lookahead keep it linear per position: the plain `[\w-]*[A-Za-z_][\w-]*`
# backtracks cubically, 6 s on one 1000-letter name.
_NAME = re.compile(r"(?=[\w\-]*[A-Za-z_])[\w\-]++(?:[./][\w\-]++)+")
_NUMBER = re.compile(r"\b\d+(?:\.\d+)?\b")
# a list of names or numbers, as names() and shapes print them: one placeholder however long
_RUN = re.compile(r"<(name|n)>(?:,\s*<(?:name|n)>)*(?: and <n> more)?")


def _template(text: str) -> str:
    """`text` with its names and numbers replaced by placeholders: what findings of one cause share."""
    return _RUN.sub(lambda m: f"<{m.group(1)}>", _NUMBER.sub("<n>", _NAME.sub("<name>", text)))


def _cause(f: Finding) -> tuple[str, str, str | None, str]:
    # the file takes part only as "some file or none": per-shard findings differ in it alone
    return f.clause, f.level, None if f.file is None else _template(f.file), _template(f.message)


def finding_lines(findings: Iterable[Finding]) -> list[str]:
    """One line per finding, except that more than EXAMPLES findings of one cause (same clause,
    level and message up to names and numbers) become one line with the count and EXAMPLES
    examples, at the place of the first. Deterministic: the findings' own order decides."""
    findings = list(findings)
    causes: dict[tuple[str, str, str | None, str], list[Finding]] = defaultdict(list)
    for f in findings:
        causes[_cause(f)].append(f)
    lines, folded = [], set()
    for f in findings:
        key = _cause(f)
        group = causes[key]
        if len(group) <= EXAMPLES:
            lines.append(str(f))
        elif key not in folded:
            folded.add(key)
            lines.append(_folded(group))
    return lines


def _folded(group: list[Finding]) -> str:
    first = group[0]
    files = {f.file for f in group}
    where = "" if first.file is None else ("<file>: " if len(files) > 1 else f"{first.file}: ")
    examples = ", ".join(_examples(group, by_file=len(files) > 1))
    return f"{first.clause} [{first.level}] {len(group)} findings: {where}{_template(first.message)}; e.g. {examples}"


def _examples(group: list[Finding], *, by_file: bool) -> list[str]:
    """What tells the first EXAMPLES findings apart: their file, else the first name that varies
    across the group, else (only numbers vary) the whole message."""
    shown = group[:EXAMPLES]
    if by_file:
        return [str(f.file) for f in shown]
    found = [_NAME.findall(f.message) for f in group]
    width = max(map(len, found))
    for i in range(width):
        if len({names[i] if i < len(names) else None for names in found}) > 1:
            return [names[i] if i < len(names) else f.message for f, names in zip(shown, found, strict=False)]
    return [f.message for f in shown]


# --------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class Problem:
    file: str | None
    message: str


class NotApplicable(Exception):
    """The clause does not apply to this snapshot or context."""


class Inconclusive(Exception):
    """The check's input could not be read; another clause already reports why."""


@dataclass(frozen=True)
class Check:
    clause: str
    kinds: frozenset[str]
    fn: Callable[[Subject], Iterable[Problem]]


CHECKS: dict[str, Check] = {}
ALL_KINDS = frozenset({"full", "incremental", "lora"})
WEIGHTS = frozenset({"full", "incremental"})


# a check function, kept as it is by the decorator that registers it
CheckFn = TypeVar("CheckFn", bound="Callable[[Subject], Iterable[Problem]]")


def check(clause: str, kinds: frozenset[str] = ALL_KINDS) -> Callable[[CheckFn], CheckFn]:
    def register(fn: CheckFn) -> CheckFn:
        if clause not in catalogue():
            raise KeyError(f"check for unknown clause {clause}")
        if clause in CHECKS:
            raise KeyError(f"two checks for {clause}")
        CHECKS[clause] = Check(clause, kinds, fn)
        return fn

    return register


# --------------------------------------------------------------------------- what a check sees


class Subject:
    """A snapshot directory plus context, read lazily and at most once."""

    def __init__(self, root: str | os.PathLike[str], ctx: Context, kind: Kind | None = None, *, judged: bool = True):
        self.dir = SnapshotDir(root)
        self.ctx = ctx
        self.kind: Kind = kind or self._detect_kind()
        self.judged = judged  # False for the base and the parent: only their tensor tables are read

    def _detect_kind(self) -> Kind:
        if self.dir.is_lora():
            return "lora"
        if self.ctx.parent is not None or self.incremental_metadata is not None:
            return "incremental"
        return "full"

    @cached_property
    def incremental_metadata(self) -> Mapping[str, Any] | None:
        meta = (self.ctx.signal or {}).get("incremental_snapshot_metadata")
        return meta if isinstance(meta, Mapping) and meta else None

    @cached_property
    def identity(self) -> object:
        """The identity as given, whatever its type (SNAP-ID-1 judges it): --identity, else the
        signal's, else the directory name."""
        if self.ctx.identity is not None:
            return self.ctx.identity
        signal = self.ctx.signal or {}
        return signal.get("identity", self.dir.name)

    @cached_property
    def parent(self) -> Subject | None:
        return Subject(self.ctx.parent, Context(hf_config=False), "full", judged=False) if self.ctx.parent else None

    @cached_property
    def base(self) -> Subject | None:
        return Subject(self.ctx.base, Context(hf_config=False), "full", judged=False) if self.ctx.base else None

    # -- JSON documents: (value, error). Incremental snapshots inherit what they omit.

    def _json(self, name: str) -> tuple[Any, str | None]:
        if name not in self.dir.listing:
            if self.kind == "incremental":
                if self.parent is not None:
                    return self.parent._json(name)
                return None, "is missing; a diff inherits it from its parent, so pass --parent to check it"
            return None, self.dir.unreadable(name)  # missing, or a directory
        try:
            return self.dir.read_json(name), None
        except (ValueError, UnsafePath) as e:
            return None, str(e)

    @cached_property
    def config(self) -> tuple[Any, str | None]:
        return self._json(CONFIG)

    @cached_property
    def index(self) -> tuple[Any, str | None]:
        return self._json(INDEX)

    @cached_property
    def spec(self) -> tuple[Any, str | None]:
        return self._json(SPEC)

    def config_dict(self) -> dict[str, Any]:
        value, _ = self.config
        if not isinstance(value, dict):
            raise Inconclusive("config.json did not load (SNAP-CONFIG-1)")
        return value

    def weight_map(self) -> dict[str, str]:
        """The index's weight_map (entries naming no file left out); Inconclusive when it did not load."""
        if self._weight_map is None:
            raise Inconclusive("model.safetensors.index.json did not load (SNAP-INDEX-1)")
        return self._weight_map

    @cached_property
    def _weight_map(self) -> dict[str, str] | None:
        value, _ = self.index
        if not (isinstance(value, dict) and isinstance(value.get("weight_map"), dict)):
            return None
        return {k: v for k, v in value["weight_map"].items() if isinstance(v, str)}

    @cached_property
    def shards(self) -> dict[str, list[str]]:
        """The weight_map's plain shard names, each with the tensors it is given (other names are
        SNAP-INDEX-1's); {} when the index did not load. Grouped once: an index may name 300k files."""
        by_file: dict[str, list[str]] = defaultdict(list)
        for tensor, file in (self._weight_map or {}).items():
            if is_plain_shard_name(file):
                by_file[file].append(tensor)
        return dict(by_file)

    def tensor_map(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Spec entries as (normalised dtype, shape); malformed entries are left out (SNAP-SPEC-1/2)."""
        if self._tensor_map is None:
            raise Inconclusive("model.weight.spec.json did not load (SNAP-SPEC-1)")
        return self._tensor_map

    @cached_property
    def _tensor_map(self) -> dict[str, tuple[str, tuple[int, ...]]] | None:
        value, _ = self.spec
        if not (isinstance(value, dict) and isinstance(value.get("tensor_map"), dict)):
            return None
        out = {}
        for name, e in value["tensor_map"].items():
            # shapes beyond the validator's rank and size bounds are left out, as malformed ones
            if isinstance(e, dict) and isinstance(e.get("dtype"), str) and st.shape_ok(e.get("shape")):
                code = dtypes.normalise(e["dtype"])
                if code is not None:
                    out[name] = (code, tuple(e["shape"]))
        return out

    def quantization_config(self) -> dict[str, Any] | None:
        q = self.config_dict().get("quantization_config")
        return q if isinstance(q, dict) else None

    # -- safetensors files

    @cached_property
    def limits(self) -> list[str]:
        """What the validator's bounds left unread (SNAP-SAFETENSORS-1 reports it first)."""
        return []

    @cached_property
    def headers(self) -> dict[str, st.Header]:
        return {n: h for n, h in self._parsed.items() if isinstance(h, st.Header)}

    @cached_property
    def header_errors(self) -> dict[str, str]:
        return {n: h for n, h in self._parsed.items() if isinstance(h, str)}

    @cached_property
    def _parsed(self) -> dict[str, st.Header | str]:
        """Each safetensors file's header, or why it was not read. Files beyond MAX_FILES, and
        files after MAX_TENSORS tensors, are not read: one hostile snapshot could otherwise hold
        thousands of headers of 65,536 tensors each."""
        out: dict[str, st.Header | str] = {}
        files = self.dir.safetensors_files
        tensors, told = 0, False
        if len(files) > MAX_FILES:
            self.limits.append(
                f"holds {len(files)} safetensors files, more than {MAX_FILES}; the validator reads the first "
                f"{MAX_FILES} (by name) only"
            )
        for i, name in enumerate(files):
            if i >= MAX_FILES:
                out[name] = f"not read: more than {MAX_FILES} safetensors files (the validator's limit)"
                continue
            if tensors >= MAX_TENSORS:
                if not told:  # once, at the first file left unread
                    told = True
                    self.limits.append(
                        f"its safetensors files hold more than {MAX_TENSORS} tensors; the validator read {tensors} "
                        f"and left {len(files) - i} file(s) unread"
                    )
                out[name] = (
                    f"not read: the files before it hold more than {MAX_TENSORS} tensors (the validator's limit)"
                )
                continue
            why = self.dir.unreadable(name)
            if why is not None:
                out[name] = why
                continue
            header = self._header(name)
            out[name] = header
            if isinstance(header, st.Header):
                tensors += len(header.tensors)
        return out

    def _header(self, name: str) -> st.Header | str:
        path = self.dir.path(name)
        try:
            header = st.read_header(path)
        except st.HeaderError as e:
            return str(e)
        except OSError as e:
            return f"cannot be read: {e.strerror or e}"
        complaint = st.library_opinion(path) if self.judged else None  # a second opinion, where it matters
        if complaint is not None:
            return f"the safetensors library refuses it: {complaint}"
        return header

    @cached_property
    def tensors(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """The snapshot's tensors as (dtype, shape): from the files for a full snapshot; from the
        spec (or the parent's tensors) for a diff, whose files hold only U8 payloads."""
        if self.kind == "incremental":
            # Decoding keeps the parent's header, so the target's dtypes and shapes are the
            # parent's; whether the diff's own spec agrees is SNAP-INC-2's question.
            if self.parent is not None:
                return self.parent.tensors
            if SPEC in self.dir.listing:
                return self.tensor_map()
            raise Inconclusive("a diff without model.weight.spec.json and without --parent has no tensor table")
        try:
            loaded = set(self.weight_map().values())
        except Inconclusive:
            loaded = set(self.headers)
        table = {}
        for file, h in self.headers.items():
            if file in loaded:  # tensors of unreferenced files are never loaded (SNAP-INDEX-3a)
                for name, t in h.tensors.items():
                    table[name] = (t.dtype, t.shape)
        if not table:
            with suppress(Inconclusive):
                return self.tensor_map()
        return table

    @cached_property
    def unreadable_tensors(self) -> set[str]:
        """weight_map tensors whose file did not parse: their absence is SNAP-SAFETENSORS-1's finding."""
        try:
            wm = self.weight_map()
        except Inconclusive:
            return set()
        return {t for t, f in wm.items() if f in self.header_errors}


def names(items: Iterable[str]) -> str:
    items = sorted(items)
    shown = ", ".join(untrusted.brief_text(n, 200) for n in items[:SHOWN])
    return shown + (f" and {len(items) - SHOWN} more" if len(items) > SHOWN else "")


def schema_problems(name: str, document: Any, limit: int = MAX_SCHEMA_PROBLEMS) -> list[schemas.SchemaProblem]:
    """How `document` breaks `<name>.schema.json`: at most `limit` problems, then one saying
    more were not listed."""
    return list(schemas.problems(name, document, limit))


# --------------------------------------------------------------------------- entry point


def signal_findings(signal: Mapping[str, Any]) -> list[Finding]:
    """Findings on a hot-load request body, from its JSON Schema (the identity is SNAP-ID-1's check)."""
    cat = catalogue()
    out = []
    for problem in schema_problems("hot-load-request", signal):
        if problem.path[:1] == ("identity",):
            continue  # the identity is judged by the SNAP-ID-1 check itself
        out.append(_finding(problem.clause, cat[problem.clause].level, Problem("signal", problem.message)))
    return out


def _finding(clause: str, level: Level, p: Problem) -> Finding:
    """A finding with its untrusted parts cut to size: a name or value in a message can be megabytes."""
    file = None if p.file is None else untrusted.brief_text(p.file, MAX_FILE)
    return Finding(clause, level, file, untrusted.brief_text(p.message, MAX_MESSAGE))


def _run(chk: Check, subject: Subject) -> list[Problem]:
    """A check's problems, at most MAX_FINDINGS of them: checks are generators, so a hostile
    snapshot's millionth problem is never even computed."""
    problems = list(itertools.islice(chk.fn(subject), MAX_FINDINGS + 1))
    if len(problems) > MAX_FINDINGS:
        more = f"more findings of this clause not listed: the validator lists at most {MAX_FINDINGS}"
        problems[MAX_FINDINGS:] = [Problem(None, more)]
    return problems


def validate(
    snapshot: str | os.PathLike[str],
    *,
    base: str | os.PathLike[str] | None = None,
    parent: str | os.PathLike[str] | None = None,
    signal: Mapping[str, Any] | None = None,
    context: Context | None = None,
    **context_fields: Any,
) -> Report:
    """Validate a snapshot directory against every SNAP clause; reads, never writes.

    `base` enables the comparisons against the base model (SNAP-CONFIG-2, SNAP-COVER-1,
    SNAP-TOK-1a, SNAP-LORA-3); `parent` marks the directory as an ARC2 diff of that
    snapshot; `signal` is the hot-load request body that would announce it.

    Whatever the snapshot, the parent and the signal hold becomes findings, within the bounds
    the module docstring lists; only a snapshot, base or parent that is not a directory (or
    cannot be listed) raises, an OSError.
    """
    if context is not None and (base or parent or signal is not None or context_fields):
        raise TypeError("pass either context= or the individual fields, not both")
    ctx = context or Context(
        base=Path(base) if base else None,
        parent=Path(parent) if parent else None,
        signal=signal,
        **context_fields,
    )
    subject = Subject(snapshot, ctx)
    cat = catalogue()
    identity = subject.identity
    report = Report(str(snapshot), subject.kind, identity if isinstance(identity, str) else untrusted.shown(identity))
    looks_like_adapter = (
        subject.kind != "lora" and subject.dir.adapter_weight_files and CONFIG not in subject.dir.listing
    )
    for clause in (c.id for c in cat if c.id in CHECKS):
        chk = CHECKS[clause]
        if looks_like_adapter and clause != "SNAP-LORA-1":
            why = "the directory looks like a LoRA adapter (SNAP-LORA-1)"
            report.verdicts[clause] = Verdict(Outcome.INCONCLUSIVE, why)
            continue
        if subject.kind not in chk.kinds:
            why = f"does not apply to {subject.kind} snapshots"
            report.verdicts[clause] = Verdict(Outcome.NOT_APPLICABLE, why)
            continue
        try:
            problems = _run(chk, subject)
        except NotApplicable as e:
            report.verdicts[clause] = Verdict(Outcome.NOT_APPLICABLE, untrusted.brief_text(str(e), MAX_MESSAGE))
            continue
        except Inconclusive as e:
            report.verdicts[clause] = Verdict(Outcome.INCONCLUSIVE, untrusted.brief_text(str(e), MAX_MESSAGE))
            continue
        level = cat[clause].level
        report.findings += [_finding(clause, level, p) for p in problems]
        report.verdicts[clause] = Verdict(Outcome.FAIL if problems else Outcome.PASS)
    if ctx.signal is not None:
        extra = signal_findings(ctx.signal)
        report.findings += extra
        for f in extra:
            report.verdicts[f.clause] = Verdict(Outcome.FAIL)
    return report


def load_signal(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A hot-load request body from a JSON file (for `--signal`), read as untrusted: a regular
    file (a FIFO would block) of at most MAX_SIGNAL_BYTES, within the JSON bounds. ValueError
    says what is wrong with it, OSError that it cannot be read."""
    try:
        doc = untrusted.loads(untrusted.read_limited(path, MAX_SIGNAL_BYTES))
    except ValueError as e:  # Unreadable, BadJSON
        raise ValueError(f"{path}: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: a hot-load signal is a JSON object")
    return doc
