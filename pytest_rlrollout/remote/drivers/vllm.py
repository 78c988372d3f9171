"""The vLLM binding: a vLLM server (`VLLM_SERVER_DEV_MODE=1`) swapped through its own RL API.

- Load a snapshot: `POST /pause?mode=keep`, `POST /collective_rpc {"method": "reload_weights",
  "kwargs": {"weights_path": <bucket>/<identity>}}` (synchronous), `POST /update_weight_version
  {"new_version": identity}`, `POST /reset_prefix_cache` when the signal asks for `all`, then
  `POST /resume`. The label is published only after the reload answered, and no token is
  generated between the two (generation is paused): a label that names weights which do not
  serve it is the engine's doing, not this sequence's. A test acts in the middle of the swap
  (after the reload, before the label) through `load(..., midway=)`: SWAP-ASYNC-3's requests go
  out there. ARC2 diffs and LoRA have no binding here.
- What is served: `GET /weight_info` → `weight_version` (one replica: the server).
- Policy versions: `weight_versions` spans `[{version, start, end}]` on the final chunk of
  `/inference/v1/generate` (`--enable-scale-out`), which also takes token-id prompts, `cache_salt`,
  `prompt_logprobs` and logprobs with token ids: completions with token-id prompts go there when
  the route answers; text prompts and chat go to `/v1/completions` and `/v1/chat/completions`,
  which are asked for the same spans (`return_weight_versions`: vLLM 0.33 returns them on each
  choice's last chunk; 0.32 accepts the field and ignores it). Whichever route returns them, the
  reading lays them over the chunks.
- Requests arriving while paused: 0.32 holds them in every mode; 0.33 refuses them in abort and
  wait mode (503 ServiceUnavailableError, an error event in a stream's 200) and holds them in keep
  mode, the mode of this binding's load. CTL-PAUSE-1 asks every mode, naming the release.
- Isolation: `x-prompt-cache-isolation-key` / `prompt_cache_isolation_key` become `cache_salt`.
- Pause: `POST /pause?mode=abort|wait|keep&clear_cache=`, `POST /resume`, `GET /is_paused`.
- Routing (R3): with `--enable-return-routed-experts` the choice that ends a completion carries
  `routed_experts`, base64 of a `.npy` array `[positions, layers, k]`: the experts each forward
  pass routed to, for every position but the last sampled token (from
  `routed_experts_prompt_start`, 0 by default). The reading lays its rows on the logprobs entries
  as the contract's `routing_matrix` ([L, k] uint8): a prompt entry gets its own position's row,
  the output token j the row of position P-1+j (the pass that sampled it).

Session headers pass through (one server: affinity is a router's concern, with no binding here).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Unpack

import httpx

from pytest_rlrollout.engines.vllm import ENGINE
from pytest_rlrollout.remote.discovery import PROBE_IDS, PROBE_TEXT, Answered, Discovery, get, mark, said
from pytest_rlrollout.remote.drivers.base import Driver, Status, registered, reset_policy
from pytest_rlrollout.remote.drivers.probes import auth_probe, inference_probes
from pytest_rlrollout.remote.openai_wire import (
    OpenAIReading,
    bound,
    labelled_status,
    legacy_body,
    routed_experts,
    token_prompt,
)
from pytest_rlrollout.remote.options import CompletionOptions, LoadOptions
from pytest_rlrollout.remote.stream import Stream, as_object, json_object

if TYPE_CHECKING:
    from pytest_rlrollout.remote.client import DeploymentClient
    from pytest_rlrollout.remote.replicas import Waited

GENERATE = "/inference/v1/generate"
# the contract's sampling fields that vLLM's generate route takes in `sampling_params`, as they are
SAMPLING = (
    "max_tokens",
    "min_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "ignore_eos",
    "stop",
    "stop_token_ids",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "n",
)
REPLICA = ENGINE.name  # the one replica's name in the status


VLLM_READING = OpenAIReading()
STREAMED_ECHO = OpenAIReading(echo=True)


def vllm_version(client: DeploymentClient) -> str | None:
    """vLLM's version, when a vLLM server answers `GET /version` (every vLLM OpenAI server routes it)."""
    r = get(client, client.target.base_url.rstrip("/") + "/version", client.auth_headers(), "--rl-base-url")
    version = (json_object(r) or {}).get("version") if r.status_code == 200 else None
    return version[:40] if isinstance(version, str) else None


