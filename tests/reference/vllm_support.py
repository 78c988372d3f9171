"""What the vLLM-dialect tests share: raw httpx against a running reference deployment speaking
vLLM's wire, a stream read on a thread of its own (so a test can pause, reload and resume while
it runs), snapshots to reload, and prompt logprobs scored locally with the numpy engine."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from pytest_rlrollout.reference.model import Model, Sequence_, log_softmax
from pytest_rlrollout.remote.polling import wait_until
from pytest_rlrollout.snapshot import build, tiny_moe

BASE = tiny_moe.BASE_IDENTITY
LONG = [(7 * i + 3) % 500 + 5 for i in range(300)]  # 300 prompt tokens: two cache blocks
SHORT = list(range(10, 40))
SLOW = 0.05  # seconds per decode step while a test lands a pause or a swap inside a stream


class VllmClient:
    def __init__(self, dep):
        self.dep = dep
        self.http = httpx.Client(base_url=dep.base_url, timeout=60)

    def post(self, path: str, body: Any = None, **params: Any) -> httpx.Response:
        query = {k: str(v).lower() if isinstance(v, bool) else v for k, v in params.items()}
        return self.http.post(path, json=body, params=query)

    def complete(self, prompt, **body) -> httpx.Response:
        return self.post("/v1/completions", {"model": "tiny", "prompt": prompt, "temperature": 0, **body})

    def generate(self, ids, headers=None, **sampling) -> httpx.Response:
        extra = {
            k: sampling.pop(k) for k in ("cache_salt", "return_token_ids", "output_mode", "request_id") if k in sampling
        }
        body = {"token_ids": ids, "sampling_params": {"temperature": 0, **sampling}, **extra}
        return self.http.post("/inference/v1/generate", json=body, headers=headers or {})

    def label(self) -> str:
        return self.http.get("/weight_info").json()["weight_version"]

    def set_label(self, label: str) -> httpx.Response:
        return self.post("/update_weight_version", {"new_version": label})

    def reload(self, path: Path | str) -> httpx.Response:
        return self.post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(path)}})

    def swap(self, path: Path, label: str, reset: bool = True) -> None:
        """The project's vLLM driver's load: pause (keep), reload, label, reset, resume."""
        assert self.post("/pause", mode="keep", clear_cache=False).status_code == 200
        try:
            r = self.reload(path)
            assert r.status_code == 200, r.text
            assert self.set_label(label).status_code == 200
            if reset:
                assert self.post("/reset_prefix_cache").status_code == 200
        finally:
            assert self.post("/resume").status_code == 200

    def prompt_logprobs(self, ids, **extra) -> list[float]:
        """The served logprob of every prompt token after the first (a fingerprint of the weights)."""
        r = self.generate(ids, max_tokens=1, prompt_logprobs=0, **extra)
        assert r.status_code == 200, r.text
        return [d[str(t)]["logprob"] for t, d in zip(ids[1:], r.json()["prompt_logprobs"][1:], strict=True)]

    def decode(self, ids, n: int = 4, **extra) -> tuple[list[int], list[float], int]:
        """Greedy output tokens, their logprobs, and the cached prompt tokens reported."""
        r = self.generate(ids, max_tokens=n, logprobs=0, ignore_eos=True, **extra)
        assert r.status_code == 200, r.text
        doc = r.json()
        content = doc["choices"][0]["logprobs"]["content"]
        return (
            [e["token_id"] for e in content],
            [e["logprob"] for e in content],
            doc["usage"]["prompt_tokens_details"]["cached_tokens"],
        )

    def cached(self, ids, **extra) -> int:
        return self.decode(ids, n=1, **extra)[2]

    def generated(self) -> int:
        """Tokens the requests in flight generated so far (white-box: read while they are paused)."""
        return sum(j.generated for r in self.dep.deployment.replicas for j in r._active)

    def pending(self) -> int:
        """Requests the engine holds without running them (white-box: what a pause holds)."""
        return sum(len(r._pending) for r in self.dep.deployment.replicas)


class Streamer:
    """A streamed request read on a thread: its SSE lines, the chunks, and how it ended."""

    def __init__(self, client: VllmClient, path: str, body: dict[str, Any]):
        self.lines: list[str] = []
        self.error: Exception | None = None
        self.started = threading.Event()
        self.status = 0
        self._thread = threading.Thread(target=self._read, args=(client, path, body), daemon=True)
        self._thread.start()

    def _read(self, client: VllmClient, path: str, body: dict[str, Any]) -> None:
        try:
            with client.http.stream("POST", path, json=body) as r:
                self.status = r.status_code
                for line in r.iter_lines():
                    if line:
                        self.lines.append(line)
                        self.started.set()
        except httpx.HTTPError as e:
            self.error = e
        finally:
            self.started.set()

    def wait_started(self) -> Streamer:
        assert self.started.wait(60), "the stream sent nothing within 60 s"
        return self

    def read_all(self, client: VllmClient) -> list[int]:
        """The token ids of a stream frozen by a pause, once this side read every one it generated."""
        until(lambda: len(self.token_ids()) == client.generated(), "the tokens generated before the pause read")
        return self.token_ids()

    def join(self) -> Streamer:
        self._thread.join(120)
        assert not self._thread.is_alive(), "the stream did not end within 120 s"
        return self

    @property
    def chunks(self) -> list[dict[str, Any]]:
        return [json.loads(x[6:]) for x in self.lines if x.startswith("data: ") and x != "data: [DONE]"]

    @property
    def done(self) -> bool:
        return bool(self.lines) and self.lines[-1] == "data: [DONE]"

    def token_ids(self) -> list[int]:
        return [t for c in self.chunks for ch in c.get("choices", []) for t in ch.get("token_ids") or []]

    def final_choice(self) -> dict[str, Any]:
        return next(ch for c in reversed(self.chunks) for ch in c.get("choices", []) if ch.get("finish_reason"))


def generating(client: VllmClient, ids=SHORT, max_tokens: int = 400, **extra) -> Streamer:
    """A greedy stream of /inference/v1/generate (token ids back, usage last), started."""
    body = {
        "token_ids": ids,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "sampling_params": {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, **extra},
    }
    return Streamer(client, "/inference/v1/generate", body).wait_started()


def fast(client: VllmClient) -> None:
    """Back to full speed (a test slows decoding only while it lands something inside a stream)."""
    client.dep.deployment.set_pace(token_delay=0.0)


def step(bucket: Path, name: str, seed: int = 1, scale: float = 0.2) -> Path:
    """A full snapshot in the bucket: the base with every weight perturbed."""
    return build.derive(bucket / BASE, bucket / name, build.perturbed(bucket / BASE, seed=seed, scale=scale))


def local_prompt_logprobs(snapshot: Path, ids: list[int]) -> list[float]:
    """The numpy engine's prompt logprobs of `ids` on `snapshot`, computed here."""
    out = Model.load(snapshot).step([Sequence_()], [list(ids)], None)[0]
    lp = log_softmax(out.logits)
    return [float(lp[i - 1, t]) for i, t in enumerate(ids) if i > 0]


def close(a, b, tol: float = 1e-4) -> bool:
    return len(a) == len(b) and float(np.max(np.abs(np.array(a) - np.array(b)))) <= tol


def until(predicate, what: str, timeout: float = 30.0):
    """`predicate()` once it holds, polled with a deadline."""
    return wait_until(predicate, timeout=timeout, interval=0.005, what=what)
