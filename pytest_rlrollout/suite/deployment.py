"""The deployment under test as every test sees it: `RLDeployment`, the contract's intents on the
wire of its engine's driver, reads always and state changes only where allowed.

Opening it (local / live / replay) is `suite.connecting`, the `rl_deployment` fixture
`suite.opening`, and one test's hold on it (`rl_test`) `suite.holding`.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from pytest_rlrollout.suite.run_config import RLConfig

if TYPE_CHECKING:
    import httpx

    from pytest_rlrollout.engines import Engine
    from pytest_rlrollout.reference import Running
    from pytest_rlrollout.remote.bucket import Bucket
    from pytest_rlrollout.remote.cassette import CassetteTransport
    from pytest_rlrollout.remote.discovery import Discovery
    from pytest_rlrollout.remote.drivers import Driver, Status
    from pytest_rlrollout.remote.options import CompletionOptions, LoadOptions
    from pytest_rlrollout.remote.replicas import Waited
    from pytest_rlrollout.remote.stream import Stream
    from pytest_rlrollout.remote.target import Target
    from pytest_rlrollout.suite.prompts import Prompt


class HotLoadNotAllowed(Exception):
    """A state change was attempted on a live deployment without --rl-allow-hot-load."""


class RLDeployment:
    """The deployment under test, as the `rl_deployment` fixture hands it out: the contract's
    intents, on the wire of its engine's driver (`driver`; `client` is the bounded HTTP client
    under it, whose exchanges are a test's evidence).

    Reads never change state; `hot_load`, `hint`, `reset_ledger`, `pause`, `resume`,
    `reset_cache` and `set_label` raise `HotLoadNotAllowed` on a live deployment unless the run
    passed `--rl-allow-hot-load`.
    """

    def __init__(
        self,
        driver: Driver,
        opts: RLConfig,
        *,
        base_snapshot: Path | None,
        bucket: Bucket | None,
        local: Running | None = None,
    ):
        self.driver, self.client, self.options = driver, driver.client, opts
        self.base_snapshot, self.bucket = base_snapshot, bucket
        self.timeouts = opts.timeouts
        timed(driver, opts)
        self._local = local  # the bundled reference deployment, when it runs in this process
        self.discovery: Discovery | None = None  # what it is and offers; set before any test
        self.run_id = "run"  # unique per run (the recording's in replay); set before any test
        driver.served_config = self.base_config

    @property
    def target(self) -> Target:
        return self.client.target

    @property
    def mode(self) -> str:
        """`local`, `live` or `replay`."""
        return self.options.mode

    @property
    def allow_hot_load(self) -> bool:
        return self.options.allow_hot_load

    @property
    def key(self) -> str:
        """Names the deployment for the lock and the run's shared record (same URL + name = same)."""
        return f"{self.target.base_url}|{self.target.deployment}"

    @property
    def cassettes(self) -> CassetteTransport | None:
        """The recording or replaying transport, or None."""
        from pytest_rlrollout.remote.cassette import CassetteTransport

        t = self.client.transport
        return t if isinstance(t, CassetteTransport) else None

    # ----------------------------------------------------------------------- reading

    def status(self, *, headers: dict[str, str] | None = None) -> Status:
        """What the deployment says each replica serves (the engine's status read, its answer kept)."""
        return self.driver.read_status(headers=headers)

    def replicas(self) -> list[dict[str, Any]]:
        """The replicas, in the hot-load status's shape; [] when the status cannot be read."""
        return self.driver.replicas()

    def replicas_if_answering(self) -> list[dict[str, Any]] | None:
        """The replicas; None when the deployment does not answer at all (a test marked rl_breaks
        may leave it dead: what the run does at its end then says so instead of raising, which
        would turn that test's verdict into an error)."""
        import httpx

        from pytest_rlrollout.remote.limits import LimitExceeded

        try:
            return self.replicas()
        except (httpx.TransportError, LimitExceeded):
            return None

    def served_identities(self) -> list[str | None]:
        """`current_snapshot_identity` of every replica."""
        return [r.get("current_snapshot_identity") for r in self.replicas()]

    def serving(self) -> str | None:
        """The snapshot identity every replica serves, or None when they differ."""
        ids = set(self.served_identities())
        return ids.pop() if len(ids) == 1 else None

    def ledger(self) -> httpx.Response:
        return self.driver.ledger()

    def complete(self, body: dict[str, Any], **options: Unpack[CompletionOptions]) -> Stream:
        """A completion in the contract's vocabulary (streamed when `body["stream"]`), sent on the
        engine's wire and parsed into a `Stream`: policy version per chunk, logprobs entries,
        routing matrices, usage, cached tokens of every channel. `on_chunk` sees each chunk as it
        arrives, `on_status` the status as soon as the answer's head arrives."""
        return self.driver.complete(body, **options)

    def post_inference(self, content: bytes, *, chat: bool = False) -> httpx.Response:
        """POST raw bytes to the completions endpoint (malformed requests on purpose)."""
        return self.driver.post_inference(content, chat=chat)

    def auth_headers(self) -> dict[str, str]:
        return self.client.auth_headers()

    def mark(self, name: str) -> float:
        """Now, in seconds; on the cassette's timeline when recording or replaying."""
        return self.client.mark(name)

    def decide(self, name: str, live: bool) -> bool:
        """`live`; when replaying, what the recording decided under `name` (`DeploymentClient.decide`)."""
        return self.client.decide(name, live)

    @property
    def engine(self) -> Engine:
        """Whose wire the deployment speaks: `fireworks`, `vllm` or `openai`."""
        return self.driver.engine

    @property
    def capabilities(self) -> Discovery:
        """What the deployment offers (the capability vocabulary), discovered without changing it."""
        assert self.discovery is not None, "discovered when the rl_deployment fixture starts"
        return self.discovery

    # ----------------------------------------------------------------------- what a test sends

    def salted(self, name: str) -> str:
        """`name`, unique to this run: session ids, isolation keys and prompts of a run never meet
        the prompt-cache entries of an earlier run against the same long-lived deployment."""
        return f"rl-{self.run_id}-{name}"

    def session(self, name: str, **more: str) -> dict[str, str]:
        """Headers of a session of this run named `name` (plus any other headers)."""
        return {"x-multi-turn-session-id": self.salted(name), **more}

    def prompt(self, name: str, tokens: int = 24) -> Prompt:
        """A prompt no other test and no earlier run sends: token ids when the deployment takes
        them, else about `tokens` words of text."""
        from pytest_rlrollout.suite.prompts import make_prompt

        ids = self.capabilities.has("token_id_prompts") and self.driver.prompts_in_ids
        return make_prompt(self.salted(name), tokens, ids=ids, vocab=(self.base_config or {}).get("vocab_size"))

    def sessions_per_replica(self, name: str) -> dict[str, dict[str, str]]:
        """Session headers of this run reaching each replica, by the replica's name (the session
        key itself where answers name none): one-token probes until every replica the deployment
        has answered, so that a clause about each replica is judged on each (a gateway's engines
        included). One replica: one session."""
        from pytest_rlrollout.remote.fingerprint import sessions_by_replica

        replicas = max(self.capabilities.replicas, 1)
        found, _, _ = sessions_by_replica(self.driver, replicas, lambda n: self.salted(f"{name}-{n}"))
        return {replica: {"x-multi-turn-session-id": key} for replica, key in found.items()}

    def token_ids(self, name: str, tokens: int) -> list[int]:
        """The token ids of a prompt no other test and no earlier run sends, for the tests that
        score a prompt's own tokens (they need `token_id_prompts`): the ids `prompt` sends where
        the deployment's routed path takes ids."""
        from pytest_rlrollout.suite.prompts import make_prompt

        ids = make_prompt(self.salted(name), tokens, ids=True, vocab=(self.base_config or {}).get("vocab_size")).ids
        assert ids is not None  # asked for ids
        return ids

    @functools.cached_property
    def base_config(self) -> dict[str, Any] | None:
        """config.json of the served base model, when a local copy is known (--rl-base-snapshot)."""
        if self.base_snapshot is None or not (self.base_snapshot / "config.json").is_file():
            return None
        config: dict[str, Any] = json.loads((self.base_snapshot / "config.json").read_text())
        return config

    @property
    def long_stream_tokens(self) -> int:
        """Tokens a stream must last for a swap to land inside it (rl_long_stream_tokens)."""
        return self.timeouts.long_stream_tokens

    @property
    def swap_timeout(self) -> float:
        return self.timeouts.swap

    @contextlib.contextmanager
    def observable_swaps(self) -> Iterator[None]:
        """While a test observes a swap in progress (a stream crossing it, probes landing inside
        it, a shard removed before it is read): the bundled reference deployment slows its loads,
        swaps and decode steps to a pace a client can observe, and otherwise runs at full speed.
        A deployment elsewhere keeps its own pace."""
        if self._local is None:
            yield
            return
        from pytest_rlrollout.reference.settings import OBSERVABLE_PACE

        self._local.deployment.set_pace(**OBSERVABLE_PACE)
        try:
            yield
        finally:
            self._local.deployment.set_pace(**dict.fromkeys(OBSERVABLE_PACE, 0.0))

    def wait_for(
        self, identity: str, *, lora: bool = False, progress: Callable[[list[dict[str, Any]]], None] | None = None
    ) -> Waited:
        """Wait until every replica serves `identity`, a replica reports its load failed, the
        rollout stalls part-way, or the swap timeout passes."""
        t = self.timeouts
        return self.driver.wait(
            identity,
            timeout=t.swap,
            poll=t.poll,
            lora=lora,
            progress=progress,
            stalled_after=t.stalled_after,
            first_poll=t.first_poll,
        )

    def settle(self) -> bool:
        """Poll until no replica is loading or swapping; False at the deadline or when no
        replica can be seen."""
        from pytest_rlrollout.remote.polling import ticks
        from pytest_rlrollout.remote.replicas import busy

        for _ in ticks(self.timeouts.swap, self.timeouts.poll, start=self.timeouts.first_poll):
            replicas = self.replicas()
            if not replicas:
                return False  # nothing to observe (see HL-GET-1)
            if all(r.get("readiness") and not busy(r) for r in replicas):
                return True
        return False

    # ----------------------------------------------------------------------- changing state (guarded)

    def hot_load(self, body: Any, **options: Unpack[LoadOptions]) -> httpx.Response:
        """Load the snapshot a signal names, through the engine's load API; a refusal because
        another load is in progress (one load at a time: `Driver.busy`) is signalled again until
        the swap timeout, as a trainer's client would. `midway`: see `Driver.load`."""
        from pytest_rlrollout.remote.polling import ticks

        self._check_allowed("hot-load")
        for _ in ticks(self.timeouts.swap, self.timeouts.retry):
            r = self.driver.load(body, **options)
            if not self.driver.busy(r):
                return r
        return r

    def hint(self, identity: str, file: str) -> httpx.Response:
        self._check_allowed("hot-load hint")
        return self.driver.hint(identity, file)

    def reset_ledger(self) -> httpx.Response:
        self._check_allowed("ledger reset")
        return self.driver.reset_ledger()

    def pause(self, mode: str, *, clear_cache: bool = False) -> httpx.Response:
        """Pause generation (`abort`, `wait` or `keep`: what in-flight requests do meanwhile)."""
        self._check_allowed("pause")
        return self.driver.pause(mode, clear_cache=clear_cache)

    def resume(self) -> httpx.Response:
        self._check_allowed("resume")
        return self.driver.resume()

    def paused(self) -> bool | None:
        """Whether generation is paused, as the deployment says (None: its answer does not say)."""
        return self.driver.paused()

    def reset_cache(self) -> httpx.Response:
        """Reset the prompt cache on request."""
        self._check_allowed("prompt-cache reset")
        return self.driver.reset_cache()

    def set_label(self, label: str) -> httpx.Response:
        """Publish `label` as the policy version, changing no weights."""
        self._check_allowed("policy label change")
        return self.driver.set_label(label)

    def _check_allowed(self, what: str) -> None:
        if not self.allow_hot_load:
            raise HotLoadNotAllowed(
                f"refusing a {what} on {self.target.deployment}: pass --rl-allow-hot-load to allow state changes"
            )


def timed(driver: Driver, opts: RLConfig) -> Driver:
    """`driver`, keeping the run's waits: a load answered once done may take the whole swap, and
    a swap's status is read at most once a poll interval (live: twice a second), whatever reads."""
    driver.load_wait, driver.status_gap = opts.timeouts.swap, opts.timeouts.poll
    return driver
