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

    def _is_byte_level(self) -> bool:
        decoder = json.loads(self.tokenizer.to_str()).get("decoder") or {}
        return decoder.get("type") == "ByteLevel"

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

    def chat(self, messages: list[dict[str, Any]]) -> list[int]:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        # a snapshot's template is untrusted input: render it sandboxed
        template = ImmutableSandboxedEnvironment(autoescape=False).from_string(self.chat_template)
        return self.encode(template.render(messages=messages, add_generation_prompt=True))


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
