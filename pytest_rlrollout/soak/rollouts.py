"""Simulated rollouts: what one rollout worker asks of a deployment, turn after turn.

An agentic RL rollout is a session whose context grows: each turn's prompt is the previous
prompt, the completion the deployment returned, then the environment's next observation. That
growing prefix on one session key is what exercises session affinity and the prompt cache across
swaps, so the soak sends exactly that, as token ids (what a trainer sends), with bounded
`max_tokens`, logprobs and stream usage always (the judge counts tokens by both, to see a
restart) and routing where asked.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Trajectory:
    """One rollout: up to `turns` requests on one session, ending early rather than let its
    context pass `max_context` tokens. Deterministic given `seed`."""

    session: str
    seed: int
    vocab: int  # token ids are drawn from [0, vocab)
    turns: int = 4
    first: tuple[int, int] = (24, 64)  # tokens of the first prompt (least, most)
    observation: tuple[int, int] = (4, 16)  # tokens the environment adds after each completion
    max_tokens: int = 32  # per turn
    max_context: int = 1024  # prompt + completion tokens a turn may reach
    routing: bool = False  # ask for routing matrices (R3) with the logprobs
    prompt: list[int] = field(default_factory=list)
    index: int = 0  # turns answered so far

    def __post_init__(self) -> None:
        if self.vocab < 1 or self.turns < 1 or self.max_tokens < 1:
            raise ValueError(f"a trajectory needs a vocabulary, turns and tokens: {self}")
        if not 1 <= self.first[0] <= self.first[1] or not 0 <= self.observation[0] <= self.observation[1]:
            raise ValueError(f"token ranges are (least, most), least first: {self.first}, {self.observation}")
        if self.first[1] + self.max_tokens > self.max_context:
            raise ValueError(
                f"the first turn may need {self.first[1] + self.max_tokens} tokens, past max_context {self.max_context}"
            )
        self._rng = random.Random(self.seed)
        self.prompt = self._tokens(self.first)

    @property
    def done(self) -> bool:
        """No turn is left, or the next one could pass `max_context`."""
        return self.index >= self.turns or len(self.prompt) + self.max_tokens > self.max_context

    def request(self) -> dict[str, Any]:
        """The body of the next turn's request (a streamed completion on token ids)."""
        if self.done:
            raise RuntimeError(f"{self.session}: the trajectory is over after {self.index} turns")
        body: dict[str, Any] = {
            "prompt": list(self.prompt),
            "max_tokens": self.max_tokens,
            "stream": True,
            "logprobs": True,
            "temperature": 1.0,
            "seed": self._rng.randrange(2**31),
            "stream_options": {"include_usage": True},
        }
        if self.routing:
            body["include_routing_matrix"] = True
        return body

    def answered(self, completion: list[int]) -> None:
        """The deployment's completion of the current turn: the context grows by it and the
        environment's next observation."""
        if self.done:
            raise RuntimeError(f"{self.session}: the trajectory is over after {self.index} turns")
        if len(completion) > self.max_tokens:
            raise ValueError(f"{len(completion)} completion tokens, more than max_tokens {self.max_tokens}")
        self.index += 1
        self.prompt = [*self.prompt, *completion, *self._tokens(self.observation)]

    def _tokens(self, span: tuple[int, int]) -> list[int]:
        return [self._rng.randrange(self.vocab) for _ in range(self._rng.randint(*span))]
