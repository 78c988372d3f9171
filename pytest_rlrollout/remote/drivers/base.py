"""The driver seam: everything the suite does to, and reads from, a deployment, in the contract's
terms. A clause states an intent; a driver is one engine's binding of the intents it has. The
conformance tests speak this protocol only: what differs between engines lives in the drivers.

What a test sends is the contract's request vocabulary (a completion body with `prompt`,
`max_tokens`, `logprobs`, `echo`, `prompt_cache_isolation_key`, ...; the headers
`x-multi-turn-session-id` and `x-prompt-cache-isolation-key`), and a snapshot signal as the
snapshot factory builds it. A driver sends them on its engine's wire and hands back what the
engine answered, parsed into a `Stream` whose `Reading` knows where that engine puts versions
and logprobs, and replicas in the hot-load status's shape (`readiness`,
`current_snapshot_identity`, `loading_state`). A driver re-shapes; it never fills in what an
engine did not say, and it never retries a refusal into a success.

An intent an engine has no binding for raises `Unbound`; the catalogue already keeps the tests
of such clauses from running (`not-applicable`), so reaching one is a suite error.
"""

from __future__ import annotations

import math
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Unpack, get_args

from pytest_rlrollout.engines import Engine
from pytest_rlrollout.remote.options import CompletionOptions, LoadOptions
from pytest_rlrollout.remote.polling import ticks
from pytest_rlrollout.remote.stream import CONTRACT_READING, Reading, Stream, as_object

if TYPE_CHECKING:
    import httpx

    from pytest_rlrollout.engines.spec import EngineSpec
    from pytest_rlrollout.remote.client import DeploymentClient
    from pytest_rlrollout.remote.discovery import Answered, Discovery
    from pytest_rlrollout.remote.replicas import Waited
    from pytest_rlrollout.remote.target import Target

_STATUS_READ: dict[str, float] = {}  # when this process last read each deployment's status
_STATUS_READ_LOCK = threading.Lock()
PAUSE_MODES = ("abort", "wait", "keep")  # what in-flight requests do while generation is paused


def reset_policy(signal: dict[str, Any]) -> Any:
    """A signal's reset_prompt_cache as the contract names it: 'all' when absent, the official
    SDK's booleans as 'all' / 'none'; any other value as it is (the engine's binding decides)."""
    policy = signal.get("reset_prompt_cache", "all")
    return {True: "all", False: "none", None: "all"}.get(policy, policy)


def registered(engine: EngineSpec) -> Engine:
    """An engine module's name as the registry's `Engine`: what a driver's `engine` is (a name
    the registry does not list is a mistake in that module, raised when its driver is defined)."""
    names: tuple[Engine, ...] = get_args(Engine)
    for name in names:
        if name == engine.name:
            return name
    raise ValueError(f"{engine.name!r} is not an engine the registry lists")


class Unbound(NotImplementedError):
    """The engine has no binding for this intent."""

    def __init__(self, engine: str, intent: str):
        super().__init__(f"no {engine} binding for {intent}")
        self.engine, self.intent = engine, intent


@dataclass
class Status:
    """What the deployment says it serves: the raw answer (evidence), the replicas in the
    hot-load status's shape, and what the engine's binding of HL-GET-1 finds wrong in it."""

    response: httpx.Response
    replicas: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # why nothing could be read though nothing is wrong (CoreWeave before its first hot-load)
    unread: str | None = None


