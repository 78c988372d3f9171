"""The soak's judge: every stream a rollout worker saw, against the swaps the trainer made.

Workers may run on other machines, whose clocks are not the trainer's, so nothing here compares
timestamps. The trainer numbers its swaps (epoch 0 is what was served before the first) and tells
every worker when swap n was signalled and when every replica served it; a worker notes, for each
request, the last of each it had heard of when it sent the request and when the stream ended.
That order is enough for every verdict:

- a request sent after swap n was served everywhere is answered by swap n or later (SWAP-NEW-1);
- a stream overlapped swap n when it was sent before n was served and ended after n was signalled;
- along a stream that crossed a swap the snapshot only moves forward (ASYNC: SWAP-ASYNC-2), and
  not at all under SYNC (SWAP-SYNC-1);
- a stream that crossed a swap ends as any stream must (ASYNC: SWAP-ASYNC-1; otherwise INF-SSE-1);
- every chunk names a snapshot the trainer loaded (VER-STREAM-1); where versions come as spans
  over the output (vLLM, SGLang), they cover it exactly once and name such snapshots (VER-SPAN-1);
- a request sent during an ASYNC swap is queued and answered 200 (SWAP-ASYNC-3); 425 Too Early
  only under SYNC (SWAP-SYNC-2); never a 5xx or a dropped stream (INF-SSE-1);
- a chunk that came well after its worker heard swap n was served everywhere names swap n or a
  later one (ASYNC: SWAP-ASYNC-2, the stale label); "well after" is the worker's own measure
  (`Plan.grace`), since chunks generated before the swap may still be on their way;
- after a swap that reset the prompt cache ('all'), a session's next turn reuses nothing cached
  before it (CACHE-MATRIX-ALL-SAME): told by the deployment's own labels, the previous turn's
  last chunk named a snapshot before that swap and this turn's first one a snapshot after it
  (labels caught lying, turns between that could not be dated, and a previous turn that
  overlapped the reset, whose labels cannot be checked inside the grace, leave it unjudged).

Where a worker's late hearing of a swap could make a verdict wrong, the judge takes the side of
the deployment: a 425 under SYNC is never placed outside a swap, and a chunk may name a snapshot
the worker had not heard of yet (never one the trainer had not loaded).

Each clause's verdict counts the streams it judged and the ones that broke it, with up to
`EXAMPLES` of the exchanges that prove it; verdicts of several judges (one per worker) merge.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from itertools import pairwise
from typing import Any, Literal

from pytest_rlrollout.contract.outcomes import Outcome
from pytest_rlrollout.remote.stream import Stream
from pytest_rlrollout.remote.stream import span_problems as uncovered

EXAMPLES = 5  # exchanges kept per violated clause
FINISHED = ("stop", "length", "tool_calls")  # the finish reasons a whole stream may end with
Transition = Literal["ASYNC", "SYNC"]


@dataclass(frozen=True)
class Heard:
    """The last swap a worker had heard was signalled, and the last it had heard every replica
    served (epochs; 0 before the first swap)."""

    signalled: int = 0
    served: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.served <= self.signalled:
            raise ValueError(f"a swap is served only after it is signalled: {self}")


@dataclass(frozen=True)
class Turn:
    """One turn of a rollout: one streamed request, as the worker that sent it saw it."""

    worker: str
    session: str
    index: int  # the turn's place in its session (0: the first request)
    sent: Heard  # what the worker had heard when it sent the request
    ended: Heard  # ... and when the stream ended (or failed)
    status: int  # the HTTP status; 0: no answer (the connection dropped)
    identities: tuple[str | None, ...] = ()  # each chunk's snapshot ('@' suffix of its model); None: it named none
    finish_reason: str | None = None
    done: bool = False  # data: [DONE] was read
    tokens: int = 0  # completion tokens streamed
    usage_tokens: int | None = None  # usage.completion_tokens of the final chunk
    exchange: str = ""  # the request and an excerpt of the answer (no key), shown when the stream breaks a clause
    cached: int | None = None  # prompt tokens the deployment reported served from its cache
    settled: tuple[int, ...] = ()  # per chunk: the last swap its worker had heard served, `grace` before it came
    # where the engine says versions as spans over the output (vLLM, SGLang): what keeps them from
    # covering it exactly once (VER-SPAN-1; () when they do); None where it sends none
    span_problems: tuple[str, ...] | None = None
    replica: str | None = None  # the replica that served it, where the deployment names it (a fleet: the engine)

    @classmethod
    def seen(
        cls,
        stream: Stream,
        *,
        worker: str,
        session: str,
        index: int,
        sent: Heard,
        ended: Heard,
        exchange: str = "",
        settled: tuple[int, ...] = (),
    ) -> Turn:
        """The turn a worker saw in `stream`, a streamed completion as the remote client parsed it
        through its engine's reading: every chunk's snapshot (vLLM's spans mapped onto the chunks
        by the reading), the tokens its logprobs entries count (a soak always asks for logprobs),
        and how it ended."""
        usage = stream.usage if isinstance(stream.usage, dict) else {}
        counted = usage.get("completion_tokens")
        spans = stream.spans
        problems = None if spans is None else tuple(uncovered(spans, len(stream.entries)))
        return cls(
            worker,
            session,
            index,
            sent,
            ended,
            stream.status,
            tuple(stream.versions),
            stream.finish_reason,
            stream.done,
            len(stream.entries),
            counted if type(counted) is int else None,
            exchange,
            stream.cached,
            settled,
            problems,
            stream.replica,
        )

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["sent"], doc["ended"] = [self.sent.signalled, self.sent.served], [self.ended.signalled, self.ended.served]
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Turn:
        known = {f.name for f in fields(cls)}
        if set(doc) != known:
            raise ValueError(f"a turn record with fields {sorted(doc)}, not {sorted(known)}")
        problems = doc["span_problems"]
        return cls(
            **{
                **doc,
                "sent": Heard(*doc["sent"]),
                "ended": Heard(*doc["ended"]),
                "identities": tuple(doc["identities"]),
                "settled": tuple(doc["settled"]),
                "span_problems": None if problems is None else tuple(problems),
            }
        )

    def overlapped(self) -> range:
        """The swaps this stream overlapped: sent before every replica served them, ended after
        they were signalled."""
        return range(self.sent.served + 1, self.ended.signalled + 1)


@dataclass
class Verdict:
    """One clause over a soak: the streams it judged, the ones that broke it, examples of those."""

    clause: str
    judged: int = 0
    violations: int = 0
    examples: list[str] = field(default_factory=list)
    # streams that ended whole but could not be counted (no usage or no logprobs on the stream):
    # whether they restarted is unknown, so they are not judged; said when nothing else was
    uncounted: int = 0

    @property
    def outcome(self) -> Outcome:
        if self.violations:
            return Outcome.FAIL
        return Outcome.PASS if self.judged else Outcome.INCONCLUSIVE

    def merge(self, other: Verdict) -> Verdict:
        if other.clause != self.clause:
            raise ValueError(f"cannot merge {other.clause} into {self.clause}")
        examples = (self.examples + other.examples)[:EXAMPLES]
        return Verdict(
            self.clause,
            self.judged + other.judged,
            self.violations + other.violations,
            examples,
            self.uncounted + other.uncounted,
        )


class Judge:
    """Judges streams as they come, against the snapshots the trainer loaded in order
    (`loaded[n]` is swap n's; `loaded[0]` what was served at the start). Each load has an
    identity of its own, so a chunk's identity names its swap."""

    def __init__(self, transition: Transition, loaded: Sequence[str], *, versions: bool = True):
        if transition not in ("ASYNC", "SYNC"):
            raise ValueError(f"transition {transition!r}: ASYNC or SYNC")
        if not loaded:
            raise ValueError("the snapshot served at the start is needed (loaded[0])")
        self.transition = transition
        self.versions = versions  # the deployment names a policy version per chunk (else nothing reads them)
        self.loaded: list[str] = []
        self.resets: list[str] = []  # each swap's reset_prompt_cache ('all', 'new_session', 'none')
        self._epoch: dict[str, int] = {}
        # (worker, session) -> the epoch its last turn ended on, and the swaps that turn overlapped
        self._last: dict[tuple[str, str], tuple[int, range]] = {}
        self.verdicts: dict[str, Verdict] = {}
        for identity in loaded:
            self.swapped(identity)

    def swapped(self, identity: str, reset: str = "all") -> int:
        """The trainer signalled its next swap, to `identity`, resetting the prompt cache as
        `reset` says: its epoch."""
        if identity in self._epoch:
            raise ValueError(
                f"{identity} was loaded before (swap {self._epoch[identity]}): each load needs an identity of its own"
            )
        self._epoch[identity] = len(self.loaded)
        self.loaded.append(identity)
        self.resets.append(reset)
        return len(self.loaded) - 1

    def judge_all(self, turns: Iterable[Turn]) -> None:
        for turn in turns:
            self.judge(turn)

    def judge(self, s: Turn) -> None:
        """Judge one turn's stream, once the trainer's swaps up to its end are known (`swapped`):
        a worker hears of a swap after it is signalled, so a chunk may name a snapshot the worker
        had not heard of yet, never one the trainer had not loaded."""
        if s.ended.signalled >= len(self.loaded):
            raise ValueError(f"{s.worker} heard of swap {s.ended.signalled}; the trainer made {len(self.loaded) - 1}")
        asynchronous = self.transition == "ASYNC"
        during = s.sent.signalled > s.sent.served  # sent while a swap was under way, as far as the worker knew
        if asynchronous and (during or s.status == 425):  # ASYNC queues (no drain timeout is sent)
            self._rule(
                "SWAP-ASYNC-3",
                s,
                s.status != 200,
                f"sent {'during swap ' + str(s.sent.signalled) if during else 'under ASYNC'}: "
                f"answered {s.status or 'nothing'}, not queued",
            )
        if s.status == 425:
            if not asynchronous:  # a worker hears of a swap only after it started: never held against SYNC
                self._rule("SWAP-SYNC-2", s, False, "")
            return  # refused before any KV was computed: the session's previous turn still dates its cache
        # any other answer may have left KV of its own: the session's next turn is dated by this
        # one, or (where this one cannot be dated) not at all
        before = self._last.pop((s.worker, s.session), None)
        if s.status != 200:
            self._rule("INF-SSE-1", s, True, f"answered {s.status or 'nothing (the connection dropped)'}")
            return
        if self.versions:
            unknown = sorted({"no snapshot" if i is None else i for i in s.identities if i not in self._epoch})
            named = f"chunks name {', '.join(unknown)}: no snapshot the trainer loaded ({', '.join(self.loaded)})"
            if s.span_problems is None:
                self._rule("VER-STREAM-1", s, bool(unknown), named)
            else:  # versions said as spans: VER-SPAN-1 asks for both their cover and their names
                why = "; ".join(
                    [*s.span_problems, *([named.replace("chunks", "spans over chunks")] if unknown else [])]
                )
                self._rule("VER-SPAN-1", s, bool(unknown or s.span_problems), why)
        epochs = [self._epoch[i] for i in s.identities if i in self._epoch] if self.versions else []
        moves = [(a, b) for a, b in pairwise(epochs) if a != b]
        # where no version is said, what the worker heard still tells a stream that crossed a swap
        crossed = bool(s.overlapped()) or bool(moves)
        if crossed and asynchronous and _ended(s) and not _countable(s):
            self.verdicts.setdefault("SWAP-ASYNC-1", Verdict("SWAP-ASYNC-1")).uncounted += 1
        elif crossed and asynchronous:
            self._rule("SWAP-ASYNC-1", s, not _whole(s), f"a stream across a swap {_how(s)}")
        else:
            self._rule("INF-SSE-1", s, not _whole(s), _how(s))
        if not epochs or len(epochs) != len(s.identities):
            return
        path = " -> ".join(self.loaded[e] for e in _runs(epochs))
        self._rule(
            "SWAP-NEW-1",
            s,
            epochs[0] < s.sent.served,
            f"sent after every replica served {self.loaded[s.sent.served]} (swap {s.sent.served}), "
            f"answered by {self.loaded[epochs[0]]} (swap {epochs[0]})",
        )
        stale = next((i for i, (e, heard) in enumerate(zip(epochs, s.settled, strict=False)) if e < heard), None)
        back = any(b < a for a, b in moves)  # the snapshot went back along the stream
        if asynchronous and (crossed or stale is not None):
            why = f"the snapshot went back: {path}" if back else ""
            if stale is not None and not back:
                why = (
                    f"chunk {stale} of {len(epochs)} names {self.loaded[epochs[stale]]}, though its worker had heard "
                    f"every replica served {self.loaded[s.settled[stale]]} before it came"
                )
            self._rule("SWAP-ASYNC-2", s, back or stale is not None, why)
        elif crossed:
            self._rule("SWAP-SYNC-1", s, bool(moves), f"a stream in flight at a swap changed snapshot: {path}")
        # labels caught lying date nothing: a stale one (SWAP-ASYNC-2) would date KV computed after
        # a swap before it, spans with a gap (VER-SPAN-1) may give a token the next span's snapshot
        if stale is None and not back and not s.span_problems:
            self._cache(s, epochs, before)

    def _cache(self, s: Turn, epochs: list[int], previous: tuple[int, range] | None) -> None:
        """CACHE-MATRIX-ALL-SAME across the swaps between a session's previous turn (which ended
        on epoch `before`) and this one (which began on `epochs[0]`), both dated by their labels.
        A previous turn that overlapped the reset leaves this one unjudged: a stale label inside
        the worker's grace cannot be caught, and would date KV computed after the reset before it."""
        self._last[(s.worker, s.session)] = (epochs[-1], s.overlapped())
        if previous is None or s.cached is None:
            return
        before, straddled = previous
        resets = [m for m in range(before + 1, epochs[0] + 1) if self.resets[m] == "all"]
        if resets and not any(m in straddled for m in resets):
            self._rule(
                "CACHE-MATRIX-ALL-SAME",
                s,
                s.cached > 0,
                f"{s.cached} prompt tokens served from the cache, though swap {resets[-1]} "
                f"({self.loaded[resets[-1]]}) reset it ('all') after the session's previous turn",
            )

    def _rule(self, clause: str, s: Turn, broken: bool, why: str) -> None:
        self.record(
            clause, broken, lambda: f"{s.worker} session {s.session} turn {s.index}: {why}\n{s.exchange}".rstrip()
        )

    def record(self, clause: str, broken: bool, example: Callable[[], str]) -> None:
        """One judgement of `clause` (a turn's, or the trainer's of a swap); `example` says what
        broke it, asked for only while fewer than EXAMPLES are kept."""
        v = self.verdicts.setdefault(clause, Verdict(clause))
        v.judged += 1
        if broken:
            v.violations += 1
            if len(v.examples) < EXAMPLES:
                v.examples.append(example())


def _ended(s: Turn) -> bool:
    """The stream ended as every stream must: a finish reason and [DONE] (INF-SSE-1 asks no more)."""
    return s.done and s.finish_reason in FINISHED


def _countable(s: Turn) -> bool:
    """The stream says how many tokens it carried twice, so a restart would show: usage (an option,
    stream_options.include_usage, a server may ignore) and logprobs entries (likewise)."""
    return s.usage_tokens is not None and s.tokens > 0


def _whole(s: Turn) -> bool:
    """Ended, and where the stream can be counted, not restarted: usage counts what came."""
    return _ended(s) and (not _countable(s) or s.usage_tokens == s.tokens)


def _how(s: Turn) -> str:
    return (
        f"ended with finish_reason {s.finish_reason!r}, [DONE] {'read' if s.done else 'missing'}, "
        f"{s.tokens} tokens streamed, usage {s.usage_tokens}"
    )


def _runs(epochs: Sequence[int]) -> list[int]:
    """The epochs with repeats folded: [0, 0, 1, 1, 0] -> [0, 1, 0]."""
    return [e for i, e in enumerate(epochs) if i == 0 or e != epochs[i - 1]]


def merged(verdicts: Iterable[dict[str, Verdict]]) -> dict[str, Verdict]:
    """Several judges' verdicts (one per worker) as one."""
    out: dict[str, Verdict] = {}
    for each in verdicts:
        for clause, v in each.items():
            out[clause] = out[clause].merge(v) if clause in out else Verdict(clause).merge(v)
    return out
