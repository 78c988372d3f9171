"""The numpy engine against transformers: logits within 1e-4 in fp32 and identical routing."""

import numpy as np
import pytest

from pytest_rlrollout.reference.model import Lora, Model, Sequence_
from pytest_rlrollout.snapshot import build

from ..support import LazyModule

torch = LazyModule("torch")
transformers = LazyModule("transformers")

PROMPT = [5, 17, 300, 42, 7, 99, 1, 250, 3, 3, 3, 100, 64, 65, 66, 200]


def ours(snapshot, lora=None):
    out = Model.load(snapshot).step([Sequence_()], [PROMPT], lora)[0]
    return out.logits, out.routing


def theirs(model):
    with torch.no_grad():
        o = model(torch.tensor([PROMPT]), output_router_logits=True)
    routing = np.stack([torch.topk(torch.softmax(r, -1), 2).indices.numpy() for r in o.router_logits], axis=1)
    return o.logits[0].numpy(), routing


def check(a, b):
    assert np.abs(a[0] - b[0]).max() <= 1e-4
    assert np.array_equal(a[1], b[1])


def test_base(base_snapshot):
    hf = transformers.AutoModelForCausalLM.from_pretrained(base_snapshot, dtype=torch.float32).eval()
    check(ours(base_snapshot), theirs(hf))


def test_after_an_incremental_delta(base_snapshot, tmp_path):
    target = build.derive(base_snapshot, tmp_path / "step-1", build.perturbed(base_snapshot, seed=3, scale=0.2))
    build.make_incremental(base_snapshot, target, tmp_path / "diff")
    applied = build.apply_incremental(base_snapshot, tmp_path / "diff", tmp_path / "applied")
    hf = transformers.AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    check(ours(applied), theirs(hf))
    assert not np.array_equal(ours(applied)[0], ours(base_snapshot)[0])


def test_with_a_peft_lora_adapter(base_snapshot, tmp_path):
    peft = pytest.importorskip("peft")
    hf = transformers.AutoModelForCausalLM.from_pretrained(base_snapshot, dtype=torch.float32)
    model = peft.get_peft_model(hf, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    model.eval()
    model.save_pretrained(tmp_path / "adapter")
    lora = Lora.load(tmp_path / "adapter", "lora-1")
    check(ours(base_snapshot, lora), theirs(model))
    assert np.abs(ours(base_snapshot, lora)[0] - ours(base_snapshot)[0]).max() > 1e-2


def test_batch_composition_does_not_change_greedy_tokens_or_routing(base_snapshot):
    m = Model.load(base_snapshot)
    alone = Sequence_()
    solo = [m.step([alone], [PROMPT])[0]]
    for _ in range(12):
        solo.append(m.step([alone], [[int(np.argmax(solo[-1].logits[-1]))]])[0])
    crowd = [Sequence_() for _ in range(7)]
    prompts = [PROMPT, *[[(7 * i + j) % 400 for j in range(5 + 3 * i)] for i in range(6)]]
    outs = m.step(crowd, prompts)
    mine = [outs[0]]
    for _ in range(12):
        outs = m.step(crowd, [[int(np.argmax(o.logits[-1]))] for o in outs])
        mine.append(outs[0])
    assert [int(np.argmax(o.logits[-1])) for o in solo] == [int(np.argmax(o.logits[-1])) for o in mine]
    assert all(np.array_equal(a.routing[-1], b.routing[-1]) for a, b in zip(solo, mine, strict=True))
    assert max(np.abs(a.logits[-1] - b.logits[-1]).max() for a, b in zip(solo, mine, strict=True)) < 1e-4


def test_decoding_sequences_of_different_capacities_batch_together(base_snapshot):
    """A sequence cloned from the prompt cache has capacity == its length; batched with a longer
    fresh one, the decode step must still line up every KV buffer."""
    m = Model.load(base_snapshot)
    long, short = Sequence_(), Sequence_()
    m.step([long], [list(range(5, 105))])
    m.step([short], [list(range(5, 37))])
    clone = m.clone_sequence(short, 32)
    assert clone.k[0].shape[1] == 32 < long.k[0].shape[1]
    outs = m.step([long, clone], [[7], [7]])
    alone = m.step([m.clone_sequence(short, 32)], [[7]])[0]
    assert np.abs(outs[1].logits - alone.logits).max() < 1e-4


def test_long_prompts_take_the_gathered_expert_path_and_match(base_snapshot):
    from pytest_rlrollout.reference import model as engine

    hf = transformers.AutoModelForCausalLM.from_pretrained(base_snapshot, dtype=torch.float32).eval()
    prompt = [(7 * i + 3) % 500 for i in range(engine.DENSE_MOE_ROWS + 40)]
    out = Model.load(base_snapshot).step([Sequence_()], [prompt])[0]
    with torch.no_grad():
        o = hf(torch.tensor([prompt]), output_router_logits=True)
    routing = np.stack([torch.topk(torch.softmax(r, -1), 2).indices.numpy() for r in o.router_logits], axis=1)
    assert np.abs(out.logits - o.logits[0].numpy()).max() <= 1e-4
    assert np.array_equal(out.routing, routing)


# --------------------------------------------------------------- through the scorer API (numerics/)


@pytest.fixture(scope="module")
def scorers(base_snapshot):
    """Both local scorers of the base, loaded once for the module (loading costs more than scoring)."""
    from pytest_rlrollout.numerics.scorer import NumpyScorer, TransformersScorer

    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    return NumpyScorer(base_snapshot), TransformersScorer(base_snapshot)


def as_sets(routing):
    """Routing as expert sets: the order within a top-k row is each engine's own."""
    return np.sort(np.asarray(routing, np.int64), axis=-1)


def test_the_scorers_agree_on_canary_sequences(scorers):
    from pytest_rlrollout.remote.fingerprint import canary

    numpy_scorer, hf_scorer = scorers
    # 96 tokens: past DENSE_MOE_ROWS, so the numpy engine's gathered expert path is scored too
    for ids in canary(sequences=3, tokens=96):
        a, b = numpy_scorer.score(ids), hf_scorer.score(ids)
        assert np.isnan(a.logprobs[0]) and np.isnan(b.logprobs[0])
        assert np.abs(a.logprobs[1:] - b.logprobs[1:]).max() <= 1e-4
        assert a.routing.shape == b.routing.shape == (len(ids), 3, 2)
        assert np.array_equal(as_sets(a.routing), as_sets(b.routing))


def test_rollouts_from_the_reference_deployment_match_the_transformers_scorer(scorers, dep):
    from pytest_rlrollout.numerics.rollouts import compare, sample
    from pytest_rlrollout.remote.client import DeploymentClient
    from pytest_rlrollout.remote.target import Target

    prompts = [[(11 * i + 7 * j) % 480 + 10 for j in range(16 + 8 * i)] for i in range(3)]
    with DeploymentClient(Target(dep.name, dep.base_url, dep.model, dep.api_key)) as c:
        rollouts = sample(c, prompts, 40, shape=(3, 2))
    made = sum(len(r.completion) for r in rollouts)  # sampled at temperature 1: an end of text may come early
    assert made >= 60 and all(0 < len(r.completion) <= 40 for r in rollouts), [len(r.completion) for r in rollouts]
    figures, alignment = compare(rollouts, scorers[1])
    assert figures.tokens == made and figures.route_tokens == made
    assert alignment == "producing position"  # how the reference deployment reports a token's routing
    assert figures.route_agreement == 1.0, figures.layer_agreement
    assert figures.max_abs <= 1e-4 and figures.k3_kl < 1e-9, figures.lines()
