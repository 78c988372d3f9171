"""The real clients against the reference deployment: the official fireworks-ai SDK and openai."""

import asyncio
import base64
import shutil
import uuid
from types import SimpleNamespace

import numpy as np
import pytest

from pytest_rlrollout.snapshot import build, tiny_moe

from ..support import LazyModule
from ..support import thread_pool as _pool

sdk = LazyModule("fireworks.training.sdk")

BASE = tiny_moe.BASE_IDENTITY


@pytest.fixture
def mgr(dep):
    """The SDK's DeploymentManager; only the status poll interval is shortened for tests."""

    class Manager(sdk.DeploymentManager):
        def wait_for_hotload(self, *args, **kwargs):
            kwargs.setdefault("poll_interval", 0.02)
            return super().wait_for_hotload(*args, **kwargs)

    return Manager(api_key=dep.api_key, base_url=dep.base_url)


def test_account_and_deployment_discovery(mgr, dep):
    assert mgr.account_id == "rlrollout"
    info = mgr.get(dep.settings.deployment_id)
    assert info is not None and info.name == dep.name


def settled(dep) -> None:
    """The SDK's wait returns once every replica reports the snapshot; the deployment takes the next
    signal once each replica's load has also been booked (one load at a time): wait for both."""
    from pytest_rlrollout.remote.polling import wait_until

    wait_until(lambda: dep.deployment.loading is None, timeout=30, interval=0.005, what="the load to be booked")


def test_full_incremental_and_lora_hot_loads(mgr, dep, bucket, tmp_path):
    d, m = dep.settings.deployment_id, dep.model
    s1 = build.derive(bucket / BASE, bucket / "step-1", build.perturbed(bucket / BASE, seed=1))
    mgr.hotload(d, m, "step-1")
    assert mgr.wait_for_hotload(d, m, "step-1")
    settled(dep)
    fdc = pytest.importorskip("fireworks_delta_compression.compression")
    s2 = build.derive(s1, tmp_path / "step-2-full", build.perturbed(s1, seed=2))
    fdc.delta_compress_dirs(str(s1), str(s2), str(bucket / "step-2"), "arc_v2", executor=_pool())
    meta = {"previous_snapshot_identity": "step-1", "compression_format": "arc_v2", "checksum_format": "alder32"}
    mgr.hotload(d, m, "step-2", incremental_snapshot_metadata=meta)
    assert mgr.wait_for_hotload(d, m, "step-2")
    settled(dep)
    build.make_lora(bucket / BASE, bucket / "lora-1", base_model=m)
    mgr.hotload(d, m, "lora-1")
    assert mgr.wait_for_hotload(d, m, "lora-1")
    status = mgr.hotload_check_status(d, m)
    assert all(r["current_snapshot_identity"] == "step-2" for r in status["replicas"])


def test_a_refused_snapshot_fails_the_sdk_call(mgr, dep, bucket):
    import httpx

    shutil.copytree(bucket / BASE, bucket / "bad")
    (bucket / "bad" / "tokenizer.json").unlink()
    with pytest.raises(httpx.HTTPStatusError) as err:
        mgr.hotload(dep.settings.deployment_id, dep.model, "bad")
    assert err.value.response.status_code == 400 and "SNAP-TOK-1" in err.value.response.text


class PolicyClient:
    """A stand-in trainer that writes real snapshots into the bucket when asked to save."""

    def __init__(self, bucket, work):
        self.bucket, self.work, self.current, self.saved = bucket, work, bucket / BASE, []
        self.session = uuid.uuid4().hex[:6]

    def save_weights_for_sampler_ext(self, name, checkpoint_type=None):
        snapshot = f"{name}-{self.session}"
        target = build.derive(
            self.current, self.work / snapshot, build.perturbed(self.current, seed=len(self.saved) + 1)
        )
        if checkpoint_type == "delta":
            build.make_incremental(self.current, target, self.bucket / snapshot)
        else:
            shutil.copytree(target, self.bucket / snapshot)
        self.current = target
        self.saved.append((snapshot, checkpoint_type))
        return SimpleNamespace(snapshot_name=snapshot)


def test_weight_syncer_over_several_steps(mgr, dep, bucket, tmp_path):
    policy = PolicyClient(bucket, tmp_path)
    syncer = sdk.WeightSyncer(
        policy_client=policy,
        deploy_mgr=mgr,
        deployment_id=dep.settings.deployment_id,
        base_model=dep.model,
        warmup_max_retries=1,
    )
    outputs = []
    for step in range(4):
        syncer.save_and_hotload(f"step-{step}")
        r = dep.deployment.replicas[0]
        assert r.identity == policy.saved[-1][0]
        outputs.append(r.model.embed[0, :4].copy())
    assert [kind for _, kind in policy.saved] == ["base", "delta", "delta", "delta"]
    assert not np.array_equal(outputs[0], outputs[-1])


