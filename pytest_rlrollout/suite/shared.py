"""Swaps shared by the tests that can be judged on one swap: the core profile's fewest swaps.

A test asks `rl_shared(share, part)` for what one part saw around a swap signalled with the
share's fields (`Share`: a reset_prompt_cache value or none, or `COPY`, the base in full). Under
the core profile the run's first test of a share makes the swap once for every test of the run
that names that share (its `rl_shares` mark): each part's `before` runs, then the signal (with
streams kept across it and requests sent during it where `crossing` and `probes` are asked
for), then each part's `after`, and the other tests judge what it saw. In any other profile each
test makes its own swap of the share with its own parts.

A shared swap carries the share's change (`share_for`), so each test of it can tell the weights
before from the weights after, in every profile.

Parts are registered by the modules that judge them (`part(...)`), before any test runs; their
`after`s run in the order they were registered in, a `first` part's before the others."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from pytest_rlrollout.runs.plan import End, Load, served
from pytest_rlrollout.suite.evidence import observed

if TYPE_CHECKING:
    from pytest_rlrollout.suite.deployment import RLDeployment
    from pytest_rlrollout.suite.evidence import Observed, Timeline
    from pytest_rlrollout.suite.swaps import Swapper, SwapResult

CROSSING = "crossing"  # the part that is a stream kept across the swap (`crossing.across_swap`)
PROBES = "probes"  # the part that is requests sent while the swap is under way (`probing.Probes`)
DURING = (CROSSING, PROBES)  # parts observed while the swap is under way, not before and after it


@dataclass(frozen=True)
class Share:
    """What tests share a swap by: the fields the signal carries, and the change a shared swap makes."""

    reset_prompt_cache: str | None = None  # None: the field left out
    change: str = "visible"  # a change by name (`SnapshotFactory.change`), relative to what is served
    how: str = "step"  # step (a sentinel diff, or a full snapshot: the factory decides) | copy (of the base)

    @property
    def signal(self) -> dict[str, Any]:
        return {} if self.reset_prompt_cache is None else {"reset_prompt_cache": self.reset_prompt_cache}

    @property
    def name(self) -> str:
        return f"shared-{self.reset_prompt_cache or 'default'}" + ("-copy" if self.how == "copy" else "")

    def loads(self, has: Callable[[str], bool], end: End = "served") -> list[Load]:
        """What its swap loads, for the plan: a copy follows a ledger reset where there is a ledger."""
        if self.how != "copy":
            return [dataclasses.replace(served(change=self.change), end=end)]
        return ([Load("reset")] if has("ledger") else []) + [dataclasses.replace(served("copy"), end=end)]


def share_for(reset_prompt_cache: str | None) -> Share:
    """The run's one share for a reset_prompt_cache value (None: the field left out). The default
    doubles (or halves) every logit (FID-SWAP-1, and SWAP-ASYNC-2 by its numbers, judge it by
    that), and where swaps are diffs scales the experts; `all` and `new_session` change a layer's
    input norm and the experts (through the KV: FID-CACHE-1; other weights: FID-SAME-1); `none`
    goes back to the base's weights, by a diff on a diff from other experts where swaps are diffs
    (FID-SAME-1's path back: the core profile makes the shares in the reset matrix's order,
    the default first, then `all`, `new_session`, `none`)."""
    change = {None: "moved", "none": "none"}.get(reset_prompt_cache, "away-kv")
    return Share(reset_prompt_cache, change)


# the base in full under a new identity (a copy inside the bucket), after a ledger reset where the
# deployment keeps one: a swap that starts the chain over (FID-SAME-1's path "after a ledger reset")
COPY = Share(change="none", how="copy")
LEDGER = "ledger-reset"  # what COPY's ledger reset was answered (None: no ledger)
OWN = (*DURING, LEDGER)  # parts the swap itself observes (no part registered for them)


@dataclass(frozen=True)
class Part:
    """One thing observed around a shared swap: `before(dep, name)` before the signal (what the
    swap is judged against), `after(dep, before, swapped)` once the swap ended, however it ended."""

    name: str
    before: Callable[[RLDeployment, str], Any]
    after: Callable[[RLDeployment, Any, SwapResult], Any]
    first: bool = False  # its `after` is about the very first requests once the swap is served


PARTS: dict[str, Part] = {}


def part(
    name: str,
    before: Callable[[RLDeployment, str], Any],
    after: Callable[[RLDeployment, Any, SwapResult], Any],
    *,
    first: bool = False,
) -> Part:
    """Register a part (a module that judges it does, at import; imported again, as pytester
    does, it registers it again). A part whose `after` must send the first requests once the
    swap is served (`first`: SWAP-NEW-1's) runs before the others."""
    known = PARTS.get(name)
    if name in OWN or (known is not None and _where(known.before) != _where(before)):
        raise ValueError(f"a part named {name!r} is registered already")
    PARTS[name] = Part(name, before, after, first)
    return PARTS[name]


def _where(fn: Callable[..., Any]) -> str:
    return fn.__code__.co_filename


Given = Callable[[dict[str, Any]], Any]  # a function of the test's parameters


def shares(of: Given, *parts: str | Given) -> pytest.MarkDecorator:
    """`rl_shares`: the test is judged on the swaps of the shares `of(params)` gives (one, or a
    list), and needs `parts` observed around them (names, or functions of the parameters giving
    one). Its `rl_loads` declare one `runs.plan.shared()` load for each share, in that order."""
    return pytest.mark.rl_shares.with_args(of, *parts)


def share_of(item: pytest.Item) -> tuple[list[Share], tuple[str, ...]]:
    """The shares an item's `rl_shares` mark names, and the parts it needs."""
    mark = item.get_closest_marker("rl_shares")
    if mark is None:
        return [], ()
    callspec = getattr(item, "callspec", None)
    params = dict(callspec.params) if callspec is not None else {}
    named = mark.args[0](params)
    return ([named] if isinstance(named, Share) else list(named)), tuple(
        p(params) if callable(p) else p for p in mark.args[1:]
    )


def shared_loads(
    config: pytest.Config, item: pytest.Item, loads: Sequence[Load], sharing: bool, has: Callable[[str], bool]
) -> list[Load]:
    """A test's loads in the plan: each `Load("shared")` it declares is the swap of its next
    share (in the order `rl_shares` names them), built as the share builds it and ending as
    declared (served, or left unsignalled where the engine binds no such signal). Under the core
    profile a share's swap is the first test's of the share only: later tests of it load nothing."""
    shares_, _ = share_of(item)
    declared = [load for load in loads if load.how == "shared"]
    if len(declared) != len(shares_):
        raise TypeError(f"{item.nodeid}: {len(declared)} shared loads declared for {len(shares_)} shares")
    made, named, out = set(planned_shares(config)) if sharing else set(), iter(shares_), []
    for load in loads:
        if load.how != "shared":
            out.append(load)
            continue
        share = next(named)
        if share not in made:
            out += share.loads(has, load.end)
            made |= {share} if sharing else set()  # (a share named twice by one test is made once)
    return out


def share_planned(config: pytest.Config, item: pytest.Item) -> None:
    """The test was planned to run: under the core profile the shares it names are made by it,
    or were before it."""
    shares_, _ = share_of(item)
    planned_shares(config).update(shares_)


@dataclass
class SharedSwap:
    """One swap and what each part saw around it."""

    share: Share
    made_by: str  # the test that made it
    results: dict[str, Any] = field(default_factory=dict)  # part -> what `after` gave, or what it raised
    timeline: Timeline | None = None
    error: BaseException | None = None  # the swap itself could not be signalled (every test of it says so)

    def result(self, name: str) -> Any:
        if self.error is not None:
            raise self.error
        got = self.results[name]
        if isinstance(got, BaseException):
            raise got
        return got


MADE = pytest.StashKey[dict[Share, SharedSwap]]()
# the shares the run's plan gave to a test (the first of each): a later test of one plans none of its loads
PLANNED = pytest.StashKey[set[Share]]()


def planned_shares(config: pytest.Config) -> set[Share]:
    return config.stash.setdefault(PLANNED, set())


class SharedSwaps:
    """`rl_shared`: `rl_shared(share, part)` is what `part` saw around the share's swap."""

    def __init__(self, request: pytest.FixtureRequest, deployment: RLDeployment, swap: Swapper, seen: Observed):
        self.request, self.deployment, self.swap, self.seen = request, deployment, swap, seen

    @property
    def sharing(self) -> bool:
        return self.deployment.options.budget.shares_swaps

    def __call__(self, share: Share, name: str) -> Any:
        """What part `name` saw around `share`'s swap (see `parts`)."""
        return self.parts(share, [name])[name]

    def parts(self, share: Share, names: Sequence[str]) -> dict[str, Any]:
        """What each part of `names` saw around `share`'s swap: under the core profile the swap
        the run's first test of the share made (with every part its tests need), else one this
        test makes now with these parts alone (its prompts named after the test)."""
        if not self.sharing:
            # named after the test and the share: a part asked of several shares of one test
            # (FID-SAME-1's fingerprints) must not meet its own prompts cached by another swap
            made = self.make(share, list(names), functools.partial(named, f"{self.request.node.name}-{share.name}"))
            return {n: made.result(n) for n in names}
        shared = self.request.config.stash.setdefault(MADE, {})
        if share not in shared:
            shared[share] = self.make(share, self.parts_of(share), functools.partial(named, share.name))
        made = shared[share]
        if made.made_by != self.request.node.nodeid:
            self.seen(1, f"swap shared with {made.made_by.rpartition('::')[2]} (profile core)")
            if made.timeline is not None:
                self.seen.timeline = made.timeline
        return {n: made.result(n) for n in names}

    def parts_of(self, share: Share) -> list[str]:
        """Every part that a test of the run judging `share` needs, in the order they were registered."""
        needed = {
            p for item in self.request.session.items for s, parts in [share_of(item)] if share in s for p in parts
        }
        registered = sorted(PARTS, key=lambda p: not PARTS[p].first)  # (a stable sort: else as registered)
        return [p for p in [*OWN, *registered] if p in needed]

    def make(self, share: Share, parts: list[str], naming: Callable[[str], str]) -> SharedSwap:
        """One swap with `parts` observed around it: each `before`, the signal (a stream kept
        across it and requests sent during it where those parts are asked for), each `after`."""
        from pytest_rlrollout.suite.crossing import across_swap, crossing_body
        from pytest_rlrollout.suite.outcomes import inconclusive
        from pytest_rlrollout.suite.probing import probes_during_swap

        out = SharedSwap(share, self.request.node.nodeid)
        dep, factory = self.deployment, self.swap.factory
        try:
            change = factory.change(share.change, dep.serving())
        except LookupError as e:
            out.error = _caught(inconclusive, f"no tensor to change visibly: {e}")
            return out
        if share.how == "copy" and set(parts) & set(DURING):
            raise ValueError(f"{share.name}: a copy of the base is signalled whole; {parts} need a step")
        befores = {p: _caught(PARTS[p].before, dep, naming(p)) for p in parts if p not in OWN}
        if not set(parts) & set(DURING) and all(isinstance(b, BaseException) for b in befores.values()):
            out.results |= befores  # nothing to judge the swap against: no swap
            return out
        try:
            if CROSSING in parts:
                probes = 6 if PROBES in parts else 0
                c = across_swap(
                    dep,
                    self.swap,
                    self.seen,
                    crossing_body(dep, naming(CROSSING)),
                    change=change,
                    probes=probes,
                    **share.signal,
                )
                out.results |= {CROSSING: c, PROBES: c.probing}
                swapped = c.result
            elif PROBES in parts:
                probing = probes_during_swap(dep, self.swap, self.seen, change=change, **share.signal)
                out.results[PROBES], swapped = probing, probing.result
            elif share.how == "copy":
                out.results[LEDGER] = self._ledger_reset()
                swapped = self.swap.signal(factory.base_copy(share.name), **share.signal)
            else:
                swapped = self.swap.signal(self.swap.build(share.name, change), **share.signal)
        except pytest.skip.Exception as e:  # not signalled (no binding for a field, nothing to build)
            out.error = e
            return out
        out.timeline = self.seen.timeline
        for p, before in befores.items():
            out.results[p] = (
                before if isinstance(before, BaseException) else _caught(PARTS[p].after, dep, before, swapped)
            )
        return out

    def _ledger_reset(self) -> int | None:
        """Where the deployment keeps a ledger, reset it (the chain starts over): its answer's status."""
        if not self.deployment.capabilities.has("ledger"):
            return None
        status = self.deployment.reset_ledger().status_code
        if 200 <= status < 300:
            self.swap.factory.ledger_reset()
        return status


def named(prefix: str, part: str) -> str:
    """What a part's prompts and sessions are named after: a part about the stream across the
    swap (`crossing-…`) has the stream's prompt."""
    return f"{prefix}-{CROSSING if part.startswith(CROSSING) else part}"


def _caught(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`, or the outcome it raised (a skip, an assertion): the test judging it re-raises it."""
    try:
        return fn(*args)
    except (pytest.skip.Exception, AssertionError) as e:
        return e


@pytest.fixture
def rl_shared(request: pytest.FixtureRequest, rl_deployment: RLDeployment, rl_swap: Swapper) -> SharedSwaps:
    """`rl_shared(share, part)`: what `part` saw around the swap signalled with the share's fields;
    made by this test, or (profile core) by the run's first test of the share."""
    return SharedSwaps(request, rl_deployment, rl_swap, observed(request.node))
