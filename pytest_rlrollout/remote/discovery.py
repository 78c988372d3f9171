"""What answers, and what it offers: the preflight before any test, and the capability probes.

Nothing here changes a deployment: status, ledger and resource reads, and one-token completions.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from pytest_rlrollout.contract.capabilities import CAPABILITIES
from pytest_rlrollout.contract.catalogue import Profile
from pytest_rlrollout.remote.client import DeploymentClient, Target
from pytest_rlrollout.remote.limits import LimitExceeded
from pytest_rlrollout.remote.stream import EXCERPT, Stream, json_object, logprob_entries

PROBE_TEXT = "Hello"
PROBE_IDS = [1, 2, 3]


class PreflightError(Exception):
    """The run cannot judge this deployment; the message says what to fix."""


@dataclass
class Discovery:
    """The deployment's profile and capabilities, each with how the probe saw it."""

    profile: Profile
    decided: str  # how the profile was chosen
    capabilities: dict[str, bool] = field(default_factory=dict)
    seen: dict[str, str] = field(default_factory=dict)  # capability -> what the probe observed
    replicas: int = 0
    transition: str | None = None

    def has(self, name: str) -> bool:
        if name not in CAPABILITIES:
            raise KeyError(f"unknown capability {name!r} (known: {', '.join(CAPABILITIES)})")
        return self.capabilities.get(name, False)

    def table(self) -> list[tuple[str, str, str]]:
        """(capability, yes/no, what was seen) rows, in vocabulary order."""
        rows = []
        for name, cap in CAPABILITIES.items():
            if name in self.capabilities:
                rows.append((name, "yes" if self.capabilities[name] else "no", self.seen.get(name, cap.probe)))
        return rows

    def as_dict(self) -> dict[str, Any]:
        return {"profile": self.profile, "decided": self.decided, "capabilities": self.capabilities,
                "seen": self.seen, "replicas": self.replicas, "transition": self.transition}  # fmt: skip

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Discovery:
        return cls(**doc)


# --------------------------------------------------------------------------- preflight


def preflight(client: DeploymentClient, requested: Profile | None) -> Profile:
    """Reach the deployment the options name, with their key and names; the profile it has
    (`requested`, or decided from what answers). Raises PreflightError saying what to fix."""
    t = client.target
    status = _get(client, client._hot_load_url(), client.hot_load_headers(), "--rl-base-url")
    _authorized(status, "GET the hot-load status")
    accounts = _get(client, t.base_url.rstrip("/") + "/v1/accounts", client.auth_headers(), "--rl-base-url")
    _authorized(accounts, "GET /v1/accounts")
    hot_load_api = status.status_code == 200 and json_object(status) is not None
    control_plane = accounts.status_code == 200 and isinstance((json_object(accounts) or {}).get("accounts"), list)
    profile = requested or ("fireworks" if hot_load_api or control_plane else "openai")
    if profile == "fireworks":
        _fireworks_names(t, status, hot_load_api, control_plane)
    client.target = _with_profile(t, profile)
    _inference_answers(client)
    return profile


def _fireworks_names(t: Target, status: httpx.Response, hot_load_api: bool, control_plane: bool) -> None:
    if not t.deployment:
        raise PreflightError(f"{t.base_url} is a Fireworks API: pass --rl-deployment=accounts/<a>/deployments/<d>")
    said = f"GET status: HTTP {status.status_code} {_excerpt(status)}"
    if not (hot_load_api or control_plane):
        raise PreflightError(f"no hot-load API at {t.base_url} ({said}): check --rl-base-url, or pass "
                             "--rl-profile=openai for a plain OpenAI-compatible server")  # fmt: skip
    if status.status_code == 404:
        raise PreflightError(
            f"the hot-load API does not know deployment {t.deployment} ({said}): check --rl-deployment"
        )
    if 400 <= status.status_code < 500:
        raise PreflightError(f"the hot-load API refused the names ({said}): check --rl-model and --rl-deployment")
    if not hot_load_api:
        raise PreflightError(f"the hot-load status did not answer with a JSON object ({said})")


def _get(client: DeploymentClient, url: str, headers: dict[str, str], option: str) -> httpx.Response:
    try:
        return client.request("GET", url, headers=headers)
    except (httpx.HTTPError, LimitExceeded) as e:
        raise PreflightError(f"nothing answers at {url} ({type(e).__name__}: {e}): check {option}") from None


def _authorized(r: httpx.Response, what: str) -> None:
    if r.status_code in (401, 403):
        raise PreflightError(
            f"the API key was refused ({what}: HTTP {r.status_code} {_excerpt(r)}): check --rl-api-key or FIREWORKS_API_KEY"
        )


def _inference_answers(client: DeploymentClient) -> None:
    t = client.target
    url = client.inference_url()
    try:
        s = client.complete({"prompt": PROBE_TEXT, "max_tokens": 1})
        if s.status in (400, 422) and "model" not in s.body.lower():  # perhaps a server of token-id prompts
            s = client.complete({"prompt": PROBE_IDS, "max_tokens": 1})
    except (httpx.HTTPError, LimitExceeded) as e:
        raise PreflightError(f"nothing answers at {url} ({type(e).__name__}: {e}): check --rl-inference-url") from None
    if s.status in (401, 403):
        raise PreflightError(f"the API key was refused (POST {url}: HTTP {s.status}): check --rl-api-key")
    if s.status == 200 and s.chunks:
        return
    said = s.body[:EXCERPT]
    if s.status in (400, 404) and "model" in said.lower():
        names = "--rl-deployment" if t.profile == "fireworks" else "--rl-model"
        raise PreflightError(
            f"the deployment does not serve model {t.body_model!r} (HTTP {s.status} {said}): check {names}"
        )
    if s.status in (404, 405):
        raise PreflightError(f"no completions endpoint at {url} (HTTP {s.status} {said}): check --rl-inference-url")
    raise PreflightError(f"a one-token completion at {url} was not answered (HTTP {s.status} {said})")


