"""Tokenizer and chat template of the served base model."""

from __future__ import annotations

import json
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

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def piece(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False)

    def chat(self, messages: list[dict[str, Any]]) -> list[int]:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        # a snapshot's template is untrusted input: render it sandboxed
        template = ImmutableSandboxedEnvironment(autoescape=False).from_string(self.chat_template)
        return self.encode(template.render(messages=messages, add_generation_prompt=True))
