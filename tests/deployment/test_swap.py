"""Weight swaps under load: ASYNC pauses and resumes streams, SYNC drains and answers 425."""

import asyncio
import itertools
import time

import httpx
import pytest

from pytest_rlrollout import factory, refmodel

from .conftest import Client, poll, versions
from .conftest import chunks as sse_chunks

BASE = refmodel.BASE_IDENTITY
PROMPT = list(range(10, 42))


def changes(seq):
    return sum(1 for a, b in itertools.pairwise(seq) if a != b)


def test_async_stream_resumes_across_the_swap(start, bucket):
    c = Client(start(replicas=1, token_delay=0.02))
    factory.derive(bucket / BASE, bucket / "step-1", factory.perturbed(bucket / BASE, seed=1))
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
    factory.derive(bucket / BASE, bucket / "step-1", factory.perturbed(bucket / BASE, seed=1))
    assert c.hot_load({"identity": "step-1"}).status_code == 200
    poll(lambda: c.status()["replicas"][0]["loading_state"]["stage"] == "swapping")
    impatient = c.complete([1, 2, 3], max_tokens=2, headers={"x-fireworks-hot-load-drain-timeout": "0.05"})
    queued = c.complete([1, 2, 3], max_tokens=2)
    assert impatient.status_code == 425 and impatient.headers["retry-after"]
    assert queued.status_code == 200 and queued.json()["model"].endswith("@step-1")  # SWAP-ASYNC-3, SWAP-NEW-1


def test_sync_in_flight_finishes_on_old_weights_and_new_requests_get_425(start, bucket):
    c = Client(start(replicas=1, transition="SYNC", token_delay=0.02, swap_delay=0.2))
    factory.derive(bucket / BASE, bucket / "step-1", factory.perturbed(bucket / BASE, seed=1))
    session = {"x-multi-turn-session-id": "s1"}
    with c.complete(PROMPT, stream=True, max_tokens=60, headers=session) as r:
        lines = r.iter_lines()
        head = [next(lines) for _ in range(2)]
        assert c.hot_load({"identity": "step-1"}).status_code == 200
        poll(lambda: c.status()["replicas"][0]["loading_state"]["stage"] == "swapping")
        early = c.complete([1, 2, 3], max_tokens=2, headers=session)
        rest = list(lines)
    assert early.status_code == 425 and "error" in early.json()  # SWAP-SYNC-2
    v = versions(sse_chunks(head + rest))
    assert set(v) == {BASE} and len(v) == 61  # SWAP-SYNC-1: every chunk on the old snapshot
    retried = poll(lambda: (x := c.complete([1, 2, 3], max_tokens=2, headers=session)).status_code == 200 and x)
    assert retried.json()["model"].endswith("@step-1")


async def _stream(client, dep, i, results, started):
    body = {"model": dep.name, "prompt": [(i * 7 + j) % 500 for j in range(20)], "max_tokens": 30, "temperature": 0,
            "stream": True, "logprobs": True, "raw_output": True}  # fmt: skip
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
    dep = start(token_delay=0.01, transition=transition)
    c = Client(dep)
    factory.derive(bucket / BASE, bucket / "step-1", factory.perturbed(bucket / BASE, seed=1))
    results: dict[int, tuple] = {}

    async def main():
        limits = httpx.Limits(max_connections=80, max_keepalive_connections=80)
        async with httpx.AsyncClient(base_url=dep.base_url, timeout=60, limits=limits,
                                     headers={"Authorization": f"Bearer {dep.api_key}"}) as ac:  # fmt: skip
            started = asyncio.Semaphore(0)
            tasks = [asyncio.create_task(_stream(ac, dep, i, results, started)) for i in range(64)]
            for _ in range(64):  # signal only once every stream has its first chunk
                await asyncio.wait_for(started.acquire(), timeout=30)
            r = await ac.post(
                "/hot_load/v1/models/hot_load", json={"identity": "step-1"}, headers=dep.hot_load_headers()
            )
            assert r.status_code == 200
            await asyncio.gather(*tasks)

    asyncio.run(main())
    c.wait_for("step-1")
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


def test_sync_swap_every_425_is_followed_by_a_success_on_retry(start, bucket):
    dep = start(transition="SYNC", token_delay=0.01, swap_delay=0.2)
    factory.derive(bucket / BASE, bucket / "step-1", factory.perturbed(bucket / BASE, seed=1))
    outcomes: list[tuple[int, str]] = []

    async def one(ac, i):
        body = {"model": dep.name, "prompt": [i % 400 + 1, 2, 3], "max_tokens": 20, "temperature": 0}
        h = {"x-multi-turn-session-id": f"s{i}"}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            r = await ac.post("/inference/v1/completions", json=body, headers=h)
            outcomes.append((i, r.status_code))
            if r.status_code == 200:
                return r.json()["model"]
            assert r.status_code == 425
            await asyncio.sleep(float(r.headers["retry-after"]) / 20)
        raise AssertionError(f"request {i} never succeeded")

    async def main():
        async with httpx.AsyncClient(
            base_url=dep.base_url, timeout=60, headers={"Authorization": f"Bearer {dep.api_key}"}
        ) as ac:
            first = [asyncio.create_task(one(ac, i)) for i in range(16)]
            await asyncio.sleep(0)
            await ac.post("/hot_load/v1/models/hot_load", json={"identity": "step-1"}, headers=dep.hot_load_headers())
            later = [asyncio.create_task(one(ac, 100 + i)) for i in range(16)]
            return await asyncio.gather(*first, *later)

    models = asyncio.run(main())
    assert all(m.endswith(("@step-1", f"@{BASE}")) for m in models)
    rejected = {i for i, s in outcomes if s == 425}
    assert all(any(j == i and s == 200 for j, s in outcomes) for i in rejected)
