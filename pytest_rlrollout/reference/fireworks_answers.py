"""A request's answer on the Fireworks wire: OpenAI-shaped chunks and bodies with the Fireworks
extensions (`model@identity` on every chunk, `logprobs.content[]` with token ids and sampling
logprobs, routing matrices, raw_output, token ids, perf_metrics, the cached-token headers)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_rlrollout.reference.inference_request import BadRequest, Inference, quoted
from pytest_rlrollout.reference.replica import Job
from pytest_rlrollout.reference.run import Run
from pytest_rlrollout.reference.text import Text

if TYPE_CHECKING:
    from pytest_rlrollout.reference.controller import Deployment

log = logging.getLogger(__name__)


class FireworksRun(Run):
    """Turns a job's events into OpenAI-shaped chunks or a response body."""

    def __init__(self, dep: Deployment, text: Text, req: Inference, headers: dict[str, str]):
        super().__init__(dep, text, req.stop, text.stop_ids)
        self.req = req
        self._streamed = 0  # tokens streamed so far (R3-STREAM-1 fault)
        self.request_id = headers.get("x-request-id") or uuid.uuid4().hex
        self.id = f"{'chatcmpl' if req.chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        session = headers.get("x-multi-turn-session-id")
        replica = dep.route(session, headers.get("x-session-affinity"))
        self.version = self.admitted_version = replica.version
        drain = headers.get("x-fireworks-hot-load-drain-timeout")
        try:
            drain_timeout = float(drain) if drain is not None else dep.settings.drain_timeout
        except ValueError:
            drain_timeout = math.nan
        if not (math.isfinite(drain_timeout) and drain_timeout >= 0):
            raise BadRequest(quoted(f"x-fireworks-hot-load-drain-timeout: expected seconds >= 0, got {drain!r}"))
        isolation = headers.get("x-prompt-cache-isolation-key") or req.isolation
        seed = req.seed if req.seed is not None else (hash(self.id) & 0x7FFFFFFF)
        job = Job(
            prompt=np.array(req.prompt),
            max_tokens=req.max_tokens,
            params=req.params,
            rng=np.random.default_rng(seed),
            stop_ids=frozenset() if req.ignore_eos else text.stop_ids,
            session=session,
            isolation=isolation,
            want_prompt_entries=req.echo or req.echo_last is not None,
            loop=asyncio.get_running_loop(),
            queue=self.queue,
            drain_timeout=drain_timeout,
            cache_max_len=req.cache_max_len,
        )
        self.submit(replica, job)

    def headers(self) -> dict[str, str]:
        out = {
            "x-request-id": self.request_id,
            "fireworks-backend-host": self.replica,
            "fireworks-cached-prompt-tokens": str(
                self.cached + (self.dep.settings.block_size if self.f("CACHE-RPT-1") else 0)
            ),
            "fireworks-prompt-tokens": str(len(self.req.prompt)),
            "fireworks-deployment": self.dep.settings.deployment,
        }
        if self.f("empty-content"):
            del out["fireworks-cached-prompt-tokens"], out["fireworks-prompt-tokens"]
        return out

    def entry(
        self,
        token: int,
        logprob: float,
        sampling_logprob: float | None,
        routing: np.ndarray | None,
        prompt: bool = False,
    ) -> dict:
        f = self.f
        e: dict[str, Any] = {
            "token": self.text.piece(token),
            "logprob": -logprob if not prompt and f("INF-LOGPROBS-1") else logprob,
            "token_id": token,
        }
        if not f("INF-LOGPROBS-1a"):
            e["sampling_logprob"] = sampling_logprob
        e["top_logprobs"] = []
        if self.req.routing and routing is not None and not self._routing_dropped(prompt):
            m = np.array(routing, dtype=np.uint8)
            if f("R3-RANGE-1"):
                m.reshape(-1)[-1] = self.dep.replicas[0].model.experts
            if f("R3-DET-1"):
                m = np.random.default_rng().permuted(m, axis=-1)
            if f("NUM-ROUTE-1"):
                m = m[::-1]
            raw = np.ascontiguousarray(m).tobytes()
            e["routing_matrix"] = base64.b64encode(raw[:-1] if f("R3-SHAPE-1") else raw).decode()
        return e

    def _routing_dropped(self, prompt: bool) -> bool:
        f = self.f
        if (self.req.chat and f("R3-CHAT-1")) or (not self.req.chat and not self.req.stream and f("R3-COMP-1")):
            return True
        if prompt and self.req.echo and f("R3-ECHO-1"):
            return True
        if prompt or not (self.req.stream and f("R3-STREAM-1")):
            return False
        self._streamed += 1
        return self._streamed % 2 == 0

    def prompt_part(self, logprobs: np.ndarray, routing: np.ndarray) -> tuple[list[int], list[dict]]:
        p = self.req.prompt
        start = 0 if self.req.echo or self.f("R3-ECHOLAST-1") else max(0, len(p) - (self.req.echo_last or 0))
        ids = p[start:]
        entries = [self.entry(p[i], float(logprobs[i]), None, routing[i], prompt=True) for i in range(start, len(p))]
        return ids, entries

    def choice(self, text: str, entries: list[dict] | None, finish: str | None) -> dict:
        c: dict[str, Any] = {"index": 0}
        if self.req.chat:
            c["delta" if self.req.stream else "message"] = {"role": "assistant", "content": text}
        else:
            c["text"] = text
        c["logprobs"] = {"content": entries} if self.req.logprobs and entries is not None else None
        c["finish_reason"] = finish
        return c

    def model_name(self, version: str) -> str:
        if self.req.stream and version != self.admitted_version and self.f("VER-STREAM-1"):
            return self.req.model
        if not self.req.stream and self.f("VER-NONSTREAM-1"):  # a version cached at start-up
            return f"{self.req.model}@{self.dep.settings.base_identity}"
        if self.req.stream and self.f("SWAP-ASYNC-2:stale"):  # the label of the stream's start
            return f"{self.req.model}@{self.admitted_version}"
        return f"{self.req.model}@{version}"

    def chunk(self, choice: dict | None, version: str, **extra) -> bytes:
        """One SSE event; `choice` None: a chunk without choices (a usage-only chunk)."""
        body = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.req.chat else "text_completion",
            "created": self.created,
            "model": self.model_name(version),
            "choices": [] if choice is None else [choice],
            **extra,
        }
        return f"data: {json.dumps(body)}\n\n".encode()

    def completion_ids(self, prompt_ids: list[int]) -> list[int]:
        return prompt_ids + [t.id for t in self.tokens]

    def usage(self) -> dict:
        n = len(self.tokens) + (1 if self.f("INF-USAGE-1") else 0)
        p = len(self.req.prompt)
        return {
            "prompt_tokens": p,
            "completion_tokens": n,
            "total_tokens": p + n,
            "prompt_tokens_details": {"cached_tokens": self.cached},
        }

    def perf(self) -> dict:
        out = {
            "prompt-tokens": len(self.req.prompt),
            "cached-prompt-tokens": self.cached,
            "server-time-to-first-token": round(self.ttft if self.ttft is not None else time.monotonic() - self.t0, 6),
            "server-processing-time": round(time.monotonic() - self.t0, 6),
            "backend-host": self.replica,
        }
        if self.f("INF-PERF-1"):
            del out["cached-prompt-tokens"]
        return out

    def final_extra(self, prompt_ids: list[int]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.req.raw_output:
            out["raw_output"] = {
                "prompt_token_ids": self.req.prompt,
                "completion_token_ids": self.completion_ids([] if self.f("INF-RAW-1") else prompt_ids),
                "completion": self.text_so_far,
            }
        if self.req.return_token_ids:
            out["prompt_token_ids"] = self.req.prompt
            out["token_ids"] = [t.id for t in self.tokens][: -1 if self.f("INF-TOKENIDS-1") else None]
        return out

    async def stream(self) -> AsyncIterator[bytes]:
        prompt_ids: list[int] = []
        if self.f("empty-content"):
            async for _ in self.events():
                pass
            yield self.chunk(self.choice("", None, "stop"), self.version)
            yield b"data: [DONE]\n\n"
            return
        try:
            async for kind, value in self.events():
                if kind == "prompt":
                    prompt_ids, entries = self.prompt_part(value[0], value[1])
                    ptext = self.text.decode(prompt_ids) if not self.req.chat else ""
                    yield self.chunk(self.choice(ptext, entries, None), self.version)
                elif kind == "token":
                    piece = self.take(value)
                    entry = self.entry(value.id, value.logprob, value.sampling_logprob, value.routing)
                    yield self.chunk(self.choice(piece, [entry], None), value.version)
                    if self.finish:
                        self.job.cancelled.set()
                        break
                elif kind == "end":
                    self.finish = self.finish or value
                elif kind == "abort":  # SWAP-ASYNC-1 fault: the stream is cut at the swap
                    yield self.chunk(self.choice("", None, "abort"), self.version)
                    return
                elif kind == "error":
                    yield self.error_event(*value)
                    return
            extra: dict[str, Any] = {"usage": self.usage()}
            if self.req.perf_metrics:
                extra["perf_metrics"] = self.perf()
            final = self.choice("", [] if self.req.logprobs else None, self.finish or "stop") | self.final_extra(
                prompt_ids
            )
            if self.f("usage-only-chunk"):  # as OpenAI streams usage: a chunk of its own, with no choice
                yield self.chunk(final, self.version)
                yield self.chunk(None, self.version, **extra)
            else:
                yield self.chunk(final, self.version, **extra)
            if self.f("INF-SSE-1"):
                yield self.chunk(self.choice("", None, None), self.version, usage=None)
            yield b"data: [DONE]\n\n"
        except Exception as e:  # the headers are out: the stream ends with an error event, not a reset
            log.exception("a stream failed")
            yield self.error_event(500, f"internal error: {type(e).__name__}")
        finally:
            self.job.cancelled.set()

    @staticmethod
    def error_event(status: int, message: str) -> bytes:
        return f"data: {json.dumps({'error': {'message': message, 'status_code': status}})}\n\n".encode()

    async def body(self) -> dict:
        prompt_ids: list[int] = []
        entries: list[dict] = []
        async for kind, value in self.events():
            if kind == "prompt":
                prompt_ids, pentries = self.prompt_part(value[0], value[1])
                entries += pentries
            elif kind == "token":
                self.take(value)
                entries.append(self.entry(value.id, value.logprob, value.sampling_logprob, value.routing))
                if self.finish:
                    self.job.cancelled.set()
                    break
            elif kind == "end":
                self.finish = self.finish or value
            elif kind == "error":
                raise BadRequest(value[1], status=value[0])
            elif kind == "abort":
                self.finish = "abort"
                break
        text = (self.text.decode(prompt_ids) if prompt_ids and not self.req.chat else "") + self.text_so_far
        choice = self.choice(text, entries, self.finish or "stop") | self.final_extra(prompt_ids)
        out = {
            "id": self.id,
            "object": "chat.completion" if self.req.chat else "text_completion",
            "created": self.created,
            "model": self.model_name(self.version),
            "choices": [choice],
            "usage": self.usage(),
        }
        if self.req.perf_metrics:
            out["perf_metrics"] = self.perf()
        if self.f("empty-content"):
            out.update(choices=[self.choice("", None, "stop")])
            for field in ("usage", "perf_metrics"):
                out.pop(field, None)
        return out
