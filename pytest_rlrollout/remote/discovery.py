"""What answers, and what it offers: the preflight before any test, and the capability probes.

Nothing here changes a deployment: status, ledger and resource reads, and one-token completions.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import httpx

from pytest_rlrollout.contract.capabilities import CAPABILITIES
from pytest_rlrollout.contract.catalogue import Engine
from pytest_rlrollout.remote.client import DeploymentClient, Target
from pytest_rlrollout.remote.limits import LimitExceeded
from pytest_rlrollout.remote.stream import EXCERPT, Stream, json_object

if TYPE_CHECKING:
    from pytest_rlrollout.remote.drivers.base import Driver

PROBE_TEXT = "Hello"
COREWEAVE_HOT_LOADS = "/v1alpha1/inference/hotLoads"
PROBE_IDS = [1, 2, 3]


class PreflightError(Exception):
    """The run cannot judge this deployment; the message says what to fix."""


@dataclass
class Discovery:
    """The deployment's engine and capabilities, each with how the probe saw it."""

    engine: Engine
    decided: str  # how the engine was chosen
    capabilities: dict[str, bool] = field(default_factory=dict)
    seen: dict[str, str] = field(default_factory=dict)  # capability -> what the probe observed
    replicas: int = 0
    transition: str | None = None
    # the base's fingerprint as the deployment served it before the run loaded anything (its own
    # start-up load: no later load path can show it again): {"identity", "logprobs"}, or None
    start: dict[str, Any] | None = None
    version: str | None = None  # the engine's version, where it says (vLLM: GET /version)

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
        return {"engine": self.engine, "decided": self.decided, "capabilities": self.capabilities,
                "seen": self.seen, "replicas": self.replicas, "transition": self.transition,
                "start": self.start, "version": self.version}  # fmt: skip

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Discovery:
        return cls(**doc)


# --------------------------------------------------------------------------- preflight


def preflight(client: DeploymentClient, requested: Engine | None) -> tuple[Engine, str]:
    """Reach the deployment the options name, with their key and names: the engine it has
    (`requested`, or decided from what answers) and why. Raises PreflightError saying what to fix."""
    t = client.target
    status = _get(client, client._hot_load_url(), client.hot_load_headers(), "--rl-base-url")
    _authorized(status, "GET the hot-load status")
    accounts = _get(client, t.base_url.rstrip("/") + "/v1/accounts", client.auth_headers(), "--rl-base-url")
    _authorized(accounts, "GET /v1/accounts")
    hot_load_api = status.status_code == 200 and json_object(status) is not None
    control_plane = accounts.status_code == 200 and isinstance((json_object(accounts) or {}).get("accounts"), list)
    hot_loads = _coreweave_control(client) if requested == "coreweave" or t.control_url else None
    if requested is not None:
        engine, decided = requested, f"--rl-engine={requested}"
    elif hot_loads is not None:  # a CoreWeave UUID and its control plane were named: asked first (checked below)
        engine, decided = (
            "coreweave",
            f"auto: GET {t.control_base}{COREWEAVE_HOT_LOADS} answers CoreWeave's hot-load list",
        )
    elif hot_load_api or control_plane:
        engine, decided = "fireworks", "auto: a Fireworks API answers (the hot-load status or /v1/accounts)"
    elif (version := vllm_version(client)) is not None:
        engine, decided = "vllm", f"auto: GET /version answers vLLM {version}"
    elif (label := sglang_label(client)) is not None:
        engine, decided = "sglang", f"auto: GET /model_info answers SGLang's weight_version {label!r}"
    elif _lists_hot_loads(hot_loads := _coreweave_control(client)):  # at the base URL: a server of both
        engine, decided = "coreweave", f"auto: GET {COREWEAVE_HOT_LOADS} answers CoreWeave's hot-load list"
    else:
        engine, decided = "openai", "auto: no hot-load API and no engine's own API answers"
    if engine == "fireworks":
        _fireworks_names(t, status, hot_load_api, control_plane)
    if engine == "coreweave":
        assert hot_loads is not None  # asked above on every path that decides coreweave
        _coreweave_names(t, hot_loads, decided)
    client.target = _with_engine(t, engine)
    _inference_answers(client)
    return engine, decided


def vllm_version(client: DeploymentClient) -> str | None:
    """vLLM's version, when a vLLM server answers `GET /version` (every vLLM OpenAI server routes it)."""
    r = _get(client, client.target.base_url.rstrip("/") + "/version", client.auth_headers(), "--rl-base-url")
    version = (json_object(r) or {}).get("version") if r.status_code == 200 else None
    return version[:40] if isinstance(version, str) else None


def sglang_label(client: DeploymentClient) -> str | None:
    """The served label, when an SGLang server answers `GET /model_info` with its weight_version."""
    r = _get(client, client.target.base_url.rstrip("/") + "/model_info", client.auth_headers(), "--rl-base-url")
    label = (json_object(r) or {}).get("weight_version") if r.status_code == 200 else None
    return label[:80] if isinstance(label, str) else None