class VLLMDriver(Driver):
    engine = registered(ENGINE)
    reading = VLLM_READING
    transition = "ASYNC"  # the load pauses in keep mode: requests in flight continue on the new weights
    reset_policies = ("all", "none")  # no session-keyed reset: new_session has no binding
    holds_streams = True  # load: pause (keep), reload, resume

    def __init__(self, client: DeploymentClient, *, bucket: str | None = None):
        super().__init__(client)
        self.bucket = bucket  # where the server reads snapshots: <bucket>/<identity>
        self.generate = False  # the generate route answers (found by `discover`, `adopt` or `find_version_route`)
        self._generate_sought = False  # `find_version_route` asked once

    def adopt(self, found: Discovery) -> None:
        """Take what the controller's probes found (an xdist worker does not probe again)."""
        self.generate, self._generate_sought = GENERATE in found.routes, True

    def _url(self, path: str) -> str:
        return self.target.base_url.rstrip("/") + path

    def find_version_route(self) -> int:
        """vLLM 0.32 says the policy version on its generate route only (`--enable-scale-out`):
        one one-token request there, once, and token-id completions go there when it answers
        with spans (what `discover` finds, for a client made without the preflight)."""
        if self.generate or self._generate_sought:
            return 0
        self._generate_sought = True
        self.generate = True  # the probe goes where a token-id completion then goes
        probe = self.version_probe({"prompt": PROBE_IDS, "max_tokens": 1})
        self.generate = probe.ok and bool(probe.spans)
        return 1

    def version_probe(self, body: dict[str, Any]) -> Stream:
        """`body` completed on the generate route of the server (a fleet's: of one engine)."""
        return self.complete_at(None, body)

    def _post(
        self,
        path: str,
        body: Any = None,
        *,
        headers: dict[str, str] | None = None,
        wait: float | None = None,
        **params: Any,
    ) -> httpx.Response:
        sent = self.client.auth_headers() | {"Content-Type": "application/json"} | (headers or {})
        query = {k: str(v).lower() if isinstance(v, bool) else v for k, v in params.items()}
        return self.client.request("POST", self._url(path), json=body, headers=sent, params=query, wait=wait)

    def _get(self, path: str, *, headers: dict[str, str] | None = None) -> httpx.Response:
        return self.client.request("GET", self._url(path), headers=self.client.auth_headers() | (headers or {}))

    # ----------------------------------------------------------------------- inference

    def complete(
        self,
        body: dict[str, Any],
        **options: Unpack[CompletionOptions],
    ) -> Stream:
        return self.complete_at(None, body, **options)

    def complete_at(
        self,
        base: str | None,
        body: dict[str, Any],
        **options: Unpack[CompletionOptions],
    ) -> Stream:
        """`complete`, on the server at `base` (None: the target's)."""
        chat = options.get("chat", False)
        sent, options["headers"], salt = bound(body, options.get("headers"))
        if salt is not None:
            sent["cache_salt"] = salt
        if self.generate and token_prompt(body.get("prompt")) and not chat:
            reading = STREAMED_ECHO if body.get("echo") and body.get("stream") else self.reading
            generate = (base or self.target.base_url).rstrip("/") + GENERATE
            return self.client.complete(generate_body(sent), url=generate, reading=reading, **options)
        url = None if base is None else base.rstrip("/") + ("/v1/chat/completions" if chat else "/v1/completions")
        return self.client.complete(
            openai_body(sent, chat=chat),
            url=url,
            reading=self.reading,
            **options,
        )

    # ----------------------------------------------------------------------- what is served

    def status(self, *, headers: dict[str, str] | None = None) -> Status:
        return labelled_status(self._get("/weight_info", headers=headers), "GET /weight_info", REPLICA)

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
        if lora:
            raise self.unbound("LoRA adapters")
        return super().wait(
            identity, timeout=timeout, poll=poll, progress=progress, stalled_after=stalled_after, first_poll=first_poll
        )

    # ----------------------------------------------------------------------- loading

    def load(
        self,
        signal: dict[str, Any],
        **options: Unpack[LoadOptions],
    ) -> httpx.Response:
        """Pause (keep), reload from the bucket, [`midway`], publish the label, reset the prefix
        cache for `all` (the default, as on the contract's wire; the requests in flight recompute
        their KV), resume. The answer of the reload, or of the step that refused (a reset that
        answered 200 {"success": false}: that answer as a 503); generation is resumed whatever
        happened."""
        headers, midway = options.get("headers"), options.get("midway")
        if signal.get("incremental_snapshot_metadata"):
            raise self.unbound("incremental (ARC2) snapshots")
        if self.bucket is None:
            raise ValueError("loading a snapshot into vLLM needs the directory it reads them from (--rl-bucket-url)")
        identity = signal.get("identity")
        policy = reset_policy(signal)
        if policy not in self.reset_policies:
            raise self.unbound(f"reset_prompt_cache {policy!r}")
        paused = self._post("/pause", headers=headers, mode="keep", clear_cache=False)
        if paused.status_code != 200:
            return paused
        try:
            reload = {"method": "reload_weights", "kwargs": {"weights_path": f"{self.bucket}/{identity}"}}
            reloaded = self._post("/collective_rpc", reload, headers=headers, wait=self.load_wait)
            if reloaded.status_code != 200:
                self.reload_refused(reloaded, str(identity), headers)
                return reloaded
            if midway is not None:
                midway()
            labelled = self._post("/update_weight_version", {"new_version": str(identity)}, headers=headers)
            if labelled.status_code != 200:
                return labelled
            if policy == "all":
                # The requests frozen by the pause hold KV blocks, and vLLM resets nothing while any
                # block is held: a plain reset answers 200 {"success": false} whenever a request is
                # in flight (measured, vLLM 0.32). reset_running_requests preempts them: they
                # recompute their KV on the new weights once resumed, and the reset happens.
                reset = self._post("/reset_prefix_cache", headers=headers, reset_running_requests=True)
                if reset.status_code != 200:
                    return reset
                if (json_object(reset) or {}).get("success") is not True:
                    # 200 with success false is vLLM's refusal ("callers may retry"): the swap is
                    # not done, and no caller may take the 200 for it
                    refused = (
                        f"POST /reset_prefix_cache answered 200 {reset.text[:200]}: the prefix cache was not reset"
                    )
                    return httpx.Response(503, request=reset.request, text=refused)
            return reloaded
        finally:
            self._post("/resume", headers=headers)

    def reload_refused(self, answer: httpx.Response, identity: str, headers: dict[str, str] | None) -> None:
        """A reload was refused (`answer`), generation still paused: what the load leaves behind
        besides (one server: nothing, its label still names the weights it kept)."""
        return None

    # ----------------------------------------------------------------------- control

    def pause(self, mode: str, *, clear_cache: bool = False) -> httpx.Response:
        return self._post("/pause", mode=mode, clear_cache=clear_cache)

    def resume(self) -> httpx.Response:
        return self._post("/resume")

    def paused(self) -> bool | None:
        r = self._get("/is_paused")
        value = (json_object(r) or {}).get("is_paused") if r.status_code == 200 else None
        return value if isinstance(value, bool) else None

    def reset_cache(self) -> httpx.Response:
        return self._post("/reset_prefix_cache")

    def set_label(self, label: str) -> httpx.Response:
        return self._post("/update_weight_version", {"new_version": label})

    def start_label(self) -> str | None:
        return "default"  # vLLM's weight_version until /update_weight_version (its RL docs and tests)

    def started_from(self) -> str | None:
        """The model's root in `GET /v1/models`: the directory the server was started from."""
        models = self._get("/v1/models")
        data = (json_object(models) or {}).get("data") if models.status_code == 200 else None
        root = as_object(data[0]).get("root") if isinstance(data, list) and data else None
        return root if isinstance(root, str) else None

    def restore(self, label: str) -> str | None:
        """Reload the directory the server was started from and publish `label` again."""
        root = self.started_from()
        if root is None:
            return "not restored: GET /v1/models names no model root"
        self._post("/pause", mode="keep", clear_cache=True)
        try:
            reload = {"method": "reload_weights", "kwargs": {"weights_path": root}}
            reloaded = self._post("/collective_rpc", reload, wait=self.load_wait)
            if reloaded.status_code != 200:
                return f"not restored: reloading {root} got HTTP {reloaded.status_code} {reloaded.text[:200]}"
            labelled = self.set_label(label)
            if labelled.status_code != 200:
                return f"reloaded {root}, but setting the label {label!r} got HTTP {labelled.status_code}"
        finally:
            self._post("/resume")
        return f"reloaded {root} (the directory the server started from) and set the label back to {label!r}"

    # ----------------------------------------------------------------------- discovery

    @classmethod
    def recognises(cls, client: DeploymentClient, seen: Answered) -> str | None:
        version = vllm_version(client)
        return None if version is None else f"GET /version answers vLLM {version}"

    def discover(self, *, transition: str | None, decided: str) -> Discovery:
        d = Discovery(self.engine, decided, transition=transition or self.transition)
        d.version = vllm_version(self.client) or None
        inference_probes(self, d)
        auth_probe(self, d)
        mark(d, "transition", True, f"{d.transition}: the load pauses generation in keep mode")
        info = self._get("/weight_info")
        label = (json_object(info) or {}).get("weight_version") if info.status_code == 200 else None
        mark(
            d,
            "hot_load_api",
            isinstance(label, str),
            f"GET /weight_info: HTTP {info.status_code}"
            + (f", weight_version {label!r}" if isinstance(label, str) else ""),
        )
        d.replicas = 1 if isinstance(label, str) else 0
        mark(d, "incremental", False, "reload_weights takes whole checkpoints")
        paused = self._get("/is_paused")
        mark(d, "pause", paused.status_code == 200, f"GET /is_paused: HTTP {paused.status_code}")
        mark(d, "cache_reset", paused.status_code == 200, "a dev-mode route, beside /is_paused")
        for name in ("ledger", "hint", "lora", "raw_output", "perf_metrics"):
            mark(d, name, False, "no vLLM binding on this server")
        probe = {"prompt": PROBE_IDS, "max_tokens": 2, "stream": True, "logprobs": True}
        generated = self.client.complete(generate_body(probe), url=self._url(GENERATE), reading=self.reading)
        self.generate, self._generate_sought = generated.ok and bool(generated.spans), True
        d.routes = [GENERATE] if self.generate else []
        routes = self.complete({"prompt": PROBE_TEXT, "max_tokens": 2, "stream": True})  # an OpenAI route's spans
        mark(
            d,
            "policy_version",
            self.generate or bool(routes.spans),
            f"POST {GENERATE}: {said(generated)}"
            + (f", spans {generated.spans}" if generated.spans else ", no weight_versions")
            + "; POST /v1/completions with return_weight_versions: "
            + (f"spans {routes.spans}" if routes.spans else "none (vLLM 0.33 returns them)"),
        )
        rows = routed_experts(generated.choice_field("routed_experts"))
        mark(
            d,
            "routing_matrix",
            rows is not None,
            f"POST {GENERATE}: " + (f"routed_experts {list(rows.shape)}" if rows is not None else "no routed_experts"),
        )
        ids = self.complete({"prompt": PROBE_IDS, "max_tokens": 1})
        mark(d, "token_id_prompts", ids.ok and bool(ids.chunks), said(ids))
        mark(
            d,
            "nonstream_version",
            d.has("policy_version") and bool(ids.versions) and None not in ids.versions,
            f"a non-streamed answer's spans: {ids.spans}",
        )
        logprobs = self.complete({"prompt": PROBE_IDS, "max_tokens": 1, "logprobs": True})
        lps = logprobs.entries
        mark(d, "logprobs", bool(lps) and all("token_id" in e for e in lps), f"{len(lps)} logprobs entries")
        echoed = self.complete({"prompt": PROBE_IDS, "max_tokens": 1, "logprobs": True, "echo": True})
        mark(
            d,
            "echo",
            len(echoed.entries) > 1,
            f"{len(echoed.entries)} entries for a prompt and one token (prompt_logprobs)",
        )
        back = self.complete({"prompt": PROBE_IDS, "max_tokens": 1, "return_token_ids": True})
        mark(d, "token_ids", isinstance(back.choice_field("token_ids"), list), "choices[].token_ids")
        return d


