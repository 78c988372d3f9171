"""A replica: its own weights, snapshot identity, loading state and prompt cache, and a worker
thread that admits requests, prefills them (reusing cached prefixes), decodes every active
request in one batched step per token, and swaps weights at a token boundary.

Generation can be paused (vLLM's pause modes): new requests are then held, not admitted, and
in-flight ones are ended (`abort`), drained (`wait`) or frozen at a token boundary (`keep`).
Everything that ends or changes in-flight requests from outside happens on the worker at a
token boundary, so no token of a request follows the event that ended it."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pytest_rlrollout.reference.model import Lora, Model, Sequence_, StepOutput, log_softmax
from pytest_rlrollout.reference.prompt_cache import Entry, PromptCache
from pytest_rlrollout.reference.sampling import SamplingParams, sample
from pytest_rlrollout.reference.settings import Settings
from pytest_rlrollout.snapshot import safetensors_io as st

log = logging.getLogger(__name__)


class TooEarly(Exception):
    """The replica is swapping weights (SYNC) or the request waited past its drain timeout."""


class Unavailable(Exception):
    """503 (only with the SWAP-SYNC-2 and CTL-PAUSE-1:refuse fault switches)."""


class Paused(Unavailable):
    """Generation is paused and the request is refused, retryable: vLLM 0.33 in abort or wait mode."""


PAUSE_MODES = ("abort", "wait", "keep")  # what a pause does to the requests in flight
# vLLM dialect's SWAP-ASYNC-1 and SWAP-KV-1 faults: a request whose KV a swap or a reset took ends
# after this many more tokens, once decoding goes on (a pause may hold it meanwhile)
DOOMED_AFTER = 8


@dataclass(eq=False)  # a job is its own identity; field-wise equality would compare arrays
class Job:
    prompt: np.ndarray
    max_tokens: int
    params: SamplingParams
    rng: np.random.Generator
    stop_ids: frozenset[int]
    session: str | None
    isolation: str | None
    want_prompt_entries: bool  # echo / echo_last: report logprobs and routing of prompt tokens
    loop: Any  # the HTTP handler's event loop and queue: events cross threads through them
    queue: Any
    drain_timeout: float
    cache_max_len: int | None = None  # prompt_cache_max_len: reuse at most this many tokens
    arrived: float = field(default_factory=time.monotonic)
    cancelled: threading.Event = field(default_factory=threading.Event)
    # decoding state
    seq: Sequence_ | None = None
    tokens: list[int] = field(default_factory=list)
    generated: int = 0
    routing: list[np.ndarray] = field(default_factory=list)  # per fed position
    token_logprobs: list[float] = field(default_factory=list)
    boundary_logits: dict[int, np.ndarray] = field(default_factory=dict)
    lora: Lora | None = None
    model: Model | None = None
    version: str = ""
    stale: bool = False  # SWAP-NEW-1 fault only: pinned to the weights before the swap
    served_by: str = ""  # the snapshot identity at admission
    # vLLM's logprobs: the N most likely tokens and the rank of the scored one, for generated
    # tokens (top_n) and prompt positions (prompt_top_n); None: neither (the Fireworks wire)
    top_n: int | None = None
    prompt_top_n: int | None = None
    prompt_scores: list[Scored] = field(default_factory=list)  # prompt positions 1.. (prompt_top_n)
    read_cache: bool = True  # False: every prompt position is computed (vLLM: prompt_logprobs asked)
    number: int = 0  # order of submission: a pause decides which requests were in flight by it
    doom: tuple[tuple[str, Any], int] | None = None  # faults only: (the event that ends it, tokens left)
    generation: int = 0  # the replica's weights generation at admission
    cache_generation: int = 0  # the prompt cache's reset generation at admission

    def sequence(self) -> Sequence_:
        """The KV an admitted request decodes on (`seq` is None until _admit starts it)."""
        if self.seq is None:
            raise RuntimeError("the request was not admitted")
        return self.seq

    def weights(self) -> Model:
        """The weights an admitted request is pinned to (`model` is None until _admit pins it)."""
        if self.model is None:
            raise RuntimeError("the request was not admitted")
        return self.model

    def emit(self, event: tuple[str, Any]) -> None:
        with contextlib.suppress(RuntimeError):  # the request's loop has closed (the server stopped)
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)


@dataclass(frozen=True)
class Scored:
    """A position's token among the alternatives (vLLM's logprobs): its rank in the vocabulary
    (1: the most likely) and the `top` most likely tokens with their logprobs, most likely first."""

    rank: int
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class Token:
    id: int
    logprob: float
    sampling_logprob: float
    routing: np.ndarray  # [L, k]
    version: str  # the policy version (snapshot identity, adapter or label) current when it was sampled
    scored: Scored | None = None  # only when the job asked for top_n


@dataclass
class PendingSwap:
    identity: str
    model: Model | None  # None: an adapter load (base weights unchanged)
    lora: Lora | None
    reset_policy: str
    on_done: Callable[[], None]


class Replica:
    def __init__(self, index: int, settings: Settings, model: Model, identity: str):
        self.index, self.settings = index, settings
        self.name = f"replica-{index}"
        self.model, self.identity = model, identity
        self.lora: Lora | None = None
        self.label: str | None = None  # vLLM's weight version: the policy version while set
        self.generation = 0  # bumped at every swap: a request that spanned one is not cached
        self.adapters: dict[str, str] = {}  # adapter identity -> status
        self.readiness = True
        self.stage, self.target = "ready", identity
        self.error: str | None = None
        self.cache = PromptCache(settings.block_size, settings.cache_entries, settings.faults)
        self._stale: tuple[Model, Lora | None, str, int] | None = None  # SWAP-NEW-1 fault only
        self._routing_memo: dict[tuple[int, ...], np.ndarray] = {}  # R3-CHANGE-1 fault only
        self.swapping = False  # inside the swap itself
        self.draining = False  # SYNC: waiting for in-flight requests before the swap
        self._pending: list[Job] = []
        self._active: list[Job] = []
        self._swap: PendingSwap | None = None
        self._deferred: tuple[PendingSwap, int] | None = None  # CTL-LABEL-1 fault: a swap after N requests
        self.paused: str | None = None  # the pause mode while generation is paused
        self._swapped_in_pause = False  # weights changed during the current pause (SWAP-ASYNC-3 fault)
        self._submitted = 0  # jobs numbered so far
        # an event that ends every request in flight at the next token boundary: (event, the last
        # job number it concerns); and whether frozen requests recompute their KV once resumed
        self._end: tuple[tuple[str, Any], int] | None = None
        self._recompute = False
        self._wait_mark = 0  # wait mode: the last job number in flight when the pause came
        self._idle = True  # the worker waits with nothing it may run (a pause has taken hold)
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------------- outside interface

    @property
    def version(self) -> str:
        """The policy version of what is served: the label when one is set (vLLM's weight
        version), else the active adapter, else the snapshot (streamed as `model@version`)."""
        if self.label is not None:
            return self.label
        return self.lora.identity if self.lora is not None else self.identity

    def load(self) -> int:
        with self._cond:
            return len(self._pending) + len(self._active)

    def submit(self, job: Job) -> None:
        with self._cond:
            f = self.settings.fault
            if self.settings.refuses_while_paused(self.paused):
                raise Paused(f"{self.name}: generation is paused ({self.paused} mode)")
            if self.paused and f("CTL-PAUSE-1:refuse"):
                raise Unavailable(f"{self.name}: generation is paused")
            if self.paused and self._swapped_in_pause and f("SWAP-ASYNC-3"):
                raise TooEarly(f"{self.name} is swapping to {self.identity}")
            if self.settings.transition == "SYNC" and (self.draining or self.swapping):
                if f("SWAP-SYNC-2"):
                    raise Unavailable(f"{self.name} is unavailable")
                raise TooEarly(f"{self.name} is swapping to {self.target}; retry with the same session key")
            if self.settings.transition == "ASYNC" and self.swapping and f("SWAP-ASYNC-3"):
                raise TooEarly(f"{self.name} is swapping to {self.target}")
            self._submitted += 1
            job.number = self._submitted
            self._pending.append(job)
            self._cond.notify_all()

    def request_swap(self, swap: PendingSwap) -> None:
        with self._cond:
            self._swap = swap
            self._cond.notify_all()

    def defer_swap(self, swap: PendingSwap, requests: int) -> None:
        """Swap only once `requests` more requests were admitted (the CTL-LABEL-1 fault)."""
        with self._cond:
            self._deferred = (swap, requests)

    # ----------------------------------------------------------------------- pause, labels, resets

    def pause(self, mode: str, recompute: bool = False) -> None:
        """Pause generation (`settle` waits until the pause took hold): `abort` ends the
        requests in flight (finish_reason 'abort'), `wait` lets them finish, `keep` freezes
        them at the next token boundary (`recompute`: they recompute their KV once resumed, on
        the weights served then). Requests that arrive meanwhile are held until `resume`."""
        with self._cond:
            self.paused = mode
            if mode == "abort":
                drop = self.settings.fault("CTL-PAUSE-2")
                self._end = (("drop", None) if drop else ("end", "abort"), self._submitted)
            self._recompute = self._recompute or (recompute and mode == "keep")
            self._wait_mark = self._submitted
            self._idle = False  # only the worker, at a token boundary, says the pause took hold
            self._cond.notify_all()

    def settle(self) -> None:
        """Return once the worker runs nothing a pause forbids (`wait`: the requests in flight
        finished; the others: the step under way ended)."""
        with self._cond:
            self._cond.wait_for(lambda: self._idle or self._stop)

    def resume(self) -> None:
        with self._cond:
            if self.paused == "keep" and self.settings.fault("CTL-PAUSE-3"):
                for job in self._active:  # the bug: the frozen requests start over
                    _restart(job)
            self.paused, self._swapped_in_pause = None, False
            self._cond.notify_all()

    def end_in_flight(self, event: tuple[str, Any]) -> None:
        """End every request submitted so far with `event`, at the next token boundary."""
        with self._cond:
            self._end = (event, self._submitted)
            self._cond.notify_all()

    def running(self) -> bool:
        """Whether requests hold KV they are decoding on: frozen by a keep pause they still do
        (vLLM), unless they released it to recompute it once resumed (SGLang's retract)."""
        with self._cond:
            released = self.paused == "keep" and self._recompute  # released at the next token boundary
            return not released and any(job.sequence().length for job in self._active)

    def reset_cache(self, preempt: bool = False) -> None:
        """Drop every cached prefix (vLLM's POST /reset_prefix_cache). Requests in flight keep
        their own KV (`preempt`: they recompute it at the next token boundary), and are not
        stored once they finish."""
        self.cache.reset(self.generation)
        if self.settings.fault("SWAP-KV-1"):  # the bug: the reset takes the KV of running requests too
            with self._cond:
                for job in self._active:  # they fail once they decode again
                    job.doom = (("error", (500, "the KV cache was reset")), DOOMED_AFTER)
        elif preempt:
            with self._cond:
                self._recompute = True
                self._cond.notify_all()

    def status(self) -> dict[str, Any]:
        with self._cond:
            out: dict[str, Any] = {
                "name": self.name,
                "readiness": self.readiness,
                "current_snapshot_identity": self.identity,
                "loading_state": {"stage": self.stage, "target_snapshot_identity": self.target},
                "loaded_adapters": [{"identity": k, "status": v} for k, v in self.adapters.items()],
            }
            if self.error:
                out["loading_state"]["error"] = self.error
            return out

    def set_loading(self, stage: str, target: str, error: str | None = None) -> None:
        with self._cond:
            self.stage, self.target, self.error = stage, target, error

    def stop(self) -> None:
        """Tell the worker to stop: the requests it holds end with a 503 at its next step, a
        swap under way ends its pause. `join` waits for it."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout=timeout)

    # ----------------------------------------------------------------------- the worker

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._stop:
                        for job in self._pending + self._active:
                            job.emit(("error", (503, "the deployment is shutting down")))
                        return
                    swap, admitted, active = self._next()
                    if swap is not None or admitted or active:
                        break
                    self._idle = True  # nothing this worker may run: a pause (if any) took hold
                    self._cond.notify_all()
                    self._cond.wait()
                self._idle = False
            if swap is not None:
                self._do_swap(swap)
                continue
            try:
                self._step(admitted, active)
            except Exception as e:  # a bug must end the requests, not the replica
                for job in admitted + active:
                    job.emit(("error", (500, f"{type(e).__name__}: {e}")))
                with self._cond:
                    self._active = [j for j in self._active if j not in active]
            if self.settings.token_delay:
                time.sleep(self.settings.token_delay)

    def _next(self) -> tuple[PendingSwap | None, list[Job], list[Job]]:
        """What the worker does next (called holding the lock): a swap, or the jobs to admit and
        the active jobs to step; a pause leaves only what it lets run. Ends requests first when
        asked to (at a token boundary: the previous step's events are already delivered)."""
        if self._end is not None:
            event, last = self._end
            self._end = None
            ended = [j for j in self._active + self._pending if j.number <= last]
            self._active = [j for j in self._active if j not in ended]
            self._pending = [j for j in self._pending if j not in ended]
            for job in ended:
                job.cancelled.set()
                job.emit(event)
        if self._recompute:  # at a token boundary: the step under way has finished
            self._recompute = False
            for job in self._active:
                _forget_kv(job)
        if self._swap is not None:
            if self.settings.transition == "ASYNC" or not self._active or self.settings.fault("SWAP-SYNC-1"):
                swap, self._swap = self._swap, None
                return swap, [], []
            self.draining = True  # SYNC: let in-flight requests finish first
            self.stage = "swapping"
        if self.paused in ("keep", "abort"):
            return None, [], []
        admitted: list[Job] = []
        if not self.draining:
            if self.paused == "wait":  # drain what was in flight when the pause came; hold the rest
                admitted = [j for j in self._pending if j.number <= self._wait_mark]
            else:
                admitted = self._pending
            self._pending = [j for j in self._pending if j not in admitted]
        if admitted and self._deferred is not None:  # CTL-LABEL-1 fault: the late swap comes due
            swap, left = self._deferred
            self._deferred = (swap, left - len(admitted)) if left > len(admitted) else None
            if self._deferred is None:
                self._swap = swap
        return None, admitted, list(self._active)

    def _do_swap(self, swap: PendingSwap) -> None:
        with self._cond:
            self.swapping, self.readiness, self.stage = True, False, "swapping"
        deadline = time.monotonic() + self.settings.swap_delay
        while True:  # the pause is observable: queued requests past their drain timeout get 425
            self._expire_pending()
            left = deadline - time.monotonic()
            if left <= 0 or self._stop:  # a stopping deployment does not sit out a long --swap-delay
                break
            with self._cond:
                self._cond.wait(timeout=min(left, 0.01))
        f = self.settings.fault
        # a switch is asked about only where it changes something (here: streams in flight), as
        # everywhere in the engine: the mutation matrix runs a switch's row on the tests that read it
        with self._cond:
            if self._active and self.settings.transition == "ASYNC" and self.label is not None and f("SWAP-ASYNC-1"):
                for job in self._active:  # vLLM: the stream breaks once it decodes on the new weights
                    job.doom = (("abort", None), DOOMED_AFTER)
            elif self._active and self.settings.transition == "ASYNC" and f("SWAP-ASYNC-1"):
                for job in self._active:
                    job.emit(("abort", None))
                self._active = []
            # vLLM: at its reset instead
            if self._active and swap.reset_policy != "all" and self.label is None and f("SWAP-KV-1"):
                for job in self._active:
                    job.emit(("error", (500, "the KV cache was reset")))
                self._active = []
            if f("SWAP-NEW-1"):
                self._stale = (self.model, self.lora, self.version, 3)
            if swap.model is not None:  # adapters were trained on the weights being replaced
                self.model, self.identity, self.lora = swap.model, swap.identity, None
                self.adapters.clear()
            else:
                self.lora = swap.lora
                self.adapters[swap.identity] = "loaded"
            self.generation += 1
            self._swapped_in_pause = self.paused is not None
            self.cache.on_swap(swap.reset_policy)
            self.stage, self.target, self.error = "ready", swap.identity, None
            self.swapping, self.draining, self.readiness = False, False, True
            # booked before the status can say so: once the last replica reads as served, the
            # deployment takes the next signal (the controller never waits on a replica's lock)
            swap.on_done()
            self._cond.notify_all()

    def _expire_pending(self) -> None:
        now = time.monotonic()
        with self._cond:
            late = [j for j in self._pending if now - j.arrived > j.drain_timeout]
            if not late or self.settings.fault("SWAP-ASYNC-4"):  # the switch: a drain timeout never ends a wait
                return
            self._pending = [j for j in self._pending if j not in late]
        for job in late:
            job.emit(("error", (425, "waited longer than the hot-load drain timeout")))

    def _step(self, admitted: list[Job], active: list[Job]) -> None:
        """One decode step: admit new requests, feed every request a prompt chunk or its last
        token, sample. A request that fails ends alone (an error event); the others go on."""
        events: list[tuple[Job, tuple[str, Any]]] = []  # delivered once per step, not once per token
        failed: set[Job] = set()
        for job in admitted:
            if not job.cancelled.is_set():
                try:
                    self._admit(job, events)
                except Exception as e:
                    _fail(job, e, events, failed)
        chunk = max(1, self.settings.prefill_chunk)
        feeds: list[tuple[Job, list[int]]] = []
        fresh = set(admitted)
        for job in admitted + active:
            if job.cancelled.is_set() or job in failed or job.seq is None:
                continue
            if job not in fresh and not job.stale:  # ASYNC: in-flight requests resume on the new weights
                job.model, job.lora = self.model, self.lora
            # the next prompt chunk while the prompt goes in; then the token sampled last
            feeds.append((job, job.tokens[job.seq.length : job.seq.length + chunk]))
        # requests with different adapters cannot share a batch
        groups: dict[tuple[int, int], list[tuple[Job, list[int]]]] = {}
        for feed in feeds:
            groups.setdefault((id(feed[0].model), id(feed[0].lora)), []).append(feed)
        finished: set[Job] = set()
        for group in groups.values():
            outs = self._forward(group, events, failed)
            ran = [(job, fed, out) for (job, fed), out in zip(group, outs, strict=True) if out is not None]
            if not ran:
                continue
            last = np.stack([out.logits[-1] for _, _, out in ran])
            greedy_lp = log_softmax(last.astype(np.float64))  # one pass for the whole batch
            for b, (job, fed, out) in enumerate(ran):
                try:
                    if self._advance(job, fed, out, last[b], greedy_lp[b], events):
                        finished.add(job)
                except Exception as e:
                    _fail(job, e, events, failed)
        with self._cond:
            gone = finished | failed
            keep = [j for j in self._active if j not in gone and not j.cancelled.is_set()]
            keep += [j for j in admitted if j not in gone and not j.cancelled.is_set()]
            self._active = keep
        # cached before the answers go out: a client that read its answer finds its prefix cached
        for job in finished - failed:
            try:
                self._remember(job)
            except Exception:  # the request has its answer; only its cache entry is lost
                log.exception("%s: caching a finished request failed", self.name)
        self._deliver(events)

    def _admit(self, job: Job, events: list[tuple[Job, tuple[str, Any]]]) -> None:
        """Pin the job to the served weights and start it on the longest cached prefix."""
        f = self.settings.fault
        job.model, job.lora, job.version = self.model, self.lora, self.version
        if self._stale is not None:  # SWAP-NEW-1 fault: the old weights serve a few more requests
            job.model, job.lora, job.version, left = self._stale
            job.stale = True
            self._stale = (job.model, job.lora, job.version, left - 1) if left > 1 else None
        model = job.model
        job.generation, job.cache_generation = self.generation, self.cache.generation
        read = job.read_cache and job.prompt_top_n is None  # scores of cached positions are not kept
        hit = self.cache.lookup(job.prompt, job.isolation, job.session, job.cache_max_len) if read else None
        cached = hit.length if hit else 0
        if hit:
            seq = model.clone_sequence(hit.entry.seq, cached)
            if f("CACHE-EQ-1"):
                seq.k = [k * np.float32(1.05) for k in seq.k]
            job.routing = list(hit.entry.routing[:cached])
            if f("R3-CACHE-1"):
                job.routing = [job.routing[0], *job.routing[:-1]]
            job.token_logprobs = list(hit.entry.token_logprobs[:cached])
            job.boundary_logits = {b: v for b, v in hit.entry.boundary_logits.items() if b <= cached}
            job.token_logprobs.append(float(log_softmax(hit.entry.boundary_logits[cached])[job.prompt[cached]]))
        else:
            seq = Sequence_()
            job.token_logprobs = [0.0]  # the first token has no context
        job.tokens = [int(t) for t in job.prompt]
        job.served_by = self.identity
        job.seq = seq
        reported = 0 if hit and hit.entry.unreported else cached  # the FID-CACHE-1 fault's stale entries
        events.append((job, ("start", {"cached_tokens": reported, "replica": self.name})))

    def _forward(
        self, group: list[tuple[Job, list[int]]], events: list[tuple[Job, tuple[str, Any]]], failed: set[Job]
    ) -> list[StepOutput | None]:
        """The model's output for each feed of a batch; None for a request whose feed fails."""
        jobs = [j for j, _ in group]
        seqs = [j.sequence() for j in jobs]
        lengths = [seq.length for seq in seqs]
        try:
            return [*self._distorted(jobs[0].weights().step(seqs, [t for _, t in group], jobs[0].lora))]
        except Exception:
            # Find the request that broke the batch by stepping each alone. A failed step leaves
            # no trace: positions past a sequence's length are rewritten by the next step.
            for seq, n in zip(seqs, lengths, strict=True):
                seq.length = n
        outs: list[StepOutput | None] = []
        for (job, fed), seq, n in zip(group, seqs, lengths, strict=True):
            try:
                outs.append(self._distorted(job.weights().step([seq], [fed], job.lora))[0])
            except Exception as e:
                seq.length = n
                _fail(job, e, events, failed)
                outs.append(None)
        return outs

    def _distorted(self, outs: list[StepOutput]) -> list[StepOutput]:
        """The step's outputs as the numerics fault switches change them (as computed otherwise)."""
        f = self.settings.fault
        if f("NUM-LOGPROB-1"):
            outs = [StepOutput(_bf16(o.logits), o.routing) for o in outs]
        if len(outs) > 1 and f("FID-BATCH-1"):
            scale = np.float32(1 + 0.01 * (len(outs) - 1))
            outs = [StepOutput(o.logits * scale, o.routing) for o in outs]
        return outs

    def _advance(
        self,
        job: Job,
        fed: list[int],
        out: StepOutput,
        last: np.ndarray,
        greedy_lp: np.ndarray,
        events: list[tuple[Job, tuple[str, Any]]],
    ) -> bool:
        """Record what a step computed for `job` and sample its next token once the whole prompt
        is in; True when the job is finished."""
        f = self.settings.fault
        start = job.sequence().length - len(fed)  # the first position fed in this step
        lp = log_softmax(out.logits) if start < len(job.prompt) - 1 else None
        for i in range(len(fed)):
            job.routing.append(out.routing[i])
            pos = start + i  # the position whose logits these are predicts position pos + 1
            if (pos + 1) % self.settings.block_size == 0:
                job.boundary_logits[pos + 1] = out.logits[i]
            if lp is not None and pos + 1 < len(job.prompt):  # (lp is there for every prompt position)
                job.token_logprobs.append(float(lp[i, job.prompt[pos + 1]]))
                if job.prompt_top_n is not None:
                    job.prompt_scores.append(_scored(lp[i], job.prompt[pos + 1], job.prompt_top_n))
        if job.sequence().length < len(job.tokens):
            return False  # more of the prompt (or, recomputing, of the output) goes in at the next step
        if job.generated == 0 and job.want_prompt_entries:
            prompt_routing = np.array(job.routing[: len(job.prompt)])
            if f("R3-CHANGE-1"):  # a memo that no swap invalidates
                prompt_routing = self._routing_memo.setdefault(tuple(job.tokens[: len(job.prompt)]), prompt_routing)
            scores = list(job.prompt_scores) if job.prompt_top_n is not None else None
            events.append((job, ("prompt", (np.array(job.token_logprobs[: len(job.prompt)]), prompt_routing, scores))))
        if job.max_tokens == 0:
            events.append((job, ("end", "length")))
            return True
        if job.params.temperature <= 0:
            token = int(np.argmax(last))
            logprob, sampling_logprob = float(greedy_lp[token]), 0.0
        else:
            token, logprob, sampling_logprob = sample(out.logits[-1], job.params, job.rng)
        job.generated += 1
        job.tokens.append(token)
        job.token_logprobs.append(logprob)
        version = job.version if job.stale else self.version
        if job.served_by != self.identity and job.generated % 2 and f("SWAP-ASYNC-2"):
            version = job.version if self.label is not None else job.served_by  # the version it started on
        reported = _bf16(np.float32(logprob)).item() if f("FID-DECODE-1") else logprob
        scored = _scored(greedy_lp, token, job.top_n) if job.top_n is not None else None
        events.append((job, ("token", Token(token, reported, sampling_logprob, out.routing[-1], version, scored))))
        if job.doom is not None:  # faults only: the request ends some tokens after its KV was taken
            event, left = job.doom
            job.doom = (event, left - 1) if left > 1 else None
            if job.doom is None:
                events.append((job, event))
                return True
        if token in job.stop_ids:
            events.append((job, ("end", "stop")))
            return True
        if job.generated >= job.max_tokens:
            events.append((job, ("end", "length")))
            return True
        return False

    @staticmethod
    def _deliver(events: list[tuple[Job, tuple[str, Any]]]) -> None:
        by_loop: dict[int, tuple[Any, list]] = {}
        for job, ev in events:
            by_loop.setdefault(id(job.loop), (job.loop, []))[1].append((job.queue, ev))
        for loop, items in by_loop.values():
            with contextlib.suppress(RuntimeError):  # that loop has closed (the server stopped)
                loop.call_soon_threadsafe(_put_all, items)

    def _remember(self, job: Job) -> None:
        """Cache the computed positions (prompt and generated, minus the last unfed token)."""
        if job.seq is None or job.lora is not self.lora or job.served_by != self.identity:
            return  # a request that spanned a swap holds KV of two snapshots
        if job.generation != self.generation:
            return  # ... or of weights reloaded under the same identity (a reset: the store checks)
        n = job.seq.length
        self.cache.store(
            Entry(
                tokens=np.array(job.tokens[:n]),
                seq=self.model.clone_sequence(job.seq, n),
                routing=np.array(job.routing[:n]),
                token_logprobs=np.array(job.token_logprobs[:n]),
                boundary_logits=dict(job.boundary_logits),
                isolation=job.isolation,
                session=job.session,
                weights=self.generation,
            ),
            job.cache_generation,
        )


def _fail(job: Job, e: Exception, events: list[tuple[Job, tuple[str, Any]]], failed: set[Job]) -> None:
    """End `job` alone: its stream gets an error event, every other request of the step goes on."""
    log.exception("a request failed in a decode step")
    failed.add(job)
    events.append((job, ("error", (500, f"{type(e).__name__}: {e}"))))


def _scored(logprobs: np.ndarray, token: int, n: int) -> Scored:
    """`token` among the alternatives of one position: its rank (1 + how many tokens are more
    likely, as vLLM counts it) and the `n` most likely tokens."""
    rank = int(np.count_nonzero(logprobs > logprobs[token])) + 1
    best = np.argsort(-logprobs, kind="stable")[:n] if n > 0 else ()
    return Scored(rank, tuple((int(t), float(logprobs[t])) for t in best))


def _forget_kv(job: Job) -> None:
    """Let a frozen request recompute its KV (prompt and output so far) when it runs again, on
    the weights served then (vLLM's pause?mode=keep&clear_cache=true preempts it)."""
    job.seq = Sequence_()
    job.routing, job.token_logprobs, job.boundary_logits = [], [0.0], {}
    job.prompt_scores = []


def _restart(job: Job) -> None:
    """Start a request's output over, as if it had just been admitted (the CTL-PAUSE-3 fault)."""
    _forget_kv(job)
    job.tokens = [int(t) for t in job.prompt]
    job.generated = 0


def _bf16(x: np.ndarray | np.floating) -> np.ndarray:
    """`x` rounded to bfloat16 precision (fault switches that lose precision)."""
    return st.Tensor.bf16(np.asarray(x, np.float32)).float32()


def _put_all(items: list) -> None:
    for queue, event in items:
        queue.put_nowait(event)
