"""The streaming scorer: the reference engine's forward pass with its weights read as it goes
scores as the in-memory engine does, on every kind of snapshot the suite scores."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_rlrollout.numerics import scorer as scorers
from pytest_rlrollout.numerics import streaming
from pytest_rlrollout.numerics.scorer import NumpyScorer, local_scorer
from pytest_rlrollout.snapshot import build

IDS = [1, 17, 300, 42, 42, 9, 250, 3, 77, 128, 5, 411, 2, 64, 90, 33]


def same_scores(a, b) -> None:
    np.testing.assert_allclose(a.logprobs[1:], b.logprobs[1:], rtol=0, atol=2e-5)
    assert np.array_equal(np.sort(a.routing, axis=-1), np.sort(b.routing, axis=-1))


def test_streamed_scores_equal_the_engines_in_memory(base_snapshot, monkeypatch):
    """Logprobs within 2e-5 (the experts summed one by one, not all at once) and the same
    routing, with the LM head read in blocks smaller than the vocabulary and the embeddings
    row by row."""
    monkeypatch.setattr(streaming, "HEAD_ROWS", 100)  # the reference vocabulary is 512: 6 blocks
    same_scores(NumpyScorer(base_snapshot, streamed=True).score(IDS), NumpyScorer(base_snapshot).score(IDS))


def test_streamed_scores_of_an_fp8_snapshot_and_a_save_pretrained_one(base_snapshot, tmp_path):
    """FP8 weights are scaled as the engine scales them; a checkpoint without an index (one
    model.safetensors) is read as well."""
    fp8 = build.quantize_fp8(base_snapshot, tmp_path / "fp8")
    same_scores(NumpyScorer(fp8, streamed=True).score(IDS), NumpyScorer(fp8).score(IDS))
    single = tmp_path / "single"
    single.mkdir()
    from pytest_rlrollout.snapshot import safetensors_io as st

    st.write_file(single / "model.safetensors", st.entries_of(build.read_snapshot(base_snapshot)), {"format": "pt"})
    (single / "config.json").write_bytes((base_snapshot / "config.json").read_bytes())
    same_scores(NumpyScorer(single, streamed=True).score(IDS), NumpyScorer(base_snapshot).score(IDS))


def test_a_model_too_large_for_the_in_memory_engine_is_streamed_on_the_cpu(base_snapshot, monkeypatch):
    """`auto` keeps the in-memory engine for small models and streams the rest on the CPU; a
    GPU is transformers' (its float32 copy lives in the GPU's memory, not this machine's)."""
    assert local_scorer(base_snapshot).name == "numpy"
    monkeypatch.setattr(scorers, "NUMPY_MAX_PARAMETERS", 10)
    assert local_scorer(base_snapshot).name == "streaming"
    with pytest.raises(ValueError, match="unknown scorer"):
        local_scorer(base_snapshot, "nope")
