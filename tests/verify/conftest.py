"""The verify tests run polar's side for real against a torch-free stand-in worker (fake_worker.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.captures import Recorder
from tests.verify.fake_worker import fake_logprob

FAKE_WORKER = Path(__file__).with_name("fake_worker.py")


@pytest.fixture
def fake_worker(monkeypatch) -> str:
    """The stand-in replaces worker.py; its Python (this one) must be named, as a torch-less polar requires."""
    monkeypatch.setattr("polar.verify.runner.WORKER", FAKE_WORKER)
    monkeypatch.delenv("POLAR_VERIFY_PYTHON", raising=False)
    return sys.executable


@pytest.fixture
def model_dir(tmp_path) -> Path:
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


def faithful(completion: list[int], noise: float = 0.0) -> list[float]:
    """The logprobs the fake model gives these sampled ids, off by `noise` each (bf16-like serving noise)."""
    return [fake_logprob(t) + (noise if i % 2 else -noise) for i, t in enumerate(completion)]


def record_session(db: Path, session: str = "s1", noise: float = 0.01) -> Recorder:
    """Three turns of one conversation, each extending the last: one prefix-merge trajectory of 3 turns."""
    rec = Recorder(db)
    prompt = [1, 2, 3, 4]
    for turn in range(3):
        completion = [10 + 7 * turn + i for i in range(5)]
        rec.call(session, prompt, completion, logprobs=faithful(completion, noise))
        prompt = prompt + completion + [900, 901]
    return rec
