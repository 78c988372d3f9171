"""Weight swaps under load: ASYNC pauses and resumes streams, SYNC drains and answers 425."""

import asyncio
import itertools
import time

import httpx
import pytest

from pytest_rlrollout.remote.polling import wait_until
from pytest_rlrollout.snapshot import build, tiny_moe

from ..support import Client, sse_chunks, versions

BASE = tiny_moe.BASE_IDENTITY
PROMPT = list(range(10, 42))


def changes(seq):
    return sum(1 for a, b in itertools.pairwise(seq) if a != b)


def test_async_stream_resumes_across_the_swap(start, bucket):
    c = Client(start(replicas=1, token_delay=0.02))
    build.derive(bucket / BASE, bucket / "step-1", build.perturbed(bucket / BASE, seed=1))
    with c.complete(PROMPT, stream=True, max_tokens=80, logprobs=True, raw_output=True) as r:
        lines = r.iter_lines()
        head = [next(lines) for _ in range(4)]
        assert c.hot_load({"identity": "step-1"}).status_code == 200
        rest = list(lines)
    chunks = sse_chunks(head + rest)
    assert [x for x in rest if x][-1] == "data: [DONE]"
    v = versions(chunks)
    assert v[0] == BASE and v[-1] == "step-1" and changes(v) == 1  # SWAP-ASYNC-2
    final = chunks[-1]
    assert final["choices"][0]["finish_reason"] == "length"
    streamed = [e["token_id"] for ch in chunks for e in (ch["choices"][0]["logprobs"] or {}).get("content", [])]
    assert len(streamed) == final["usage"]["completion_tokens"] == 80  # SWAP-ASYNC-1: not restarted
    assert final["choices"][0]["raw_output"]["completion_token_ids"] == streamed


def test_async_requests_during_the_swap_are_queued_or_get_425_past_their_drain_timeout(start, bucket):
    c = Client(start(replicas=1, swap_delay=0.5))
    build.derive(bucket / BASE, bucket / "step-1", build.perturbed(bucket / BASE, seed=1))
    assert c.hot_load({"identity": "step-1"}).status_code == 200
    c.replicas_where(lambda rs: rs[0]["loading_state"]["stage"] == "swapping", what="the swap under way")
    impatient = c.complete([1, 2, 3], max_tokens=2, headers={"x-fireworks-hot-load-drain-timeout": "0.05"})
    queued = c.complete([1, 2, 3], max_tokens=2)
    assert impatient.status_code == 425 and impatient.headers["retry-after"]
    assert queued.status_code == 200 and queued.json()["model"].endswith("@step-1")  # SWAP-ASYNC-3, SWAP-NEW-1


def test_sync_in_flight_finishes_on_old_weights_and_new_requests_get_425(start, bucket):
    c = Client(start(replicas=1, transition="SYNC", token_delay=0.02, swap_delay=0.2))
    build.derive(bucket / BASE, bucket / "step-1", build.perturbed(bucket / BASE, seed=1))
    session = {"x-multi-turn-session-id": "s1"}
    with c.complete(PROMPT, stream=True, max_tokens=60, headers=session) as r:
        lines = r.iter_lines()
        head = [next(lines) for _ in range(2)]
        assert c.hot_load({"identity": "step-1"}).status_code == 200
        c.replicas_where(lambda rs: rs[0]["loading_state"]["stage"] == "swapping", what="the replica draining")
        early = c.complete([1, 2, 3], max_tokens=2, headers=session)
        rest = list(lines)
    assert early.status_code == 425 and "error" in early.json()  # SWAP-SYNC-2
    v = versions(sse_chunks(head + rest))
    assert set(v) == {BASE} and len(v) == 61  # SWAP-SYNC-1: every chunk on the old snapshot
    retried = wait_until(
        lambda: (x := c.complete([1, 2, 3], max_tokens=2, headers=session)).status_code == 200 and x,
        timeout=10,
        interval=0.02,
        what="the retried request served",
    )
    assert retried.json()["model"].endswith("@step-1")


async def _stream(client, dep, i, results, started, max_tokens=30):
    body = {
        "model": dep.name,
        "prompt": [(i * 7 + j) % 500 for j in range(20)],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "logprobs": True,
        "raw_output": True,
    }
    lines = []
    headers = {"x-session-affinity": f"s{i}"}
    async with client.stream("POST", "/inference/v1/completions", json=body, headers=headers) as r:
        async for line in r.aiter_lines():
            if line:
                lines.append(line)
                if len(lines) == 1:
                    started.release()  # this stream is under way
    results[i] = (r.status_code, lines)


