"""A request's answer on vLLM 0.32's wire, shape for shape as the measured server gives it:

- `/v1/completions`: legacy logprobs (`text_offset`, `token_logprobs`, `tokens`, `top_logprobs`
  dicts keyed by the token's text; echoed prompt positions first, the first one null),
  `prompt_logprobs` per position keyed by token-id strings (`logprob`, `rank`, `decoded_token`;
  the first position null), `token_ids` / `prompt_token_ids` with `return_token_ids`.
- `/v1/chat/completions`: `logprobs.content[]` with `bytes`; a first chunk that only says the role.
- `/inference/v1/generate`: `output_mode` tokens (logprobs by token id with ranks) or text;
  `weight_versions` spans `[{version, start, end}]` over the output tokens on the final chunk
  (the non-streamed choice) only.
- Streams: the token that ends a request carries its finish_reason; with
  `stream_options.include_usage` a last chunk with `choices: []` carries the usage; `data: [DONE]`.
  `system_fingerprint` sits on the last chunk; usage's `prompt_tokens_details` says
  `cached_tokens` (`--enable-prompt-tokens-details`).
- `routed_experts` (`--enable-return-routed-experts`): base64 of a `.npy` int32 array
  `[prompt + output - 1, layers, k]` on the choice that ends a generate-route stream and on every
  non-streamed choice; null elsewhere (vLLM streams it on its generate route only).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_rlrollout.reference.replica import Job, Scored, Token
from pytest_rlrollout.reference.run import Run
from pytest_rlrollout.reference.settings import FIRST_LABEL
from pytest_rlrollout.reference.vllm_requests import VllmError, VllmRequest
from pytest_rlrollout.reference.vllm_text import REPLACEMENT, VllmText

if TYPE_CHECKING:
    from pytest_rlrollout.reference.controller import Deployment

log = logging.getLogger(__name__)
FLOOR = -9999.0  # vLLM's floor for a logprob in its answers (-inf and NaN become it)
DONE = b"data: [DONE]\n\n"
OBJECTS = {"completions": "text_completion", "chat": "chat.completion.chunk"}


class ConnectionDropped(Exception):
    """Raised in a stream to end its connection without an end (the CTL-PAUSE-2 fault)."""


@dataclass(frozen=True)
class Position:
    """One scored position: its token, the logprob reported for it (None: the first prompt
    position, which has no context), the alternatives `(token, logprob, rank)`, the scored token
    first (vLLM's Logprobs dict of a step), and the tokens before it that a byte-level piece is
    completed from (vLLM looks back over the scored tokens of the same kind: prompt or output)."""

    token: int
    logprob: float | None
    items: list[tuple[int, float, int]] = field(default_factory=list)
    context: tuple[int, ...] = ()


@dataclass
class Delta:
    """What one decode step added to a request: its tokens, their text, and the finish if it ended."""

    tokens: list[Token]
    text: str
    finish: str | None = None
    stop_reason: str | int | None = None


def _clamp(x: float) -> float:
    return FLOOR if math.isnan(x) else max(x, FLOOR)


def _items(token: int, logprob: float, scored: Scored) -> list[tuple[int, float, int]]:
    return [(token, logprob, scored.rank)] + [(t, lp, i + 1) for i, (t, lp) in enumerate(scored.top) if t != token]


class VllmRun(Run):
    """Turns a job's events into vLLM's chunks or body for the route it came on."""

    def __init__(self, dep: Deployment, vt: VllmText, req: VllmRequest, headers: dict[str, str]):
        super().__init__(dep, vt.text, req.stop, vt.special_ids | set(req.stop_token_ids))
        self.vt, self.req = vt, req
        self.created = int(time.time())
        base = headers.get("x-request-id") or req.request_id or uuid.uuid4().hex[:16]
        self.id = {"completions": "cmpl-", "chat": "chatcmpl-", "generate": "generate-tokens-"}[req.route] + base
        self.model = dep.settings.model
        self.prompt_positions: list[Position] | None = None
        self.prompt_routing: np.ndarray | None = None  # [prompt, L, k]
        routed = dep.settings.routed_experts
        self._shown = 0  # characters of the text answered so far
        session = headers.get("x-multi-turn-session-id")
        replica = dep.route(session, headers.get("x-session-affinity"))
        self.version = replica.version
        seed = req.seed if req.seed is not None else int.from_bytes(uuid.uuid4().bytes[:8], "little")
        job = Job(
            prompt=np.array(req.prompt),
            max_tokens=req.max_tokens,
            params=req.params,
            rng=np.random.default_rng(seed % 2**64),
            stop_ids=frozenset(req.stop_token_ids) | (frozenset() if req.ignore_eos else vt.stop_ids),
            session=session,
            isolation=req.cache_salt,
            want_prompt_entries=req.prompt_logprobs is not None or routed,
            loop=asyncio.get_running_loop(),
            queue=self.queue,
            drain_timeout=math.inf,
            top_n=req.logprobs,
            prompt_top_n=req.prompt_logprobs,
            read_cache=req.read_cache,
        )
        self.submit(replica, job)

    # ----------------------------------------------------------------------- the engine's output

    def take(self, tok: Token) -> str:
        """Record a token; the text it lets out. vLLM's detokenizer holds back new text that ends
        in U+FFFD (a byte-level piece of a character not finished yet) until a token completes
        or replaces it, and never lets out what is still held at the end."""
        super().take(tok)
        if self.text_so_far.endswith(REPLACEMENT) and not self.finish:
            return ""
        before, self._shown = self._shown, len(self.text_so_far)
        return self.text_so_far[before:]

    @property
    def text_out(self) -> str:
        """The output text as answered."""
        return self.text_so_far[: self._shown]

    async def deltas(self) -> AsyncIterator[Delta]:
        """The request's output step by step, the last delta with its finish; raises VllmError
        for an engine error, ConnectionDropped for a dropped stream."""
        async for kind, value in self.events():
            if kind == "prompt":
                self.prompt_routing = value[1]
                if self.req.prompt_logprobs is not None:
                    self.prompt_positions = self._prompt_positions(value[0], value[2])
            elif kind == "token":
                piece = self.take(value)
                if self.finish:  # a stop string: the request ends with this token
                    self.job.cancelled.set()
                    yield Delta([value], piece, "stop", self.stop_reason)
                    return
                nxt = self.peek()
                if nxt is not None and nxt[0] == "end":  # the step that sampled it also ended it
                    self.finish = nxt[1]
                    if nxt[1] == "stop" and value.id in self.req.stop_token_ids:
                        self.stop_reason = value.id  # a stop token id says itself; the end of sequence says nothing
                    yield Delta([value], piece, nxt[1], self.stop_reason)
                    return
                yield Delta([value], piece)
            elif kind == "end":
                self.finish = value
                yield Delta([], "", value)
                return
            elif kind == "abort":  # SWAP-ASYNC-1 fault: cut at the swap
                self.finish = "abort"
                raise Cut
            elif kind == "drop":
                raise ConnectionDropped("the stream was dropped (CTL-PAUSE-2 fault)")
            elif kind == "error":
                status, message = value
                raise VllmError(message, status, "InternalServerError" if status >= 500 else "BadRequestError")

    def _prompt_positions(self, logprobs: np.ndarray, scores: list[Scored] | None) -> list[Position]:
        p = self.req.prompt
        out = [Position(p[0], None)]
        for i in range(1, len(p)):
            lp = float(logprobs[i])
            out.append(
                Position(p[i], lp, _items(p[i], lp, scores[i - 1]) if scores else [], tuple(p[max(1, i - 4) : i]))
            )
        return out

    def position(self, index: int) -> Position:
        """The output token at `index`, scored."""
        tok = self.tokens[index]
        lp = -tok.logprob if self.f("INF-LOGPROBS-1") else tok.logprob
        context = tuple(t.id for t in self.tokens[max(0, index - 4) : index])
        return Position(tok.id, lp, _items(tok.id, lp, tok.scored) if tok.scored else [], context)

    def spans(self) -> list[dict[str, Any]]:
        """The policy version of every output token as merged runs [start, end)."""
        versions = [t.version for t in self.tokens]
        if versions and self.f("SWAP-ASYNC-2:stale"):  # every token keeps the version it started on
            versions = [versions[0]] * len(versions)
        if not self.req.stream and self.f("VER-NONSTREAM-1"):  # a version cached at start-up
            versions = [FIRST_LABEL] * len(versions)
        out: list[dict[str, Any]] = []
        for i, v in enumerate(versions):
            if out and out[-1]["version"] == v:
                out[-1]["end"] = i + 1
            else:
                out.append({"version": v, "start": i, "end": i + 1})
        shift = -1 if self.f("VER-SPAN-1") else 1 if self.f("VER-SPAN-1:overlap") else 0
        if shift and out and out[-1]["end"] >= 2:
            if len(out) == 1:  # one version: cut its span in two where the fault shows
                half = out[0]["end"] // 2
                out = [{**out[0], "end": half}, {**out[0], "start": half}]
            for span in out[:-1]:  # each span ends one token early (a gap) or late (an overlap)
                span["end"] += shift
        return out

    def _openai_spans(self) -> list[dict[str, Any]] | None:
        """The spans vLLM 0.33's OpenAI routes return, when the request asked for them."""
        return self.spans() if self.req.return_weight_versions else None

    def routed_experts(self, streamed: bool) -> str | None:
        """`routed_rows` as vLLM encodes them: base64 of a `.npy` array."""
        rows = self.routed_rows(streamed)
        if rows is None:
            return None
        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(rows), allow_pickle=False)
        return base64.b64encode(buffer.getvalue()).decode()

    def routed_rows(self, streamed: bool) -> np.ndarray | None:
        """Every fed position's experts (the prompt's, then each output token's but the last),
        int32 [positions, layers, k]; None without the flag or before any forward pass. The R3
        and NUM-ROUTE-1 faults act on the array as the Fireworks dialect's act on its matrices."""
        if not self.dep.settings.routed_experts or self.prompt_routing is None or not self.tokens:
            return None
        if not streamed and self.f("R3-COMP-1"):  # the fault: non-streamed answers carry none
            return None
        rows = np.array([*self.prompt_routing, *(t.routing for t in self.tokens[1:])], dtype=np.int32)
        if self.f("R3-ECHO-1"):  # the prompt's positions are left out, but the one that sampled token 0
            rows = rows[len(self.prompt_routing) - 1 :]
        if self.f("R3-RANGE-1"):
            rows[:, -1, -1] = self.dep.replicas[0].model.experts
        if self.f("R3-DET-1"):
            rows = np.random.default_rng().permuted(rows, axis=-1)
        if self.f("NUM-ROUTE-1"):
            rows = rows[:, ::-1]
        if self.f("R3-SHAPE-1"):  # one expert short in every row
            rows = rows[:, :, :-1]
        return rows

    def output_ids(self) -> list[int]:
        ids = [t.id for t in self.tokens]
        return ids[:-1] if self.f("INF-TOKENIDS-1") else ids

    def usage(self, streamed: bool) -> dict[str, Any]:
        p, n = len(self.req.prompt), len(self.tokens) + (1 if self.f("INF-USAGE-1") else 0)
        out: dict[str, Any] = {"prompt_tokens": p, "total_tokens": p + n, "completion_tokens": n}
        chat = self.req.route == "chat"
        if streamed:
            if not self.f("CACHE-RPT-1"):  # the fault: streamed usage without the cached tokens
                out["prompt_tokens_details"] = {"cached_tokens": self.cached} | (
                    {"created_cache_tokens": 0} if chat else {}
                )
            return out
        details = {"cached_tokens": self.cached, "created_cache_tokens": 0 if chat else None, "multimodal_tokens": None}
        return out | {"prompt_tokens_details": details, "completion_tokens_details": None}

    def prompt_logprobs(self) -> list[dict[str, Any] | None] | None:
        """Per prompt position, the scored token and the alternatives by token-id string."""
        if self.prompt_positions is None:
            return None
        out: list[dict[str, Any] | None] = [None]
        for pos in self.prompt_positions[1:]:
            out.append(
                {
                    str(t): {"logprob": _clamp(lp), "rank": rank, "decoded_token": self.vt.token(t, pos.context)}
                    for t, lp, rank in pos.items
                }
            )
        return out

    # ----------------------------------------------------------------------- logprobs shapes

    def legacy_logprobs(self, positions: Sequence[Position], offset: int) -> dict[str, Any]:
        """/v1/completions' logprobs of `positions`, text offsets counted from `offset`."""
        text_offset: list[int] = []
        token_logprobs: list[float | None] = []
        tokens: list[str] = []
        top: list[dict[str, float] | None] = []
        last = 0
        for pos in positions:
            if pos.logprob is None:
                token = self.vt.decode([pos.token])
                token_logprobs.append(None)
                top.append(None)
            else:
                token = self.vt.token(pos.token, pos.context)
                token_logprobs.append(_clamp(pos.logprob))
                top.append({self.vt.token(t, pos.context): _clamp(lp) for t, lp, _ in pos.items})
            tokens.append(token)
            text_offset.append(offset if not text_offset else text_offset[-1] + last)
            last = len(token)
        return {"text_offset": text_offset, "token_logprobs": token_logprobs, "tokens": tokens, "top_logprobs": top}

    def content_logprobs(self, positions: Sequence[Position], n: int) -> dict[str, Any]:
        """Chat's and the generate route's text-mode `content[]` (`n` alternatives shown)."""
        content = []
        for pos in positions:
            token = self.vt.token(pos.token, pos.context)
            shown = [
                {"token": (t := self.vt.token(tid, pos.context)), "logprob": _clamp(lp), "bytes": _bytes(t)}
                for tid, lp, _ in pos.items[:n]
            ]
            content.append(
                {"token": token, "logprob": _clamp(pos.logprob or 0.0), "bytes": _bytes(token), "top_logprobs": shown}
            )
        return {"content": content}

    @staticmethod
    def token_logprobs(positions: Sequence[Position], n: int) -> dict[str, Any]:
        """The generate route's tokens-mode `content[]`: ids and ranks, no text."""
        return {
            "content": [
                {
                    "token_id": pos.token,
                    "logprob": _clamp(pos.logprob or 0.0),
                    "rank": pos.items[0][2] if pos.items else None,
                    "top_logprobs": [
                        {"token_id": t, "logprob": _clamp(lp), "rank": rank} for t, lp, rank in pos.items[:n]
                    ],
                }
                for pos in positions
            ]
        }

    def _output_logprobs(self, positions: Sequence[Position]) -> dict[str, Any] | None:
        """The logprobs of output positions, in the route's shape (None: not asked for)."""
        n = self.req.logprobs
        if n is None:
            return None
        if self.req.route == "chat":
            return self.content_logprobs(positions, n)
        if self.req.output_mode == "text":
            return self.content_logprobs(positions, max(n, 1))
        return self.token_logprobs(positions, max(n, 1))

    # ----------------------------------------------------------------------- streams

    async def stream(self) -> AsyncIterator[bytes]:
        req = self.req
        sent = 0  # output tokens streamed so far
        offset = 0  # where the next legacy logprobs entry starts in the text
        first = True
        try:
            kind, value = await self.first()  # held here while generation is paused
            if kind == "error":
                status, message = value
                raise VllmError(message, status, "InternalServerError" if status >= 500 else "BadRequestError")
            if req.route == "chat":
                yield self._sse(self._chat_head())
            async for d in self.deltas():
                scored = req.logprobs is not None
                positions = [self.position(sent + i) for i in range(len(d.tokens))] if scored else []
                ids = [t.id for t in d.tokens]
                if d.finish is not None and self.f("INF-TOKENIDS-1"):
                    ids = ids[:-1]
                if req.route == "completions":
                    chunk = self._completion_chunk(d, ids, positions, first, sent, offset)
                    if chunk is None:
                        continue
                    lp = chunk["choices"][0]["logprobs"]
                    if lp and lp["tokens"]:
                        offset = lp["text_offset"][-1] + len(lp["tokens"][-1])
                elif req.route == "chat":
                    chunk = self._chat_chunk(d, ids, positions)
                else:
                    chunk = self._generate_chunk(d, ids, positions, first)
                sent += len(d.tokens)
                first = False
                if req.continuous_usage:
                    p = len(req.prompt)
                    chunk["usage"] = {"prompt_tokens": p, "total_tokens": p + sent, "completion_tokens": sent}
                yield self._sse(chunk)
            if req.include_usage:
                yield self._sse(self._usage_chunk())
            if self.f("INF-SSE-1"):
                yield self._sse(self._trailing_chunk())
            yield DONE
        except Cut:  # SWAP-ASYNC-1 fault: a last chunk says abort, and the stream just stops
            yield self._sse(self._cut_chunk())
        except VllmError as e:
            yield self._sse(e.body())
            yield DONE
        except ConnectionDropped:
            raise
        except Exception as e:  # the headers are out: the stream ends with an error event, not a reset
            log.exception("a stream failed")
            yield self._sse(VllmError(f"internal error: {type(e).__name__}", 500, "InternalServerError").body())
            yield DONE
        finally:
            self.job.cancelled.set()

    @staticmethod
    def _sse(doc: dict[str, Any]) -> bytes:
        return f"data: {json.dumps(doc, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()

    def _head(self) -> dict[str, Any]:
        return {"id": self.id, "object": OBJECTS[self.req.route], "created": self.created, "model": self.model}

    def _completion_chunk(
        self, d: Delta, ids: list[int], positions: list[Position], first: bool, sent: int, offset: int
    ) -> dict[str, Any] | None:
        req = self.req
        text, prompt_ids, scored = d.text, None, positions
        if first and req.echo:  # the prompt comes back with the first output
            text = ("" if req.return_token_ids else req.prompt_text) + text
            scored = [*(self._echoed_positions()), *positions]
            prompt_ids = req.prompt
        elif first and req.return_token_ids:
            prompt_ids = req.prompt
        if not text and not ids and not sent and d.finish is None:
            return None  # nothing yet (vLLM sends no empty chunk before the first token)
        choice = {
            "index": 0,
            "text": text,
            "logprobs": self.legacy_logprobs(scored, offset) if req.logprobs is not None else None,
            "finish_reason": d.finish,
            "stop_reason": d.stop_reason,
            "prompt_token_ids": prompt_ids,
            "token_ids": ids if req.return_token_ids else None,
        }
        if self.dep.settings.spans_on_openai_routes:  # 0.33 sets the field on every chunk, null but the last
            choice["weight_versions"] = self._openai_spans() if d.finish is not None else None
        chunk = self._head() | {"choices": [choice]}
        if d.finish is not None and not req.include_usage:
            chunk["system_fingerprint"] = self.vt.fingerprint
        return chunk

    def _echoed_positions(self) -> list[Position]:
        """The prompt's positions as echo shows them (scored when prompt logprobs were computed)."""
        if self.req.logprobs is None:
            return []
        return self.prompt_positions or [Position(t, None) for t in self.req.prompt]

    def _chat_head(self) -> dict[str, Any]:
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        head = self._head() | {"choices": [choice]}
        head |= {"prompt_token_ids": self.req.prompt if self.req.return_token_ids else None, "prompt_text": None}
        if self.req.continuous_usage:
            p = len(self.req.prompt)
            head["usage"] = {"prompt_tokens": p, "total_tokens": p, "completion_tokens": 0}
        return head

    def _chat_chunk(self, d: Delta, ids: list[int], positions: list[Position]) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "delta": {"content": d.text},
            "logprobs": self._output_logprobs(positions),
            "finish_reason": d.finish,
        }
        if d.finish is not None:
            choice["stop_reason"] = d.stop_reason
        choice["token_ids"] = ids if self.req.return_token_ids else None
        if d.finish is not None and self.dep.settings.spans_on_openai_routes and self.req.return_weight_versions:
            choice["weight_versions"] = self._openai_spans()  # on the last chunk only (0.33)
        chunk = self._head() | {"choices": [choice]}
        if d.finish is not None and not self.req.include_usage:
            chunk["system_fingerprint"] = self.vt.fingerprint
        return chunk

    def _generate_chunk(self, d: Delta, ids: list[int], positions: list[Position], first: bool) -> dict[str, Any]:
        chunk: dict[str, Any] = {"request_id": self.id, "usage": None}
        if first and self.req.return_token_ids:
            chunk["prompt_token_ids"] = self.req.prompt
        chunk["output_mode"] = self.req.output_mode
        spans = self.spans() if d.finish is not None else None  # on the final chunk only
        chunk["choices"] = [
            self._generate_choice(
                d.finish,
                d.stop_reason,
                ids,
                d.text,
                positions,
                spans,
                self.routed_experts(True) if d.finish is not None else None,
            )
        ]
        return chunk

    def _generate_choice(
        self,
        finish: str | None,
        stop_reason: str | int | None,
        ids: list[int],
        text: str,
        positions: list[Position],
        spans: Any,
        routed: str | None = None,
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "finish_reason": finish,
            "stop_reason": stop_reason,
            "token_ids": ids,
            "routed_experts": routed,
            "sampling_mask": None,
            "weight_versions": spans,
        }
        if self.req.output_mode == "text":
            choice["text"] = text
        choice["logprobs"] = self._output_logprobs(positions)
        return choice

    def _usage_chunk(self) -> dict[str, Any]:
        if self.req.route == "generate":
            return {
                "request_id": self.id,
                "usage": self.usage(True),
                "output_mode": self.req.output_mode,
                "choices": [],
            }
        return self._head() | {"choices": [], "usage": self.usage(True), "system_fingerprint": self.vt.fingerprint}

    def _trailing_chunk(self) -> dict[str, Any]:
        """INF-SSE-1 fault: a chunk after the real usage that says usage null."""
        if self.req.route == "generate":
            choice = self._generate_choice(None, None, [], "", [], None)
            return {"request_id": self.id, "usage": None, "output_mode": self.req.output_mode, "choices": [choice]}
        if self.req.route == "chat":
            choice = {"index": 0, "delta": {"content": ""}, "logprobs": None, "finish_reason": None}
        else:
            choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": None, "stop_reason": None}
        return self._head() | {"choices": [choice], "usage": None}

    def _cut_chunk(self) -> dict[str, Any]:
        """SWAP-ASYNC-1 fault: the last chunk of a stream cut at a swap."""
        d = Delta([], "", "abort")
        if self.req.route == "generate":
            return self._generate_chunk(d, [], [], False)
        if self.req.route == "chat":
            return self._chat_chunk(d, [], [])
        return self._head() | {
            "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "abort", "stop_reason": None}]
        }

    # ----------------------------------------------------------------------- bodies

    async def drain(self) -> None:
        """Run the request to its end (VllmError when the engine failed it)."""
        try:
            async for _ in self.deltas():
                pass
        except Cut:
            pass
        finally:
            self.job.cancelled.set()

    async def body(self) -> dict[str, Any]:
        """The whole answer (VllmError when the engine failed the request)."""
        await self.drain()
        req = self.req
        positions = [self.position(i) for i in range(len(self.tokens))] if req.logprobs is not None else []
        finish = self.finish or "stop"
        if req.route == "generate":
            return self._generate_body(finish, positions)
        if req.route == "chat":
            return self._chat_body(finish, positions)
        return self._completion_body(finish, positions)

    def _completion_body(self, finish: str, positions: list[Position]) -> dict[str, Any]:
        req = self.req
        text = self.text_out
        if req.echo:
            text = ("" if req.return_token_ids else req.prompt_text) + text
            positions = [*self._echoed_positions(), *positions]
        choice = {
            "index": 0,
            "text": text,
            "logprobs": self.legacy_logprobs(positions, 0) if req.logprobs is not None else None,
            "finish_reason": finish,
            "stop_reason": self.stop_reason,
            "token_ids": self.output_ids() if req.return_token_ids else None,
            "prompt_logprobs": self.prompt_logprobs(),
            "prompt_token_ids": req.prompt if req.return_token_ids else None,
            "routed_experts": self.routed_experts(False),
        }
        if self.dep.settings.spans_on_openai_routes:
            choice["weight_versions"] = self._openai_spans()
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": self.vt.fingerprint,
            "usage": self.usage(False),
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }

    def _chat_body(self, finish: str, positions: list[Position]) -> dict[str, Any]:
        req = self.req
        message = {
            "role": "assistant",
            "content": self.text_out,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "reasoning": None,
        }
        choice = {
            "index": 0,
            "message": message,
            "logprobs": self._output_logprobs(positions),
            "finish_reason": finish,
            "stop_reason": self.stop_reason,
            "token_ids": self.output_ids() if req.return_token_ids else None,
            "routed_experts": self.routed_experts(False),
        }
        if self.dep.settings.spans_on_openai_routes:
            choice["weight_versions"] = self._openai_spans()
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": self.vt.fingerprint,
            "usage": self.usage(False),
            "prompt_logprobs": None,
            "prompt_token_ids": req.prompt if req.return_token_ids else None,
            "prompt_text": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }

    def _generate_body(self, finish: str, positions: list[Position]) -> dict[str, Any]:
        req = self.req
        choice = self._generate_choice(
            finish,
            self.stop_reason,
            self.output_ids(),
            self.text_out,
            positions,
            self.spans(),
            self.routed_experts(False),
        )
        return {
            "request_id": self.id,
            "model": self.model,
            "created": self.created,
            "usage": self.usage(False),
            "prompt_logprobs": self.prompt_logprobs(),
            "prompt_token_id_logprobs": None,
            "prompt_token_ids": req.prompt if req.return_token_ids else None,
            "mm_placeholders": None,
            "metrics": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "output_mode": req.output_mode,
            "choices": [choice],
        }


class Cut(Exception):
    """The engine cut the request at a swap (the SWAP-ASYNC-1 fault)."""


def _bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", errors="replace"))
