"""The Fireworks binding: the contract's own wire. The hot-load API (`POST`/`GET
/hot_load/v1/models/hot_load`, the hint, the ledger), `model@identity` on every chunk, and the
Fireworks completion extensions (`echo`, `raw_output`, `include_routing_matrix`, ...)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Unpack

from pytest_rlrollout.contract.schemas import problems
from pytest_rlrollout.engines import FALLBACK
from pytest_rlrollout.engines.fireworks import ENGINE
from pytest_rlrollout.remote.discovery import (
    PROBE_IDS,
    PROBE_TEXT,
    Answered,
    Discovery,
    PreflightError,
    excerpt,
    mark,
    said,
)
from pytest_rlrollout.remote.drivers.base import Driver, Status, registered
from pytest_rlrollout.remote.drivers.probes import auth_probe, inference_probes
from pytest_rlrollout.remote.options import LoadOptions
from pytest_rlrollout.remote.stream import json_object

if TYPE_CHECKING:
    import httpx

    from pytest_rlrollout.remote.client import DeploymentClient


HOT_LOAD = "/hot_load/v1/models/hot_load"


class HotLoadAPI:
    """Fireworks' own endpoints over a bounded client: the hot-load API (a signal, the status,
    the hint), and the deployment resource with its ledger. A signal is sent as given (tests
    send malformed ones on purpose)."""

    def __init__(self, client: DeploymentClient):
        self.client = client

    def headers(self) -> dict[str, str]:
        """The key, and the names the hot-load API routes by (fireworks-model, fireworks-deployment)."""
        t = self.client.target
        names = {"fireworks-model": t.model}
        if t.deployment:
            names["fireworks-deployment"] = t.deployment
        return self.client.auth_headers() | names

    def url(self, suffix: str = "") -> str:
        return self.client.target.base_url.rstrip("/") + HOT_LOAD + suffix

    def hot_load(self, body: Any, *, headers: dict[str, str] | None = None) -> httpx.Response:
        """POST a signal (any body: tests send malformed ones on purpose)."""
        h = self.headers() | {"Content-Type": "application/json"} | (headers or {})
        return self.client.request("POST", self.url(), content=json.dumps(body).encode(), headers=h)

    def status(self, *, headers: dict[str, str] | None = None) -> httpx.Response:
        return self.client.request("GET", self.url(), headers=self.headers() | (headers or {}))

    def hint(self, identity: str, file: str) -> httpx.Response:
        body = {"identity": identity, "file": file}
        return self.client.request("POST", self.url("/hint"), json=body, headers=self.headers())

    def hints(self) -> httpx.Response:
        """GET the hint endpoint: whether there is one (a read, changing nothing)."""
        return self.client.request("GET", self.url("/hint"), headers=self.headers())

    def _deployment_url(self) -> str:
        t = self.client.target
        return f"{t.base_url.rstrip('/')}/v1/accounts/{t.account}/deployments/{t.deployment_id}"

    def resource(self) -> dict[str, Any]:
        """The deployment resource (GET /v1/accounts/<a>/deployments/<d>), {} when unavailable."""
        r = self.client.request("GET", self._deployment_url(), headers=self.client.auth_headers())
        doc = json_object(r) if r.status_code == 200 else None
        return doc or {}

    def ledger(self) -> httpx.Response:
        return self.client.request("GET", self._deployment_url() + "/ledger", headers=self.client.auth_headers())

    def reset_ledger(self) -> httpx.Response:
        return self.client.request("DELETE", self._deployment_url() + "/ledger", headers=self.client.auth_headers())

    def replicas(self) -> list[dict[str, Any]]:
        """The status's replicas; [] when the status cannot be read."""
        r = self.status()
        doc = json_object(r) if r.status_code == 200 else None
        replicas = (doc or {}).get("replicas")
        return [x for x in replicas if isinstance(x, dict)] if isinstance(replicas, list) else []

    def served_identities(self) -> list[str | None]:
        """current_snapshot_identity of every replica."""
        return [r.get("current_snapshot_identity") for r in self.replicas()]


