"""The real worker (worker.py) under the vLLM venv's Python, on the tiny model: chunking through the KV cache
gives the logprobs of one whole forward pass, dtypes are what they say, and bad input is a clear error.

Marked vllm: the torch it needs is the vLLM venv's (polar's own venv has none); no vLLM server runs."""

from __future__ import annotations

import json
import random

import pytest

from polar.verify import VerifyError, Worker
from tests.support.real_vllm import ensure_tiny_model, require_vllm_venv

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def torch_python() -> str:
    return str(require_vllm_venv())


@pytest.fixture(scope="module")
def tiny():
    return ensure_tiny_model()


@pytest.fixture(scope="module")
def fp32(torch_python, tiny):
    """One float32 worker for the module, with a chunk larger than any test's sequence (one forward pass)."""
    with Worker(tiny, python=torch_python, chunk=4096) as worker:
        yield worker


def test_chunked_recompute_equals_one_forward_pass(torch_python, tiny, fp32):
    rng = random.Random(0)
    ids = [rng.randrange(248_000) for _ in range(300)]
    positions = sorted(rng.sample(range(1, 300), 60)) + [0]
    assert fp32.info["dtype"] == "float32" and fp32.info["device"] == "cpu"
    assert fp32.vocab_size == json.loads((tiny / "config.json").read_text())["vocab_size"]
    expected = fp32.logprobs(ids, positions)
    with Worker(tiny, python=torch_python, chunk=7) as chunked:
        got = chunked.logprobs(ids, positions)
    assert expected[-1] is None and got[-1] is None  # position 0 has no context
    assert got[:-1] == pytest.approx(expected[:-1], rel=1e-4, abs=1e-3)
    assert all(v <= 0 for v in got[:-1])


def test_bf16_recompute_is_what_it_says_and_close(torch_python, tiny, fp32):
    rng = random.Random(1)
    ids = [rng.randrange(248_000) for _ in range(64)]
    with Worker(tiny, python=torch_python, dtype="bfloat16") as bf16:
        assert bf16.info["dtype"] == "bfloat16"
        low, high = bf16.logprobs(ids, list(range(1, 64))), fp32.logprobs(ids, list(range(1, 64)))
    assert low != high  # a different precision, so not bit-equal …
    assert sum(abs(a - b) for a, b in zip(low, high)) / len(low) < 0.05 * sum(abs(b) for b in high) / len(high)


def test_ids_outside_the_vocabulary_and_models_that_do_not_load(torch_python, tiny, fp32, tmp_path):
    with pytest.raises(VerifyError, match="token id 300000 at position 1 is outside the model's vocabulary"):
        fp32.logprobs([1, 300_000, 2], [2])
    assert fp32.logprobs([1, 2], [1])[0] < 0  # the worker goes on after a refused request
    empty = tmp_path / "no-weights"
    empty.mkdir()
    (empty / "config.json").write_text((tiny / "config.json").read_text())
    with pytest.raises(VerifyError, match="cannot load .*no-weights"):
        Worker(empty, python=torch_python)
