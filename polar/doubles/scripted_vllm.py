"""The scripted vLLM TEST DOUBLE, in one import: its parts live in their own modules.

script.py (what to answer), model_format.py (how the template's model family writes it),
server.py (the vLLM endpoints), wire.py (vLLM's error and usage shapes), logprobs.py, running.py;
for `stream: true`, stream.py (vLLM's SSE chunks), deltas.py (how vLLM's streaming parsers cut them)
and sse.py (pacing, aborts, mid-stream faults).
"""

from polar.doubles.model_format import ModelFormat, parse_completion, render_completion
from polar.doubles.running import BackgroundServer
from polar.doubles.script import Script, Step
from polar.doubles.server import FINGERPRINT, ScriptedVLLM

__all__ = [
    "FINGERPRINT",
    "BackgroundServer",
    "ModelFormat",
    "Script",
    "ScriptedVLLM",
    "Step",
    "parse_completion",
    "render_completion",
]
