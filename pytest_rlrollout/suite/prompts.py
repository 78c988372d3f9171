"""Prompts no other test and no earlier run sends.

Tests share one deployment and its prompt cache, and a long-lived deployment keeps its cache
between runs: a prompt is derived from a salted name (`RLDeployment.salted`), so no test meets
another's cache entries. A deployment that takes token-id prompts gets token ids (the test then
knows every prompt token); one that takes text only gets words.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

# Short, common words: most byte-level BPE vocabularies hold each as one token (with its space).
WORDS = (
    "the of and to in is it you that he was for on are with as his they be at one have this from or had by hot "
    "word but what some we can out other were all there when up use your how said an each she which do their "
    "time if will way about many then them write would like so these her long make thing see him two has look "
    "more day could go come did number sound no most people my over know water than call first who may down "
    "side been now find any new work part take get place made live where after back little only round man year "
    "came show every good me give our under name very through just form sentence great think say help low line "
    "differ turn cause much mean before move right boy old too same tell does set three want air well also play "
    "small end put home read hand port large spell add even land here must big high such follow act why ask men "
    "change went light kind off need house picture try us again animal point mother world near build self earth"
).split()

VOCAB = 500  # token ids stay below this when the served vocabulary is unknown
# Tokens of a prompt whose prefix a prompt cache must hold: more than two KV blocks of the largest
# block size in common use (vLLM's CPU backend caches 128-token blocks; GPU engines 16 to 64).
CACHED_PREFIX = 288
FIRST_ID = 10  # below: special tokens in most vocabularies


@dataclass(frozen=True)
class Prompt:
    """What a request's `prompt` carries, and its token ids when the test knows them."""

    body: str | list[int]
    ids: list[int] | None  # the prompt's tokens: known for token-id prompts

    @property
    def text(self) -> bool:
        return isinstance(self.body, str)

    def messages(self) -> list[dict[str, str]]:
        """The same prompt as one user message of a chat completion."""
        content = self.body if isinstance(self.body, str) else " ".join(WORDS[i % len(WORDS)] for i in self.body)
        return [{"role": "user", "content": content}]


def make_prompt(salted_name: str, tokens: int, *, ids: bool, vocab: int | None = None) -> Prompt:
    """`tokens` token ids (`ids`) or words, drawn from a hash of `salted_name`."""
    stream = _numbers(salted_name, tokens)
    if ids:
        top = min(vocab or VOCAB, VOCAB)
        token_ids = [FIRST_ID + n % (top - FIRST_ID) for n in stream]
        return Prompt(token_ids, token_ids)
    return Prompt(" ".join(WORDS[n % len(WORDS)] for n in stream), None)


def _numbers(seed: str, n: int) -> list[int]:
    out: list[int] = []
    block = 0
    while len(out) < n:
        digest = hashlib.sha256(f"{seed}/{block}".encode()).digest()
        out += [int.from_bytes(digest[i : i + 2], "little") for i in range(0, 32, 2)]
        block += 1
    return out[:n]