def test_sampler_stream_with_routing_echo_and_logprobs(dep):
    sampler = sdk.DeploymentSampler(inference_url=dep.base_url, model=dep.name, api_key=dep.api_key)
    prompt = list(range(5, 37))

    async def go():
        return await sampler.async_completions_stream(
            prompt,
            max_tokens=6,
            temperature=0.0,
            logprobs=True,
            echo=True,
            include_routing_matrix=True,
            raw_output=True,
            hotload_retry_interval=0.01,
        )

    result, metrics = asyncio.run(go())
    [choice] = result["choices"]
    entries = choice["logprobs"]["content"]
    assert len(entries) == len(prompt) + 6
    assert choice["raw_output"]["completion_token_ids"][: len(prompt)] == prompt
    matrices = [np.frombuffer(base64.b64decode(e["routing_matrix"]), np.uint8).reshape(3, 2) for e in entries]
    assert all((m < 8).all() for m in matrices)
    assert metrics.prompt_tokens == len(prompt) and metrics.cached_prompt_tokens == 0


def test_openai_sdk_sync_async_and_streaming(dep):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=dep.base_url + "/inference/v1", api_key=dep.api_key)
    extra = {
        "extra_headers": {"x-multi-turn-session-id": "s1"},
        "extra_body": {"logprobs": True, "include_routing_matrix": True, "top_k": 0},
    }
    r = client.completions.create(model=dep.name, prompt="the policy samples", max_tokens=4, temperature=0, **extra)
    assert r.model.endswith(f"@{BASE}") and r.usage.completion_tokens == 4
    assert len(r.choices[0].logprobs.model_extra["content"]) == 4  # Fireworks-style logprobs ride in the extras
    chunks = list(
        client.completions.create(model=dep.name, prompt=[1, 2, 3], max_tokens=5, temperature=0, stream=True, **extra)
    )
    assert all(c.model.endswith(f"@{BASE}") for c in chunks) and chunks[-1].choices[0].finish_reason == "length"
    chat = client.chat.completions.create(
        model=dep.model, messages=[{"role": "user", "content": "hello"}], max_tokens=3, temperature=0
    )
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens == 3
    stream = client.chat.completions.create(
        model=dep.model, messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0, stream=True
    )
    assert sum(1 for c in stream if c.choices and c.choices[0].delta.content is not None) >= 3

    async def go():
        ac = openai.AsyncOpenAI(base_url=dep.base_url + "/inference/v1", api_key=dep.api_key)
        a = await ac.completions.create(model=dep.name, prompt=[4, 5, 6], max_tokens=3, temperature=0)
        s = await ac.completions.create(model=dep.name, prompt=[4, 5, 6], max_tokens=3, temperature=0, stream=True)
        text = "".join([c.choices[0].text async for c in s])
        return a.choices[0].text, text

    unary, streamed = asyncio.run(go())
    assert unary == streamed


def test_a_delta_chain_and_a_full_snapshot_of_its_weights_fingerprint_alike(mgr, dep, bucket, tmp_path):
    """The SDK's full -> delta -> delta chain leaves every replica serving the weights the trainer
    holds: the same numbers as those weights hot-loaded whole under another identity."""
    from pytest_rlrollout.remote.client import DeploymentClient
    from pytest_rlrollout.remote.drivers import FireworksDriver
    from pytest_rlrollout.remote.drivers.fireworks import HotLoadAPI
    from pytest_rlrollout.remote.fingerprint import sweep
    from pytest_rlrollout.remote.target import Target

    d, m, replicas = dep.settings.deployment_id, dep.model, dep.settings.replicas
    policy = PolicyClient(bucket, tmp_path)
    syncer = sdk.WeightSyncer(policy_client=policy, deploy_mgr=mgr, deployment_id=d, base_model=m, warmup_max_retries=1)
    with DeploymentClient(Target(dep.name, dep.base_url, m, dep.api_key)) as c:

        def prints(name, sessions=None):  # every replica, each reached by the session key that reached it first
            return sweep(c, replicas, f"parity-{name}", key=lambda n: f"parity-replica-{n}", sessions=sessions)

        base = prints("base")
        assert base.named and len(base.prints) == replicas
        for step in range(3):
            syncer.save_and_hotload(f"step-{step}")
        assert [kind for _, kind in policy.saved] == ["base", "delta", "delta"]
        # the SDK's wait reads the first replica only: the others may still be swapping when it returns
        assert FireworksDriver(c).wait(policy.saved[-1][0], timeout=30, poll=0.01).ok, HotLoadAPI(c).served_identities()
        chained = prints("chained", base.sessions)
        whole = f"whole-{policy.session}"
        shutil.copytree(policy.current, bucket / whole)  # the trainer's final weights, as a full snapshot
        mgr.hotload(d, m, whole)
        assert mgr.wait_for_hotload(d, m, whole)
        assert FireworksDriver(c).wait(whole, timeout=30, poll=0.01).ok, HotLoadAPI(c).served_identities()
        full = prints("full", base.sessions)
    assert set(base.prints) == set(chained.prints) == set(full.prints)
    for replica, fp in sorted(full.prints.items()):
        assert fp.distance(chained.prints[replica]) <= 1e-3, f"{replica}: {fp.describe(chained.prints[replica])}"
        assert fp.distance(base.prints[replica]) > 1e-3, f"{replica}: the fingerprint did not see the new weights"
