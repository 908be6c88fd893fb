"""Fixtures for the trajectory tests."""

from __future__ import annotations

import pytest

from tests.trajectories.crafted import Recorder


@pytest.fixture
def recorder(tmp_path):
    rec = Recorder(tmp_path / "captures.db")
    yield rec
    rec.close()