@pytest.mark.parametrize("transition", ["ASYNC"])
def test_64_concurrent_streams_across_a_swap_lose_and_duplicate_nothing(start, bucket, transition):
    dep = start(token_delay=0.05, transition=transition)
    c = Client(dep)
    build.derive(bucket / BASE, bucket / "step-1", build.perturbed(bucket / BASE, seed=1))
    results: dict[int, tuple] = {}

    async def main():
        limits = httpx.Limits(max_connections=80, max_keepalive_connections=80)
        async with httpx.AsyncClient(
            base_url=dep.base_url, timeout=60, limits=limits, headers={"Authorization": f"Bearer {dep.api_key}"}
        ) as ac:
            started = asyncio.Semaphore(0)
            tasks = [asyncio.create_task(_stream(ac, dep, i, results, started)) for i in range(64)]
            for _ in range(64):  # signal only once every stream has its first chunk
                await asyncio.wait_for(started.acquire(), timeout=30)
            # Order by events, not by speed: from here a decode step takes a second, so every
            # stream still under way stays under way until every replica serves the new snapshot,
            # however long the load takes on a busy machine; then the streams finish at full speed.
            dep.deployment.set_pace(token_delay=1.0)
            r = await ac.post(
                "/hot_load/v1/models/hot_load", json={"identity": "step-1"}, headers=dep.hot_load_headers()
            )
            assert r.status_code == 200
            await asyncio.to_thread(c.wait_for, "step-1")
            dep.deployment.set_pace(token_delay=0.0)
            await asyncio.gather(*tasks)

    asyncio.run(main())
    swapped = 0
    for i in range(64):
        status, lines = results[i]
        assert status == 200 and lines[-1] == "data: [DONE]"
        chunks = sse_chunks(lines)
        streamed = [e["token_id"] for ch in chunks for e in (ch["choices"][0]["logprobs"] or {}).get("content", [])]
        final = chunks[-1]
        assert final["choices"][0]["finish_reason"] in ("stop", "length")
        assert final["choices"][0]["raw_output"]["completion_token_ids"] == streamed
        assert len(streamed) == final["usage"]["completion_tokens"]
        assert changes(versions(chunks)) <= 1
        swapped += changes(versions(chunks))
    assert swapped > 0  # the swap did land inside some streams


def test_sync_swap_refuses_requests_with_425_while_streams_drain_then_serves_the_new_snapshot(start, bucket):
    """Order by events: streams under way (first chunk seen) -> signal -> the replicas draining or
    swapped (status) -> new requests. A new request reaching a draining replica is refused with
    425 + Retry-After until the swap is over, then served by the new snapshot; the streams finish
    on the old one."""
    dep = start(transition="SYNC", token_delay=0.01, swap_delay=0.2)
    c = Client(dep)
    build.derive(bucket / BASE, bucket / "step-1", build.perturbed(bucket / BASE, seed=1))
    streams: dict[int, tuple] = {}

    def draining_or_swapped(replicas):
        stages = [x["loading_state"]["stage"] for x in replicas]
        done = [x["current_snapshot_identity"] == "step-1" for x in replicas]
        return "swapping" in stages and all(s == "swapping" or d for s, d in zip(stages, done, strict=True))

    async def until_served(ac, i):
        """Send, and retry each 425 after a short interval, until a 200 (or the deadline)."""
        body = {"model": dep.name, "prompt": [i % 400 + 1, 2, 3], "max_tokens": 2, "temperature": 0}
        headers = {"x-multi-turn-session-id": f"new-{i}"}
        statuses, deadline = [], time.monotonic() + 20
        while time.monotonic() < deadline:
            r = await ac.post("/inference/v1/completions", json=body, headers=headers)
            statuses.append(r.status_code)
            if r.status_code == 200:
                return statuses, r.json()["model"]
            assert r.status_code == 425 and r.headers["retry-after"], (r.status_code, r.text)
            await asyncio.sleep(0.02)
        raise AssertionError(f"request {i} was never served: {statuses}")

    async def main():
        async with httpx.AsyncClient(
            base_url=dep.base_url, timeout=60, headers={"Authorization": f"Bearer {dep.api_key}"}
        ) as ac:
            started = asyncio.Semaphore(0)
            in_flight = [asyncio.create_task(_stream(ac, dep, i, streams, started, max_tokens=60)) for i in range(4)]
            for _ in in_flight:
                await asyncio.wait_for(started.acquire(), timeout=30)
            r = await ac.post(
                "/hot_load/v1/models/hot_load", json={"identity": "step-1"}, headers=dep.hot_load_headers()
            )
            assert r.status_code == 200, r.text
            await asyncio.to_thread(c.replicas_where, draining_or_swapped, what="the replicas draining for the swap")
            new = await asyncio.gather(*[until_served(ac, i) for i in range(16)])
            await asyncio.gather(*in_flight)
            return new

    new = asyncio.run(main())
    refused = [statuses for statuses, _ in new if statuses[0] == 425]
    assert refused, f"no request was refused while every replica drained: {[s for s, _ in new]}"  # SWAP-SYNC-2
    assert {model.rsplit("@", 1)[-1] for _, model in new} == {"step-1"}  # retried: served by the new snapshot
    for status, lines in streams.values():  # SWAP-SYNC-1: in flight at the signal, finished on the old snapshot
        assert status == 200 and lines[-1] == "data: [DONE]"
        assert set(versions(sse_chunks(lines))) == {BASE}