class Driver(ABC):
    """One engine's binding of the contract's intents, over a bounded `DeploymentClient` (its
    exchanges are the tests' evidence; its transport records and replays)."""

    engine: ClassVar[Engine]
    reading: ClassVar[Reading] = CONTRACT_READING
    # how a swap treats requests in flight: ASYNC (they continue on the new weights) or SYNC (they
    # finish on the old ones first); None: the deployment says, or the options do
    transition: ClassVar[str | None] = None
    # a load pauses generation, keeping the requests in flight, until the new weights serve (vLLM's
    # keep, SGLang's retract): a stream in flight at the signal is held across the swap, however
    # long it takes. Otherwise the swap happens when the deployment gets to it, and a stream is
    # kept in flight until the status shows it done (`suite.observe.across_swap`).
    holds_streams: ClassVar[bool] = False
    # the deployment's routed path takes token-id prompts: the tests' prompts are token ids where
    # the deployment takes them (False: a gateway whose OpenAI routes take text only, its token-id
    # answers reached another way; the tests prompt in text)
    prompts_in_ids: ClassVar[bool] = True
    # the reset_prompt_cache values a load binds (a signal with another is Unbound: not-applicable)
    reset_policies: ClassVar[tuple[str, ...]] = ("all", "new_session", "none")

    def __init__(self, client: DeploymentClient):
        self.client = client
        # seconds a load request may take before it answers, where the engine answers a load
        # once it is done (vLLM's reload, SGLang's update from disk): the run's swap timeout
        self.load_wait: float | None = None
        # the served model's config.json, when the run has a local copy (--rl-base-snapshot):
        # engines whose routing rows cover every hidden layer keep the MoE layers' by it
        self.served_config: dict[str, Any] | None = None
        # while a swap is under way (`swapping`, from its signal until it is followed to its
        # end), the least time between two status reads of this deployment from this process (the
        # run's poll interval), however the reads come: a wait's polls, a probe's, a test's own
        self.status_gap = 0.0
        self.swapping = False

    # --------------------------------------------------------------------- the preflight's

    @classmethod
    def claims(cls, target: Target) -> bool:
        """Whether the names given point to this engine before anything is asked (a control plane
        of its own, a fleet's engines): `--rl-engine auto` asks its driver first."""
        return False

    @classmethod
    def recognises(cls, client: DeploymentClient, seen: Answered) -> str | None:
        """Why what answers is this engine (`--rl-engine auto`), or None. Reads only; `seen` holds
        what the preflight read first, and any read an engine caches there for another's check."""
        return None

    @classmethod
    def check_names(cls, client: DeploymentClient, seen: Answered, decided: str) -> None:
        """Raise PreflightError saying what to fix when the names given do not fit this engine's
        deployment (nothing to check by default: a server at a URL)."""
        return None

    @property
    def target(self) -> Target:
        return self.client.target

    def unbound(self, intent: str) -> Unbound:
        return Unbound(self.engine, intent)

    # ----------------------------------------------------------------------- inference

    def complete(
        self,
        body: dict[str, Any],
        **options: Unpack[CompletionOptions],
    ) -> Stream:
        """A completion in the contract's vocabulary, sent on the engine's wire (streamed when
        `body["stream"]`; `on_chunk` sees every chunk as it arrives, `on_status` the answer's
        status as soon as its head arrives). Here: as it is, to the OpenAI completions endpoint
        (the contract's own wire)."""
        return self.client.complete(body, reading=self.reading, **options)

    def find_version_route(self) -> int:
        """Where the engine's answers say the policy version only on a route of its own that a
        client made without the preflight does not know of (vLLM's generate route), find it once,
        so that completions go there; the requests it took (at most one one-token request). Here:
        none, the answers on the default route say the version where the engine says it at all."""
        return 0

    def post_inference(self, content: bytes, *, chat: bool = False) -> httpx.Response:
        """Raw bytes to the OpenAI completions endpoint (malformed requests on purpose)."""
        return self.client.post_inference(content, chat=chat)

    # ----------------------------------------------------------------------- what is served

    def status(self, *, headers: dict[str, str] | None = None) -> Status:
        raise self.unbound("reading what each replica serves")

    def read_status(self, *, headers: dict[str, str] | None = None) -> Status:
        """`status()`; while a swap is under way, read no sooner than `status_gap` after the
        previous read: a deployment swapping for minutes is asked at most 1 / `status_gap` times
        a second."""
        if self.swapping and self.status_gap > 0:
            where = f"{self.target.base_url} {self.target.deployment}"
            with _STATUS_READ_LOCK:
                early = _STATUS_READ.get(where, -math.inf) + self.status_gap - time.monotonic()
                if early > 0:  # a pace kept, not a condition waited for
                    time.sleep(early)
                _STATUS_READ[where] = time.monotonic()
        return self.status(headers=headers)

    def replicas(self) -> list[dict[str, Any]]:
        """Every replica in the hot-load status's shape; [] when that cannot be read."""
        try:
            return self.read_status().replicas
        except Unbound:
            return []

    def wait(
        self,
        identity: str,
        *,
        timeout: float,
        poll: float,
        lora: bool = False,
        progress: Callable[[list[dict[str, Any]]], None] | None = None,
        stalled_after: float | None = None,
        first_poll: float | None = None,
    ) -> Waited:
        """Poll `status()` (backing off from `first_poll`, default 10 ms, to `poll`) until every replica serves `identity`
        (LoRA: lists it as loaded), a replica reports stage 'error' for it, or the deadline passes.
        An answer other than 200 is polled past (a deployment may not answer while it swaps); a
        200 whose replicas cannot be read ends the wait (HL-GET-1). With `stalled_after`, also
        give up once some replicas serve it and no replica has been loading for that long (a
        rollout that stopped part-way)."""
        from pytest_rlrollout.remote.replicas import FIRST_POLL, Waited, WaitEnd, busy, serves

        replicas: list[dict[str, Any]] = []
        stalled_since: float | None = None
        for elapsed in ticks(timeout, poll, start=min(poll, FIRST_POLL if first_poll is None else first_poll)):
            status = self.read_status()
            if status.response.status_code != 200:
                continue
            if not status.replicas and status.problems:
                return Waited(WaitEnd.UNREADABLE, elapsed, [], f"{'; '.join(status.problems)} (HL-GET-1)")
            replicas = status.replicas
            if progress is not None:
                progress(replicas)
            if replicas and all(serves(x, identity, lora) for x in replicas):
                return Waited(WaitEnd.SERVED, elapsed, replicas)
            for x in replicas:
                state = as_object(x.get("loading_state"))
                if state.get("stage") == "error" and state.get("target_snapshot_identity") == identity:
                    return Waited(WaitEnd.FAILED, elapsed, replicas, str(state.get("error") or "load failed"))
            partial = any(serves(x, identity, lora) for x in replicas) and not any(map(busy, replicas))
            stalled_since = (stalled_since if stalled_since is not None else elapsed) if partial else None
            if stalled_after is not None and stalled_since is not None and elapsed - stalled_since > stalled_after:
                behind = ", ".join(
                    f"{x.get('name', f'replica {i}')} still serves {x.get('current_snapshot_identity')!r}"
                    for i, x in enumerate(replicas)
                    if not serves(x, identity, lora)
                )
                return Waited(WaitEnd.STALLED, elapsed, replicas, f"the rollout stopped: {behind}")
        return Waited(WaitEnd.TIMED_OUT, timeout, replicas, f"not served within {timeout} s")

    # ----------------------------------------------------------------------- changing what is served

    def load(
        self,
        signal: dict[str, Any],
        **options: Unpack[LoadOptions],
    ) -> httpx.Response:
        """Load the snapshot `signal` names (the factory's signal body: `identity`, and
        `incremental_snapshot_metadata` / `reset_prompt_cache` where given); the answer of the
        engine's load request, or of the step that refused it.

        `midway` is called in the middle of the swap where the swap is a sequence of requests
        this side sends (vLLM: the new weights loaded, generation still paused), and the swap
        goes on once it returns: what a test does there happens while the swap is under way. An
        engine that swaps on its own after one signal (Fireworks) never calls it: its status
        shows the swap in progress instead."""
        raise self.unbound("loading a snapshot")

    def busy(self, answer: httpx.Response) -> bool:
        """Whether `answer` to a load refuses it only because another load is in progress (one
        load at a time): the load is signalled again, as a trainer's client would. Fireworks
        says so with a 409; a 409 about the ledger is a refusal of its own."""
        return answer.status_code == 409 and "ledger" not in answer.text

    def reset_ledger(self) -> httpx.Response:
        raise self.unbound("resetting the ledger")

    def ledger(self) -> httpx.Response:
        raise self.unbound("reading the ledger")

    def hint(self, identity: str, file: str) -> httpx.Response:
        raise self.unbound("hot-load hints")

    # ----------------------------------------------------------------------- control

    def pause(self, mode: str, *, clear_cache: bool = False) -> httpx.Response:
        """Pause generation; `mode` is one of PAUSE_MODES (any other string is sent as it is:
        CTL-PAUSE-5 asks what the engine makes of it)."""
        raise self.unbound("pausing generation")

    def resume(self) -> httpx.Response:
        raise self.unbound("resuming generation")

    def paused(self) -> bool | None:
        """Whether generation is paused (None: the engine's answer does not say)."""
        raise self.unbound("asking whether generation is paused")

    def reset_cache(self) -> httpx.Response:
        """Reset the prompt cache (every prefix computed before it)."""
        raise self.unbound("a prompt-cache reset on request")

    def set_label(self, label: str) -> httpx.Response:
        """Publish `label` as the policy version of what is served, changing no weights."""
        raise self.unbound("setting the policy label")

    def started_from(self) -> str | None:
        """The directory the engine loaded at start-up, where it says (None: it does not)."""
        return None

    def start_label(self) -> str | None:
        """The label an engine gives the weights it started with, until one is published (None:
        the engine has no such label; Fireworks names snapshots by their identity)."""
        return None

    def restore(self, label: str) -> str | None:
        """Serve the start of a run again, `label` being what it served; what was done, or None
        where the engine cannot (the report then says how to restore by hand)."""
        return None

    def signal_again(self, label: str, *, poll: float = 0.5) -> str:
        """`restore` where snapshots are signalled by identity (Fireworks, CoreWeave): the start
        identity signalled again as a full snapshot, the prompt cache reset, and waited for up to
        the swap timeout. A deployment whose bucket no longer holds it, or that takes no identity
        twice, refuses: the refusal is what is said."""
        r = self.load({"identity": label, "reset_prompt_cache": "all"})
        if r.status_code != 200:
            return f"not restored: signalling {label} again got HTTP {r.status_code} {r.text[:200]}"
        self.swapping = True  # polled at the run's pace, as every swap of the run was
        try:
            waited = self.wait(
                label,
                timeout=self.load_wait or 900.0,
                poll=max(poll, self.status_gap),
                first_poll=self.status_gap or None,
            )
        finally:
            self.swapping = False
        if not waited.ok:
            return f"signalled {label} again, but it was not served: {waited.error}"
        return f"signalled {label} again (a full snapshot the bucket still holds); every replica serves it"

    # ----------------------------------------------------------------------- discovery

    def adopt(self, found: Discovery) -> None:  # noqa: B027 (a hook: most drivers keep nothing of it)
        """Take what the probes found (an xdist worker's driver, from the controller's preflight)."""

    @abstractmethod
    def discover(self, *, transition: str | None, decided: str) -> Discovery:
        """The capability vocabulary, probed without changing anything; `decided` says how the
        engine was chosen."""
