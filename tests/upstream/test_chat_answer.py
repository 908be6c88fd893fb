"""vLLM's chat answer read into a ChatResult: the prompt's ids become one uint32 array, bad ids an upstream error."""

from __future__ import annotations

import asyncio

import numpy as np
import orjson
import pytest

from polar.canonical import ChatRequest, Message, TextPart
from polar.errors import GatewayError
from polar.upstream.chat_stream import ChatStream
from polar.upstream.prompt_ids import read_chat_answer
from polar.upstream.vllm_chat import parse_chat_completion

REQUEST = ChatRequest(model="m", messages=[Message(role="user", content=[TextPart(text="hi")])])


def answer(prompt_ids):
    # The fields vLLM 0.32's /v1/chat/completions answers with when asked for token ids and logprobs.
    return {"id": "chatcmpl-1", "model": "m", "created": 1, "prompt_token_ids": prompt_ids,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop",
                         "token_ids": [7, 8], "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -0.25}]}}],
            "usage": {"prompt_tokens": len(prompt_ids or []), "completion_tokens": 2}}


def test_the_prompt_ids_are_one_uint32_array_with_the_values_sent():
    ids = list(range(0, 151_000, 7)) + [2**31 - 1]
    result = parse_chat_completion(answer(ids), "call", REQUEST, 0.0)
    assert isinstance(result.prompt_token_ids, np.ndarray) and result.prompt_token_ids.dtype == np.uint32
    assert result.prompt_token_ids.tolist() == ids
    assert result.completion_token_ids == [7, 8] and result.completion_logprobs == [-0.5, -0.25]
    assert result.model_dump()["prompt_token_ids"] == ids  # dumps as a list, as before


def test_no_prompt_ids_is_an_empty_prompt():
    assert parse_chat_completion(answer(None), "call", REQUEST, 0.0).prompt_token_ids.tolist() == []


@pytest.mark.parametrize("bad", [[1, -2], [1, "2"], [1, 2.5], [1, 2**40], [[1]]])
def test_ids_that_are_not_token_ids_are_the_upstreams_error(bad):
    with pytest.raises(GatewayError) as err:
        parse_chat_completion(answer(bad), "call", REQUEST, 0.0)
    assert err.value.kind == "upstream_error" and "prompt_token_ids" in err.value.message


def test_a_streams_first_chunk_gives_the_same_array():
    stream = ChatStream(upstream=None, request=REQUEST, call_id="call")
    stream._take({"model": "m", "prompt_token_ids": [5, 6, 7], "choices": [{"index": 0, "delta": {"content": "a"},
                                                                            "token_ids": [9]}]})
    stream._take({"choices": [{"index": 0, "delta": {}, "token_ids": [10], "finish_reason": "stop"}]})
    assert stream.prompt_tokens == 3
    assert stream.result().prompt_token_ids.tolist() == [5, 6, 7] and stream.result().completion_token_ids == [9, 10]
    with pytest.raises(GatewayError):
        stream._take({"prompt_token_ids": [-1], "choices": []})


def test_read_past_the_sessions_ids_the_result_is_the_full_parses():
    known = np.arange(0, 40_000, dtype=np.uint32)
    ids = known[:39_990].tolist() + [3, 1, 4, 1, 5]
    raw = orjson.dumps(answer(ids))
    full, fast = (parse_chat_completion(data, "call", REQUEST, 0.0)
                  for data in (orjson.loads(raw), read_chat_answer(raw, known)))
    assert fast.prompt_token_ids.tolist() == ids and fast.model_dump() == full.model_dump()


class _Lines:
    """The upstream's `data:` payloads, as StreamRequest.batches yields them (no server needed to feed a stream)."""

    url = "http://upstream/v1/chat/completions"

    def __init__(self, chunks):
        self.chunks = [orjson.dumps(c).decode() for c in chunks] + ["[DONE]"]

    async def batches(self):
        for chunk in self.chunks:
            yield [chunk]


def test_a_stream_reads_its_first_chunks_ids_past_the_sessions():
    known = np.arange(100, 5_100, dtype=np.uint32)
    ids = known.tolist() + [1, 2]
    chunks = [{"model": "m", "prompt_token_ids": ids, "choices": [{"index": 0, "delta": {"content": "a"}, "token_ids": [9]}]},
              {"choices": [{"index": 0, "delta": {}, "token_ids": [10], "finish_reason": "stop"}]}]

    async def run():
        stream = ChatStream(_Lines(chunks), REQUEST, "call", known)
        return stream, [d async for d in stream]

    stream, deltas = asyncio.run(run())
    assert stream.result().prompt_token_ids.tolist() == ids and stream.result().completion_token_ids == [9, 10]
    assert deltas[0][0].text == "a"