def _coreweave_control(client: DeploymentClient) -> httpx.Response:
    """The hot-load list (the deployment's, when it is named), asked of the control plane with its
    own key; without one, of the base URL with the run's key."""
    t = client.target
    url = t.control_base + COREWEAVE_HOT_LOADS
    option = "rl_control_url" if t.control_url else "--rl-base-url"
    params = {"parentDeploymentId": t.deployment} if t.deployment else None
    try:
        return client.request("GET", url, headers=client.control_headers(), params=params)
    except (httpx.HTTPError, LimitExceeded) as e:
        raise PreflightError(f"nothing answers at {url} ({type(e).__name__}: {e}): check {option}") from None


def _lists_hot_loads(r: httpx.Response) -> bool:
    return r.status_code == 200 and isinstance((json_object(r) or {}).get("hotLoads"), list)


def _coreweave_names(t: Target, hot_loads: httpx.Response, decided: str) -> None:
    said = f"GET {t.control_base}{COREWEAVE_HOT_LOADS}: HTTP {hot_loads.status_code} {_excerpt(hot_loads)}"
    if t.deployment is None:
        raise PreflightError(f"{t.base_url} is CoreWeave's hot-load API ({decided}): pass --rl-deployment=<the deployment's UUID> "
                             "and set COREWEAVE_API_KEY (rl_control_url where the hot-load API has a host of its own)")  # fmt: skip
    if hot_loads.status_code in (401, 403):
        raise PreflightError(f"the hot-load API refused its key ({said}): check COREWEAVE_API_KEY")
    if hot_loads.status_code == 404:
        raise PreflightError(
            f"the hot-load API does not know deployment {t.deployment} ({said}): check --rl-deployment"
        )
    if not _lists_hot_loads(hot_loads):
        raise PreflightError(f"no CoreWeave hot-load API at {t.control_base} ({said}): check rl_control_url")


def _fireworks_names(t: Target, status: httpx.Response, hot_load_api: bool, control_plane: bool) -> None:
    if not t.deployment:
        raise PreflightError(f"{t.base_url} is a Fireworks API: pass --rl-deployment=accounts/<a>/deployments/<d>")
    said = f"GET status: HTTP {status.status_code} {_excerpt(status)}"
    if not (hot_load_api or control_plane):
        raise PreflightError(f"no hot-load API at {t.base_url} ({said}): check --rl-base-url, or pass "
                             "--rl-engine=openai for a plain OpenAI-compatible server")  # fmt: skip
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
        raise PreflightError(f"nothing answers at {url} ({type(e).__name__}: {e}): check rl_inference_url") from None
    if s.status in (401, 403):
        raise PreflightError(f"the API key was refused (POST {url}: HTTP {s.status}): check --rl-api-key")
    if s.status == 200 and s.chunks:
        return
    said = s.body[:EXCERPT]
    if s.status in (400, 404) and "model" in said.lower():
        names = "--rl-deployment" if t.engine == "fireworks" else "--rl-model"
        raise PreflightError(
            f"the deployment does not serve model {t.body_model!r} (HTTP {s.status} {said}): check {names}"
        )
    if s.status in (404, 405):
        raise PreflightError(f"no completions endpoint at {url} (HTTP {s.status} {said}): check rl_inference_url")
    raise PreflightError(f"a one-token completion at {url} was not answered (HTTP {s.status} {said})")


def _with_engine(t: Target, engine: Engine) -> Target:
    return t if t.engine == engine else replace(t, engine=engine)


def _excerpt(r: httpx.Response) -> str:
    return r.text[:200]


# --------------------------------------------------------------------------- capabilities


def inference_probes(driver: Driver, d: Discovery) -> Stream:
    """What every engine is asked first: a one-token completion of a text prompt, and what its
    answer shows (cached-token channels, the serving replica's header). Returns that answer."""
    text = driver.complete({"prompt": PROBE_TEXT, "max_tokens": 1})
    mark(d, "text_prompts", text.ok and bool(text.chunks), said(text))
    channels = _cached_channels(text)
    mark(d, "cached_tokens", bool(channels), ", ".join(channels) or "no cached-token channel in the answer")
    host = text.headers.get("fireworks-backend-host")
    mark(d, "backend_host", host is not None, f"fireworks-backend-host: {host}" if host else "no such header")
    return text


def auth_probe(driver: Driver, d: Discovery) -> None:
    """Whether the deployment checks API keys: a one-token completion under a key it cannot know."""
    wrong = driver.complete({"prompt": PROBE_TEXT, "max_tokens": 1}, headers={"Authorization": "Bearer rl-not-the-key"})
    mark(d, "auth", wrong.status in (401, 403), f"a wrong key: HTTP {wrong.status}")


def mark(d: Discovery, name: str, value: bool, seen: str) -> None:
    """Record what the probe of capability `name` saw."""
    d.capabilities[name] = bool(value)
    d.seen[name] = seen


def said(s: Stream) -> str:
    """A probe's answer in a few words, for the capability table."""
    return "HTTP 200" if s.ok else f"HTTP {s.status} {(s.body or '; '.join(s.problems))[:120]}"


def _cached_channels(s: Stream) -> list[str]:
    return [channel for channel, value in s.cached_tokens().items() if value is not None]
