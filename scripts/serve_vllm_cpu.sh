#!/usr/bin/env bash
# Start the real vLLM (CPU build) on the tiny Qwen3.5-vocabulary model, in the background, and wait
# until /health answers. Prints the server PID on the last line of stdout.
#
#   scripts/serve_vllm_cpu.sh [PORT] [MODEL_DIR]
#
# PORT defaults to 8000, MODEL_DIR to ${POLAR_CACHE:-~/.cache/polar}/models/qwen35-tiny (build it with
# scripts/build_tiny_model.py). Environment knobs:
#   POLAR_SERVED_MODEL  served model name (default polar-tiny)
#   POLAR_MAX_MODEL_LEN context length (default 32768; a coding CLI's system prompt alone is ~20k tokens)
#   POLAR_VLLM_TIMEOUT  seconds to wait for /health (default 600; a cold start takes about 2 minutes)
#   POLAR_VLLM_LOG      server log file (default <cache>/vllm-<port>.log)
#   POLAR_VLLM_ARGS     extra arguments for the api_server, word-split
#   POLAR_TOOL_PARSER   vLLM's tool-call parser (default qwen3_coder)
#   POLAR_REASONING_PARSER  vLLM's reasoning parser (default qwen3; empty: none, for a family without reasoning)
# Stop it with: kill <PID>
set -euo pipefail

cache="${POLAR_CACHE:-$HOME/.cache/polar}"
port="${1:-8000}"
model="${2:-$cache/models/qwen35-tiny}"
venv="$cache/vllm-venv"
name="${POLAR_SERVED_MODEL:-polar-tiny}"
timeout="${POLAR_VLLM_TIMEOUT:-600}"
log="${POLAR_VLLM_LOG:-$cache/vllm-$port.log}"
reasoning="${POLAR_REASONING_PARSER-qwen3}"

[ -x "$venv/bin/python" ] || { echo "no vLLM venv at $venv: run scripts/setup_vllm_cpu.sh" >&2; exit 1; }
[ -f "$model/config.json" ] || { echo "no model at $model: run scripts/build_tiny_model.py" >&2; exit 1; }
mkdir -p "$(dirname "$log")"

# The CPU backend sizes its KV cache from VLLM_CPU_KVCACHE_SPACE (GiB), not from the memory fraction;
# 1 GiB holds ~2M tokens of this model. Nothing may reach a model hub.
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1

# The `vllm` console script looks up a distribution called "vllm" (this one is "vllm-cpu"): use -m.
# --enable-scale-out adds /inference/v1/generate (token ids in, token ids out); qwen3_coder parses the
# <tool_call><function=...><parameter=...> format; qwen3 splits <think> reasoning into message.reasoning.
# shellcheck disable=SC2086
setsid "$venv/bin/python" -m vllm.entrypoints.openai.api_server \
  --host 127.0.0.1 --port "$port" \
  --model "$model" --served-model-name "$name" \
  --dtype bfloat16 --max-model-len "${POLAR_MAX_MODEL_LEN:-32768}" --gpu-memory-utilization 0.1 \
  --enable-scale-out \
  --enable-auto-tool-choice --tool-call-parser "${POLAR_TOOL_PARSER:-qwen3_coder}" \
  ${reasoning:+--reasoning-parser "$reasoning"} \
  ${POLAR_VLLM_ARGS:-} >"$log" 2>&1 </dev/null &
pid=$!

deadline=$((SECONDS + timeout))
engine_seen=0  # the engine runs in a process of its own (titled VLLM::EngineCore) that the API server waits on
until curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "vLLM exited during startup; last lines of $log:" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
  if pgrep -s "$pid" -f '^VLLM::EngineCore' >/dev/null 2>&1; then
    engine_seen=1
  elif [ "$engine_seen" = 1 ]; then
    # Killed (the OOM killer takes the biggest process): the API server may wait on it forever.
    echo "vLLM's engine process died during startup (out of memory?); last lines of $log:" >&2
    tail -n 40 "$log" >&2
    kill -- -"$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
    exit 1
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "vLLM not healthy after ${timeout}s; stopping it (log: $log)" >&2
    kill -- -"$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
    exit 1
  fi
  sleep 2
done
echo "vLLM ready on http://127.0.0.1:$port (model $name, log $log, ${SECONDS}s)"
echo "$pid"
