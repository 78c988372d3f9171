"""The CoreWeave binding: a Dedicated Inference deployment (RL Rollouts, v1alpha1 preview) loaded
through CoreWeave's hot-load API, sampled through its OpenAI-compatible gateway.

- Load a snapshot: `POST /v1alpha1/inference/hotLoads {deploymentId, identity, type:
  SNAPSHOT_TYPE_FULL | SNAPSHOT_TYPE_INCREMENTAL, hotLoadId, promptCachePolicy,
  incrementalSnapshotMetadata {previousSnapshotIdentity, compressionFormat: COMPRESSION_FORMAT_ZSTD,
  checksumFormat: CHECKSUM_FORMAT_ADLER32}}`: the contract's ARC2 diffs are that encoding (XOR,
  zstd, Adler-32). `reset_prompt_cache` 'all' is `PROMPT_CACHE_POLICY_RESET_ALL`, 'none'
  `PROMPT_CACHE_POLICY_PRESERVE` (CoreWeave's default, unlike the contract's); 'new_session' has
  no binding. Every hot-load carries a fresh `hotLoadId`.
- What is served: `GET …/hotLoads/{id}/replicas` of the newest hot-load (CoreWeave lists
  replicas per hot-load; before the first one there is nothing to read: the status says so), in
  the hot-load status's shape: READY is `readiness`, `currentSnapshotIdentity` the identity,
  ERROR a failed load (`loading_state.stage` 'error' with the replica's `errorReason`).
- Inference: the gateway's `/v1/completions` and `/v1/chat/completions` (vLLM behind NVIDIA
  Dynamo), read as vLLM's legacy answers (cached tokens in `usage.prompt_tokens_details` where
  the gateway reports them); the isolation key becomes `nvext.cache_salt` (Dynamo's cache
  namespace). No policy version is said on completions (none is documented).
- Two hosts, two keys: the hot-load API is the target's control plane (`rl_control_url`,
  `COREWEAVE_API_KEY`), the gateway its base URL and API key.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, Unpack

import httpx

from pytest_rlrollout.engines.coreweave import ENGINE
from pytest_rlrollout.remote.discovery import PROBE_IDS, Answered, Discovery, PreflightError, excerpt, mark, said
from pytest_rlrollout.remote.drivers.base import Driver, Status, registered, reset_policy
from pytest_rlrollout.remote.drivers.probes import auth_probe, inference_probes
from pytest_rlrollout.remote.limits import LimitExceeded
from pytest_rlrollout.remote.openai_wire import OpenAIReading, bound, legacy_body
from pytest_rlrollout.remote.options import CompletionOptions, LoadOptions
from pytest_rlrollout.remote.stream import Stream, as_object, json_object

if TYPE_CHECKING:
    from pytest_rlrollout.remote.client import DeploymentClient
    from pytest_rlrollout.remote.target import Target

PREFIX = "/v1alpha1/inference"
HOT_LOADS = PREFIX + "/hotLoads"
POLICIES = {"all": "PROMPT_CACHE_POLICY_RESET_ALL", "none": "PROMPT_CACHE_POLICY_PRESERVE"}
STAGES = {"READY": "ready", "UPDATING": "loading", "PENDING_UPDATE": "pending", "ERROR": "error"}


def _hot_loads(client: DeploymentClient, seen: Answered) -> httpx.Response:
    """The hot-load list (the deployment's, when it is named), asked of the control plane with its
    own key; without one, of the base URL with the run's key. Read once per preflight."""

    def ask() -> httpx.Response:
        t = client.target
        url = t.control_base + HOT_LOADS
        option = "rl_control_url" if t.control_url else "--rl-base-url"
        params = {"parentDeploymentId": t.deployment} if t.deployment else None
        try:
            return client.request("GET", url, headers=client.control_headers(), params=params)
        except (httpx.HTTPError, LimitExceeded) as e:
            raise PreflightError(f"nothing answers at {url} ({type(e).__name__}: {e}): check {option}") from None

    return seen.read(ENGINE.name, ask)


def _lists_hot_loads(r: httpx.Response) -> bool:
    return r.status_code == 200 and isinstance((json_object(r) or {}).get("hotLoads"), list)


class CoreWeaveDriver(Driver):
    engine = registered(ENGINE)
    reading = OpenAIReading()  # its gateway answers as vLLM's /v1/completions does
    transition = "ASYNC"  # the only transition mode CoreWeave documents (TRANSITION_MODE_ASYNC)
    reset_policies = tuple(POLICIES)

    @classmethod
    def claims(cls, target: Target) -> bool:
        return bool(target.control_url)

    @classmethod
    def recognises(cls, client: DeploymentClient, seen: Answered) -> str | None:
        """Where a control plane is named, it is asked first and decides (its names checked next);
        otherwise a server answering the hot-load list at the base URL is one of both."""
        hot_loads, t = _hot_loads(client, seen), client.target
        if t.control_url or _lists_hot_loads(hot_loads):
            return f"GET {t.control_base if t.control_url else ''}{HOT_LOADS} answers CoreWeave's hot-load list"
        return None

    @classmethod
    def check_names(cls, client: DeploymentClient, seen: Answered, decided: str) -> None:
        t = client.target
        hot_loads = _hot_loads(client, seen)
        said = f"GET {t.control_base}{HOT_LOADS}: HTTP {hot_loads.status_code} {excerpt(hot_loads)}"
        if t.deployment is None:
            raise PreflightError(
                f"{t.base_url} is CoreWeave's hot-load API ({decided}): pass --rl-deployment=<the deployment's UUID> "
                "and set COREWEAVE_API_KEY (rl_control_url where the hot-load API has a host of its own)"
            )
        if hot_loads.status_code in (401, 403):
            raise PreflightError(f"the hot-load API refused its key ({said}): check COREWEAVE_API_KEY")
        if hot_loads.status_code == 404:
            raise PreflightError(
                f"the hot-load API does not know deployment {t.deployment} ({said}): check --rl-deployment"
            )
        if not _lists_hot_loads(hot_loads):
            raise PreflightError(f"no CoreWeave hot-load API at {t.control_base} ({said}): check rl_control_url")

    def __init__(self, client: DeploymentClient):
        super().__init__(client)
        self.deployment = client.target.deployment  # the deployment's UUID
        self.targets: dict[str, str] = {}  # hot-load id -> the identity it loads
        self.newest: str | None = None  # the id of the newest hot-load

    def _control(self, method: str, path: str, *, headers: dict[str, str] | None = None, **kw: Any) -> httpx.Response:
        sent = self.client.control_headers() | (headers or {})
        return self.client.request(method, f"{self.client.target.control_base}{PREFIX}{path}", headers=sent, **kw)

    # ----------------------------------------------------------------------- inference

    def complete(
        self,
        body: dict[str, Any],
        **options: Unpack[CompletionOptions],
    ) -> Stream:
        sent, options["headers"], salt = bound(body, options.get("headers"))
        if salt is not None:
            sent["nvext"] = {**as_object(sent.get("nvext")), "cache_salt": salt}
        if not options.get("chat"):
            sent = legacy_body(sent)
        return self.client.complete(sent, reading=self.reading, **options)

    # ----------------------------------------------------------------------- what is served

    def status(self, *, headers: dict[str, str] | None = None) -> Status:
        newest = self.newest
        if newest is None:  # the deployment's own newest hot-load, if another client made one
            listed = self._control("GET", "/hotLoads", headers=headers, params={"parentDeploymentId": self.deployment})
            if listed.status_code != 200:
                return Status(listed, [], [f"GET hotLoads: HTTP {listed.status_code} {listed.text[:200]!r}"])
            items = (json_object(listed) or {}).get("hotLoads")
            spec = as_object(as_object(items[0] if isinstance(items, list) and items else None).get("spec"))
            newest = spec.get("id")
            if not isinstance(newest, str):
                return Status(listed, [], [], unread="no hot-load yet: CoreWeave lists replicas per hot-load")
            if isinstance(spec.get("identity"), str):
                self.targets[newest] = spec["identity"]
        r = self._control("GET", f"/hotLoads/{newest}/replicas", headers=headers)
        doc = json_object(r) if r.status_code == 200 else None
        rows = doc.get("replicas") if doc is not None else None
        if not isinstance(rows, list):
            return Status(
                r, [], [f"GET hotLoads/{newest}/replicas: HTTP {r.status_code}, no 'replicas' list: {r.text[:200]!r}"]
            )
        target = self.targets.get(newest)
        replicas = []
        for row in map(as_object, rows):
            state = row.get("state")
            stage = STAGES.get(state) if isinstance(state, str) else None
            loading = {"stage": stage or str(state), "target_snapshot_identity": target}
            if state == "ERROR":
                loading["error"] = row.get("errorReason") or "load failed"
            replicas.append(
                {
                    "name": row.get("name"),
                    "readiness": state == "READY",
                    "current_snapshot_identity": row.get("currentSnapshotIdentity"),
                    "loading_state": loading,
                }
            )
        return Status(r, replicas)

    # ----------------------------------------------------------------------- loading

    def load(
        self,
        signal: dict[str, Any],
        **options: Unpack[LoadOptions],
    ) -> httpx.Response:
        """One POST; the deployment swaps its replicas on its own after it (one at a time)."""
        headers = options.get("headers")
        policy = reset_policy(signal)
        if policy not in self.reset_policies:
            raise self.unbound(f"reset_prompt_cache {policy!r}")
        body: dict[str, Any] = {
            "deploymentId": self.deployment,
            "identity": signal.get("identity"),
            "type": "SNAPSHOT_TYPE_FULL",
            "hotLoadId": str(uuid.uuid4()),
            "promptCachePolicy": POLICIES[policy],
        }
        meta = signal.get("incremental_snapshot_metadata")
        if meta:
            body["type"] = "SNAPSHOT_TYPE_INCREMENTAL"
            body["incrementalSnapshotMetadata"] = {
                "previousSnapshotIdentity": as_object(meta).get("previous_snapshot_identity"),
                "compressionFormat": "COMPRESSION_FORMAT_ZSTD",
                "checksumFormat": "CHECKSUM_FORMAT_ADLER32",
            }
        r = self._control("POST", "/hotLoads", headers=headers, json=body)
        if r.status_code == 200:
            self.targets[body["hotLoadId"]] = str(signal.get("identity"))
            self.newest = body["hotLoadId"]
        return r

    def restore(self, label: str) -> str | None:
        return self.signal_again(label)

    def busy(self, answer: httpx.Response) -> bool:
        """CoreWeave refuses a load while another is in progress with failed_precondition
        (HTTP 400, Connect's code for it)."""
        doc = json_object(answer) if answer.status_code == 400 else None
        return doc is not None and doc.get("code") == "failed_precondition" and "in progress" in str(doc.get("message"))

    # ----------------------------------------------------------------------- discovery

    def discover(self, *, transition: str | None, decided: str) -> Discovery:
        d = Discovery(self.engine, decided, transition=transition or self.transition)
        inference_probes(self, d)
        auth_probe(self, d)
        listed = self._control("GET", "/hotLoads", params={"parentDeploymentId": self.deployment})
        mark(d, "hot_load_api", listed.status_code == 200, f"GET {PREFIX}/hotLoads: HTTP {listed.status_code}")
        mark(d, "incremental", listed.status_code == 200, "type SNAPSHOT_TYPE_INCREMENTAL (XOR, zstd, Adler-32)")
        mark(d, "transition", True, "TRANSITION_MODE_ASYNC, the only mode CoreWeave documents")
        d.replicas = len(self.replicas())
        for name in (
            "pause",
            "cache_reset",
            "ledger",
            "hint",
            "lora",
            "raw_output",
            "perf_metrics",
            "routing_matrix",
            "policy_version",
            "nonstream_version",
        ):
            mark(d, name, False, "no CoreWeave binding")
        ids = self.complete({"prompt": PROBE_IDS, "max_tokens": 1})
        mark(d, "token_id_prompts", ids.ok and bool(ids.chunks), said(ids))
        logprobs = self.complete({"prompt": PROBE_IDS, "max_tokens": 1, "logprobs": True})
        lps = logprobs.entries
        mark(d, "logprobs", bool(lps) and all("token_id" in e for e in lps), f"{len(lps)} logprobs entries")
        echoed = self.complete({"prompt": PROBE_IDS, "max_tokens": 1, "logprobs": True, "echo": True})
        mark(d, "echo", len(echoed.entries) > 1, f"{len(echoed.entries)} entries for a prompt and one token")
        back = self.complete({"prompt": PROBE_IDS, "max_tokens": 1, "return_token_ids": True})
        mark(d, "token_ids", isinstance(back.choice_field("token_ids"), list), "choices[].token_ids")
        return d