def _with_profile(t: Target, profile: Profile) -> Target:
    return t if t.profile == profile else replace(t, profile=profile)


def _excerpt(r: httpx.Response) -> str:
    return r.text[:200]


# --------------------------------------------------------------------------- capabilities


def discover(
    client: DeploymentClient, profile: Profile, *, transition: str | None = None, decided: str = ""
) -> Discovery:
    """Probe every capability of the vocabulary that the profile's clauses can use; `decided`
    says how the profile was chosen."""
    d = Discovery(profile, decided)
    text = client.complete({"prompt": PROBE_TEXT, "max_tokens": 1})
    _set(d, "text_prompts", text.ok and bool(text.chunks), _said(text))
    channels = _cached_channels(text)
    _set(d, "cached_tokens", bool(channels), ", ".join(channels) or "no cached-token channel in the answer")
    host = text.headers.get("fireworks-backend-host")
    _set(d, "backend_host", host is not None, f"fireworks-backend-host: {host}" if host else "no such header")
    if profile == "openai":
        return d
    replicas = client.replicas()
    d.replicas = len(replicas)
    _set(d, "hot_load_api", bool(replicas), f"{len(replicas)} replica(s) in the status")
    _set(d, "lora", any("loaded_adapters" in r for r in replicas), "replicas list loaded_adapters")
    ledger = client.ledger()
    _set(d, "ledger", ledger.status_code == 200, f"GET ledger: HTTP {ledger.status_code}")
    hint = client.request("GET", client._hot_load_url("/hint"), headers=client.hot_load_headers())
    _set(d, "hint", hint.status_code != 404, f"GET hint: HTTP {hint.status_code}")
    d.transition = transition or (client.resource().get("hotLoadTransitionType") or "").upper() or None
    _set(d, "transition", d.transition is not None, d.transition or "neither the resource nor --rl-transition says")
    ids = client.complete({"prompt": PROBE_IDS, "max_tokens": 1})
    _set(d, "token_id_prompts", ids.ok and bool(ids.chunks), _said(ids))
    prompt: Any = PROBE_IDS if d.has("token_id_prompts") else PROBE_TEXT
    logprobs = client.complete({"prompt": prompt, "max_tokens": 1, "logprobs": True})
    _set(d, "logprobs", bool(logprobs.entries), f"{len(logprobs.entries)} logprobs entries")
    routed = client.complete({"prompt": prompt, "max_tokens": 2, "stream": True, "logprobs": True,
                              "include_routing_matrix": True})  # fmt: skip
    routes = [e for e in logprob_entries(routed.chunks) if "routing_matrix" in e]
    _set(d, "routing_matrix", bool(routes), f"{len(routes)} of {len(routed.entries)} streamed entries carry one")
    served = {r.get("current_snapshot_identity") for r in replicas} | {
        a.get("identity") for r in replicas for a in r.get("loaded_adapters") or [] if isinstance(a, dict)
    }
    versions = routed.versions
    _set(d, "policy_version", bool(versions) and None not in versions,
         f"{sum(v is not None for v in versions)} of {len(versions)} chunks name <model>@<identity>")  # fmt: skip
    plain = client.complete({"prompt": prompt, "max_tokens": 1})
    model = plain.final.get("model") if plain.ok else None
    model = model if isinstance(model, str) else ""
    _set(d, "nonstream_version", "@" in model and model.rpartition("@")[2] in served, f"model {model!r}")
    echoed = client.complete({"prompt": prompt, "max_tokens": 1, "logprobs": True, "echo": True})
    _set(d, "echo", len(echoed.entries) > 1, f"{len(echoed.entries)} entries for a prompt and one token")
    raw = client.complete({"prompt": prompt, "max_tokens": 1, "raw_output": True})
    _set(d, "raw_output", isinstance(raw.choice_field("raw_output"), dict), "choices[].raw_output")
    ids_back = client.complete({"prompt": prompt, "max_tokens": 1, "return_token_ids": True})
    _set(d, "token_ids", isinstance(ids_back.choice_field("token_ids"), list), "choices[].token_ids")
    perf = client.complete({"prompt": prompt, "max_tokens": 1, "perf_metrics_in_response": True})
    _set(d, "perf_metrics", isinstance(perf.final.get("perf_metrics"), dict), "perf_metrics on the answer")
    return d


def _set(d: Discovery, name: str, value: bool, seen: str) -> None:
    d.capabilities[name] = bool(value)
    d.seen[name] = seen


def _said(s: Stream) -> str:
    return "HTTP 200" if s.ok else f"HTTP {s.status} {(s.body or '; '.join(s.problems))[:120]}"


def _cached_channels(s: Stream) -> list[str]:
    return [channel for channel, value in s.cached_tokens().items() if value is not None]
