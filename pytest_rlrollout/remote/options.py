"""The options of a completion and of a load, each declared once. Every layer that passes one on
(the suite's `RLDeployment`, a driver, the `DeploymentClient`) takes them as
`**options: Unpack[...]`: a type checker follows every hop, and a new option is added here only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict


class CompletionOptions(TypedDict, total=False):
    """How a completion is sent and watched; every one may be left out."""

    chat: bool  # to the chat completions endpoint (default: the completions endpoint)
    headers: dict[str, str] | None  # added to the request's (the contract's session and cache keys)
    on_chunk: Callable[[dict[str, Any]], None] | None  # sees every streamed chunk as it arrives
    on_status: Callable[[int], None] | None  # sees the answer's status as soon as its head arrives


class LoadOptions(TypedDict, total=False):
    """How a load is sent; every one may be left out."""

    headers: dict[str, str] | None  # added to the load request's
    # called in the middle of a swap this side drives step by step (see `Driver.load`)
    midway: Callable[[], None] | None