class FireworksDriver(Driver):
    engine = registered(ENGINE)

    @property
    def api(self) -> HotLoadAPI:
        return HotLoadAPI(self.client)

    @classmethod
    def recognises(cls, client: DeploymentClient, seen: Answered) -> str | None:
        if seen.hot_load_api or seen.control_plane:
            return "a Fireworks API answers (the hot-load status or /v1/accounts)"
        return None

    @classmethod
    def check_names(cls, client: DeploymentClient, seen: Answered, decided: str) -> None:
        t, status = client.target, seen.status
        if not t.deployment:
            raise PreflightError(f"{t.base_url} is a Fireworks API: pass --rl-deployment=accounts/<a>/deployments/<d>")
        said = f"GET status: HTTP {status.status_code} {excerpt(status)}"
        if not (seen.hot_load_api or seen.control_plane):
            raise PreflightError(
                f"no hot-load API at {t.base_url} ({said}): check --rl-base-url, or pass "
                f"--rl-engine={FALLBACK} for a plain OpenAI-compatible server"
            )
        if status.status_code == 404:
            raise PreflightError(
                f"the hot-load API does not know deployment {t.deployment} ({said}): check --rl-deployment"
            )
        if 400 <= status.status_code < 500:
            raise PreflightError(f"the hot-load API refused the names ({said}): check --rl-model and --rl-deployment")
        if not seen.hot_load_api:
            raise PreflightError(f"the hot-load status did not answer with a JSON object ({said})")

    def status(self, *, headers: dict[str, str] | None = None) -> Status:
        r = self.api.status(headers=headers)
        doc = json_object(r) if r.status_code == 200 else None
        if doc is None:
            return Status(r, [], [f"GET status: HTTP {r.status_code}, not a JSON object: {r.text[:200]!r}"])
        replicas = doc.get("replicas")
        found = [f"{p.message} at {p.path}" for p in problems("hot-load-status", doc) if p.clause == "HL-GET-1"]
        if not isinstance(replicas, list):
            return Status(r, [], found or ["the status has no 'replicas' list"])
        return Status(r, [x for x in replicas if isinstance(x, dict)], found)

    def load(
        self,
        signal: dict[str, Any],
        **options: Unpack[LoadOptions],
    ) -> httpx.Response:
        """One POST; the deployment swaps on its own after it (the status shows the swap: `midway`
        has no place here)."""
        return self.api.hot_load(signal, headers=options.get("headers"))

    def reset_ledger(self) -> httpx.Response:
        return self.api.reset_ledger()

    def restore(self, label: str) -> str | None:
        # The ledger takes no identity twice: where it lists the start identity (a run that
        # reset no ledger), it is reset first, as HL-LEDGER-1 resets it, and the report says so.
        listed = json_object(self.ledger()) or {}
        if any(isinstance(e, dict) and e.get("identity") == label for e in listed.get("entries") or []):
            r = self.reset_ledger()
            if not 200 <= r.status_code < 300:
                return (
                    f"not restored: the ledger lists {label}, and resetting it got HTTP {r.status_code} {r.text[:200]}"
                )
            return f"the ledger reset first (it listed {label}); " + self.signal_again(label)
        return self.signal_again(label)

    def ledger(self) -> httpx.Response:
        return self.api.ledger()

    def hint(self, identity: str, file: str) -> httpx.Response:
        return self.api.hint(identity, file)

    def discover(self, *, transition: str | None, decided: str) -> Discovery:
        api = self.api
        d = Discovery(self.engine, decided)
        inference_probes(self, d)
        auth_probe(self, d)
        replicas = api.replicas()
        d.replicas = len(replicas)
        mark(d, "hot_load_api", bool(replicas), f"{len(replicas)} replica(s) in the status")
        mark(d, "incremental", bool(replicas), "the hot-load API takes incremental_snapshot_metadata")
        for name in ("pause", "cache_reset"):  # the transition and reset_prompt_cache go with a load
            mark(d, name, False, "no Fireworks binding: a load's transition and reset_prompt_cache")
        mark(d, "lora", any("loaded_adapters" in r for r in replicas), "replicas list loaded_adapters")
        ledger = api.ledger()
        mark(d, "ledger", ledger.status_code == 200, f"GET ledger: HTTP {ledger.status_code}")
        hint = api.hints()
        mark(d, "hint", hint.status_code != 404, f"GET hint: HTTP {hint.status_code}")
        d.transition = transition or (api.resource().get("hotLoadTransitionType") or "").upper() or None
        mark(d, "transition", d.transition is not None, d.transition or "neither the resource nor rl_transition says")
        ids = self.complete({"prompt": PROBE_IDS, "max_tokens": 1})
        mark(d, "token_id_prompts", ids.ok and bool(ids.chunks), said(ids))
        prompt: Any = PROBE_IDS if d.has("token_id_prompts") else PROBE_TEXT
        logprobs = self.complete({"prompt": prompt, "max_tokens": 1, "logprobs": True})
        mark(d, "logprobs", bool(logprobs.entries), f"{len(logprobs.entries)} logprobs entries")
        routed = self.complete(
            {"prompt": prompt, "max_tokens": 2, "stream": True, "logprobs": True, "include_routing_matrix": True}
        )
        routes = [e for e in routed.entries if "routing_matrix" in e]
        mark(d, "routing_matrix", bool(routes), f"{len(routes)} of {len(routed.entries)} streamed entries carry one")
        served = {r.get("current_snapshot_identity") for r in replicas} | {
            a.get("identity") for r in replicas for a in r.get("loaded_adapters") or [] if isinstance(a, dict)
        }
        versions = routed.versions
        mark(
            d,
            "policy_version",
            bool(versions) and None not in versions,
            f"{sum(v is not None for v in versions)} of {len(versions)} chunks name <model>@<identity>",
        )
        plain = self.complete({"prompt": prompt, "max_tokens": 1})
        model = plain.final.get("model") if plain.ok else None
        model = model if isinstance(model, str) else ""
        mark(d, "nonstream_version", "@" in model and model.rpartition("@")[2] in served, f"model {model!r}")
        echoed = self.complete({"prompt": prompt, "max_tokens": 1, "logprobs": True, "echo": True})
        mark(d, "echo", len(echoed.entries) > 1, f"{len(echoed.entries)} entries for a prompt and one token")
        raw = self.complete({"prompt": prompt, "max_tokens": 1, "raw_output": True})
        mark(d, "raw_output", isinstance(raw.choice_field("raw_output"), dict), "choices[].raw_output")
        ids_back = self.complete({"prompt": prompt, "max_tokens": 1, "return_token_ids": True})
        mark(d, "token_ids", isinstance(ids_back.choice_field("token_ids"), list), "choices[].token_ids")
        perf = self.complete({"prompt": prompt, "max_tokens": 1, "perf_metrics_in_response": True})
        mark(d, "perf_metrics", isinstance(perf.final.get("perf_metrics"), dict), "perf_metrics on the answer")
        return d
