"""A vLLM worker extension: reload weights so that every layer serves them, tied output heads included.

vLLM's worker method `reload_weights(weights_path=...)` (reached through POST /collective_rpc)
copies a checkpoint into the served model in place and re-runs the post-load processing of each
layer it loaded. A layer that loads nothing keeps its state, which is right, except for an output
head tied to the input embedding (Qwen3 up to 4B, the tiny test model): the checkpoint holds no
`lm_head.weight`, so the head is not processed again, and on the CPU build its matmul runs on a
oneDNN copy of the weight packed at start-up (vllm/model_executor/layers/utils.py,
`dispatch_cpu_unquantized_gemm`). The model then reads tokens with the new embedding and scores
them with the old one. Measured on vLLM 0.32 CPU with the tiny model, after reloading a checkpoint
whose embedding moved by N(0, 0.1): sampled-token logprobs -0.21 from vLLM against -7.16 from
transformers on the same weights (0.06 apart before the change).

`polar_reload_weights` reloads, then re-runs the post-load processing of every layer whose weight
is shared with another (the tied head, and its embedding), so their packed copies are rebuilt.

    vllm serve MODEL --worker-extension-cls polar.upstream.vllm_extension.WeightReload ...
    (polar importable by vLLM's Python: installed there, or its checkout on PYTHONPATH; it imports
    nothing of polar's and no third-party module at import time)

then `VLLMWeights(url, reload_method=RELOAD_METHOD)`.
"""

from __future__ import annotations

EXTENSION = "polar.upstream.vllm_extension.WeightReload"  # --worker-extension-cls
RELOAD_METHOD = "polar_reload_weights"  # the collective_rpc method it adds


class WeightReload:
    """Mixed into vLLM's worker class by --worker-extension-cls (so `self` is the worker)."""

    def polar_reload_weights(self, weights_path: str) -> list[str]:
        """Reload in place from `weights_path`; returns the shared-weight layers processed again."""
        self.reload_weights(weights_path=weights_path)
        model = self.model_runner.get_model()
        owners: dict[int, list[tuple[str, object]]] = {}
        for name, module in model.named_modules():
            weight = module._parameters.get("weight")
            if weight is not None:
                owners.setdefault(id(weight), []).append((name, module))
        refreshed = []
        for sharing in owners.values():
            if len(sharing) < 2:
                continue
            for name, module in sharing:
                process = getattr(getattr(module, "quant_method", None), "process_weights_after_loading", None)
                if process is not None:
                    process(module)
                    refreshed.append(name)
        return refreshed
