"""The trainer's side of the weight-sync check: `score_canary` on a torch model gives the numbers
the local scorer gives (on this directory's xdist worker, which alone imports torch)."""

from pytest_rlrollout.numerics.scorer import NumpyScorer
from pytest_rlrollout.runs.weight_sync import WeightSync, score_canary

from ..support import LazyModule

torch = LazyModule("torch")
transformers = LazyModule("transformers")


def test_score_canary_on_a_torch_model_gives_the_local_scorers_numbers(base_snapshot):
    """The trainer's helper: transformers' model of the base snapshot, scored with `score_canary`,
    gives the numpy scorer's numbers within 1e-5, and the model is left in the mode it was in."""
    model = transformers.AutoModelForCausalLM.from_pretrained(base_snapshot, dtype=torch.float32)
    model.train()
    sync = WeightSync(driver=None, vocab=model.config.vocab_size)  # type: ignore[arg-type]  # scoring only
    mine = score_canary(model, sync.canary)
    local = [float(x) for x in NumpyScorer(base_snapshot).score(sync.canary).logprobs[1:]]
    assert len(mine) == len(local) == sync.tokens - 1
    assert max(abs(a - b) for a, b in zip(mine, local, strict=True)) <= 1e-5
    assert model.training
