"""Tokenizer and chat template of the served base model."""

from __future__ import annotations

import codecs
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer


class Text:
    def __init__(self, snapshot: Path, config: dict[str, Any]):
        self.tokenizer = Tokenizer.from_file(str(snapshot / "tokenizer.json"))
        tok_config = json.loads((snapshot / "tokenizer_config.json").read_text())
        self.chat_template = tok_config.get("chat_template")
        eos = config.get("eos_token_id")
        ids = set(eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else [])
        for special in ("<|im_end|>", "<|endoftext|>"):
            tid = self.tokenizer.token_to_id(special)
            if tid is not None:
                ids.add(tid)
        self.stop_ids = frozenset(ids)
        self._byte_level = self._is_byte_level()
        self._unbyte = {c: b for b, c in _bytes_to_unicode().items()}
        self._template: Any = None
        self.max_token_bytes = self._max_token_bytes()

    def _is_byte_level(self) -> bool:
        decoder = json.loads(self.tokenizer.to_str()).get("decoder") or {}
        return decoder.get("type") == "ByteLevel"

    def _max_token_bytes(self) -> int | None:
        """The most text one token can stand for, in UTF-8 bytes of the text encoded (None: no
        bound), so a text of more than `n * max_token_bytes` bytes takes more than n tokens.
        Only byte-level BPE has such a bound: each of its tokens is the bytes it decodes to, and
        it has no unknown token (WordPiece's or a fused one stands for a word of any length). A
        normalizer could shrink a text before it is split; NFC at most thirds its UTF-8 length
        (three 3-byte Hangul jamo make one 3-byte syllable), any other may delete text: no bound."""
        spec = json.loads(self.tokenizer.to_str())
        model, normalizer = spec.get("model") or {}, spec.get("normalizer")
        if not self._byte_level or model.get("type") != "BPE" or model.get("unk_token") is not None:
            return None
        if normalizer is not None and normalizer.get("type") != "NFC":
            return None
        longest = max(len(self.token_bytes(i)) for i in range(self.tokenizer.get_vocab_size(with_added_tokens=True)))
        return longest * (3 if normalizer is not None else 1)

    def bytes_bound(self, max_context: int) -> int | None:
        """No text of more UTF-8 bytes than this fits `max_context` tokens (None: unknown)."""
        return None if self.max_token_bytes is None else max_context * self.max_token_bytes

    @lru_cache(maxsize=65536)  # noqa: B019 - one Text per deployment, vocabularies are small
    def token_bytes(self, token: int) -> bytes:
        """The exact bytes a token stands for (byte-level BPE), so text streams without re-decoding."""
        piece = self.tokenizer.id_to_token(token) or ""
        if self._byte_level and all(c in self._unbyte for c in piece):
            return bytes(self._unbyte[c] for c in piece)
        return self.tokenizer.decode([token], skip_special_tokens=False).encode()

    def stream_decoder(self):
        """token -> newly completed text, carrying partial UTF-8 sequences between tokens."""
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        return lambda token: utf8.decode(self.token_bytes(token))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    @lru_cache(maxsize=65536)  # noqa: B019
    def piece(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False)

    def render_chat(self, messages: list[dict[str, Any]]) -> str:
        if self._template is None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            # a snapshot's template is untrusted input: render it sandboxed (compiled once; a
            # compiled template renders on any thread)
            self._template = ImmutableSandboxedEnvironment(autoescape=False).from_string(self.chat_template)
        return self._template.render(messages=messages, add_generation_prompt=True)

    def chat(self, messages: list[dict[str, Any]]) -> list[int]:
        return self.encode(self.render_chat(messages))


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte <-> printable-character table used by byte-level BPE vocabularies."""
    keep = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = keep[:]
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(keep, map(chr, chars), strict=True))
