"""The served tokenizer as vLLM 0.32 uses it: which tokens end a sequence (the config's and the
generation config's EOS, not every special token), which add no text (special tokens are skipped
in output text), and how a logprobs entry spells a token: decoded alone, and a byte-level piece
of an unfinished UTF-8 character completed from up to 4 tokens before it, or "" when nothing
completes it (vLLM's `_correct_decoded_token`)."""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_rlrollout.reference.settings import VLLM_VERSION
from pytest_rlrollout.reference.text import Text

REPLACEMENT = "\ufffd"


class VllmText:
    def __init__(self, text: Text, snapshot: Path, config: dict[str, Any], release: str = VLLM_VERSION):
        self.text = text
        eos = _ids(config.get("eos_token_id"))
        generation = snapshot / "generation_config.json"
        if generation.is_file():
            eos |= _ids(json.loads(generation.read_text()).get("eos_token_id"))
        self.stop_ids = frozenset(eos)
        added = text.tokenizer.get_added_tokens_decoder()
        self.special_ids = frozenset(i for i, t in added.items() if t.special) | self.stop_ids
        # vLLM's fingerprint names its version and the served model's configuration
        self.fingerprint = f"vllm-{release}-{zlib.crc32(json.dumps(config, sort_keys=True).encode()):08x}"

    def decode(self, ids: Sequence[int]) -> str:
        return self.text.decode(list(ids))

    def token(self, token: int, context: Sequence[int]) -> str:
        """How a logprobs entry spells `token` after the tokens `context` of the same sequence."""
        piece = self.text.piece(token)
        if not piece.endswith(REPLACEMENT):
            return piece
        context = list(context)[-4:]
        for n in range(1, len(context) + 1):
            before = context[-n:]
            full = self.text.tokenizer.decode([*before, token], skip_special_tokens=False)
            if full.endswith(REPLACEMENT):
                continue
            clean = len(before)  # context tokens that were pieces of this same character say nothing
            for j in range(len(before) - 1, -1, -1):
                if self.text.piece(before[j]).endswith(REPLACEMENT):
                    clean = j
                else:
                    break
            prefix = self.text.tokenizer.decode(before[:clean], skip_special_tokens=False) if clean else ""
            if full.startswith(prefix):
                return full[len(prefix) :]
            common = 0
            for a, b in zip(prefix, full, strict=False):
                if a != b:
                    break
                common += 1
            return full[common:]
        return ""


def _ids(value: Any) -> set[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return {value}
    if isinstance(value, list):
        return {v for v in value if isinstance(v, int) and not isinstance(v, bool)}
    return set()