def openai_body(body: dict[str, Any], *, chat: bool = False) -> dict[str, Any]:
    """A contract body on vLLM's OpenAI routes: legacy completions' fields (not chat), and the
    policy-version spans asked for (vLLM 0.33 returns them; 0.32 accepts the field, ignores it)."""
    return {**(body if chat else legacy_body(body)), "return_weight_versions": True}


def generate_body(body: dict[str, Any]) -> dict[str, Any]:
    """A contract completion body on vLLM's generate route: token ids in, the sampling fields in
    `sampling_params`, logprobs as a count (`logprobs: true` is the sampled token's alone),
    `echo` as prompt logprobs (not streamed); text pieces on the entries (`output_mode: text`) and the ids
    back (`return_token_ids`); usage on the last streamed chunk, as the contract's streams have it."""
    params = {k: body[k] for k in SAMPLING if body.get(k) is not None}
    if body.get("logprobs"):
        params["logprobs"] = (body.get("top_logprobs") or 0) if body["logprobs"] is True else body["logprobs"]
    # a stream has no field for prompt scores (vLLM drops them), and a request that asks for them
    # skips the prefix cache: streamed, the prompt's tokens come back as `prompt_token_ids` alone
    if body.get("echo") and not body.get("stream"):
        params["prompt_logprobs"] = 0
    out: dict[str, Any] = {
        "token_ids": body["prompt"],
        "sampling_params": params,
        "output_mode": "text",
        "return_token_ids": True,
    }
    for k in ("model", "cache_salt", "request_id"):
        if k in body:
            out[k] = body[k]
    if body.get("stream"):
        out["stream"] = True
        out["stream_options"] = {"include_usage": True, **as_object(body.get("stream_options"))}
    return out
