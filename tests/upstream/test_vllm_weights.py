"""VLLMWeights against a stand-in for vLLM's dev-mode endpoints, and against a server without them."""

from __future__ import annotations

import pytest

from polar.upstream.vllm_weights import VLLMWeights, WeightSyncError, WeightSyncUnavailable
from tests.support.weight_server import WeightServer


@pytest.fixture
def checkpoint(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    return tmp_path


def test_an_update_pauses_reloads_resets_the_cache_names_the_version_and_resumes(checkpoint):
    with WeightServer(busy_resets=2) as fake, VLLMWeights(fake.url) as vllm:
        vllm.check()  # GET on each route: a POST-only route answers 405, so it exists
        fake.calls.clear()
        timings = vllm.load(checkpoint, 3)
        assert fake.names == ["POST /pause", "POST /collective_rpc", *["POST /reset_prefix_cache"] * 3,
                              "POST /update_weight_version", "POST /resume"]
        calls = dict(fake.calls)
        assert calls["POST /pause"] == {"mode": "wait"}  # running requests finish under the old weights
        assert calls["POST /collective_rpc"] == {"method": "polar_reload_weights",
                                                 "kwargs": {"weights_path": str(checkpoint.resolve())}}
        assert calls["POST /update_weight_version"] == {"new_version": "3"}
        assert vllm.version() == "3" and not vllm.is_paused()
        assert list(timings.seconds) == ["pause", "reload", "reset_prefix_cache", "version", "resume"]


def test_a_failed_reload_leaves_vllm_paused_and_says_so(checkpoint):
    with WeightServer(fail="/collective_rpc") as fake, VLLMWeights(fake.url) as vllm:
        with pytest.raises(WeightSyncError, match=r"version 4, at reload: .*500.*left paused"):
            vllm.load(checkpoint, 4)
        assert fake.names == ["POST /pause", "POST /collective_rpc"] and fake.paused


def test_a_directory_without_weights_is_refused_before_vllm_is_paused(tmp_path):
    with WeightServer() as fake, VLLMWeights(fake.url) as vllm:
        with pytest.raises(WeightSyncError, match="holds no"):
            vllm.load(tmp_path, 1)
        assert fake.calls == []


def test_a_server_without_dev_mode_is_named_with_what_it_lacks(double_server, checkpoint):
    _, url = double_server  # the scripted double serves the OpenAI routes only, as vLLM without dev mode does
    with VLLMWeights(url) as vllm:
        with pytest.raises(WeightSyncUnavailable, match=r"no POST /collective_rpc, GET /weight_info.*"
                                                        r"GET /server_info: .*VLLM_SERVER_DEV_MODE=1"):
            vllm.check()
        with pytest.raises(WeightSyncUnavailable, match="no POST /pause.*VLLM_SERVER_DEV_MODE=1"):
            vllm.load(checkpoint, 1)


def test_without_polars_worker_extension_the_check_names_the_flag_unless_told_to_reload_plainly(checkpoint):
    with WeightServer(extension="") as fake:
        with VLLMWeights(fake.url) as vllm, pytest.raises(WeightSyncUnavailable, match=(
                r"without polar's worker extension: start it with --worker-extension-cls "
                r"polar\.upstream\.vllm_extension\.WeightReload")):
            vllm.check()
        with VLLMWeights(fake.url, reload_method="reload_weights") as vllm:
            vllm.check()
            vllm.load(checkpoint, 1)
        assert dict(fake.calls)["POST /collective_rpc"]["method"] == "reload_weights"


def test_an_unreachable_server_is_said_plainly():
    with VLLMWeights("http://127.0.0.1:9") as vllm, pytest.raises(WeightSyncUnavailable, match="does not answer"):
        vllm.check()
