"""Every option of polar's gateway, declared once.

Each `Option` names itself, its type, default, choices or bounds, its help and the part of the gateway a
change rebuilds. From this list come the mitmproxy options (`--set polar_upstream=…`, added by the addon that
reads each one), the flags of `polar proxy` (`--upstream`, …) and the ones `polar rollout serve` shares, the
fields of `ProxyConfig`, and the checks mitmproxy does not make (choices, bounds). Nothing here imports
mitmproxy or click: they take the spec, not the other way round.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from polar.capture import working_set

# What a change rebuilds: the capture writer, the upstream backend, the backend and each session's prompt
# ids (another tokenizer or template), the live gateway's per-call settings, or nothing polar builds.
Part = Literal["writer", "backend", "prompt", "gateway", "nothing"]


@dataclass(frozen=True)
class Option:
    name: str  # the mitmproxy option; the CLI flag is the same without `polar_` (`--upstream-model`)
    type: Any  # str, int, bool or Sequence[str] (a list: a CLI flag given once per item)
    default: Any
    help: str
    rebuilds: Part
    choices: tuple[str, ...] = ()
    min: int | None = None
    path: bool = False  # a file polar writes (the CLI refuses a directory)
    # Set: the CLI takes the flag once per item and joins them with it into the one string the mitmproxy option
    # holds (so `--set polar_upstream=URL` keeps working).
    sep: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.field.replace("_", "-")

    @property
    def field(self) -> str:
        """The name in `ProxyConfig` and in the CLI's parameters."""
        return self.name.removeprefix("polar_")

    @property
    def many(self) -> bool:
        return self.type == Sequence[str]

    def parse(self, text: str) -> Any:
        """A `--set NAME=TEXT` value as this option's type (as mitmproxy would parse it)."""
        if self.type is int:
            try:
                return int(text)
            except ValueError:
                raise ValueError(f"{self.name} must be an integer, not {text!r}") from None
        if self.type is bool:
            if text not in ("", "true", "false"):
                raise ValueError(f"{self.name} must be true or false, not {text!r}")
            return text != "false"
        return [text] if self.many else text

    def problem(self, value: Any) -> str | None:
        """What mitmproxy lets through: `--set` does not hold a value to its choices (a typo in the commit mode
        would capture with another one, silently), and knows no bounds."""
        if self.choices and value not in self.choices:
            return f"{self.name} must be one of {', '.join(self.choices)}, not {value!r}"
        if self.min is not None and value < self.min:
            return f"{self.name} must be at least {self.min}, not {value}"
        return None


OPTIONS: tuple[Option, ...] = (
    Option("polar_upstream", str, "http://127.0.0.1:8000", "Base URL of the vLLM server; several (comma-separated, "
           "or the flag repeated): a fleet of replicas of one model, each session on the replica caching its prefix, "
           "failed replicas taken out (polar/upstream/fleet).", "backend", sep=","),
    Option("polar_fleet_imbalance", int, 150, "Fleet routing: a session stays on (and a new one joins) the replica "
           "caching its prefix unless that replica's in-flight tokens exceed this percent of the fleet's mean.",
           "backend", min=100),
    Option("polar_upstream_model", str, "", "Served model name at the upstream ('' = ask its /v1/models).", "backend"),
    Option("polar_upstream_key", str, "", "API key polar sends to the upstream (never the client's).", "backend"),
    # int, not float: mitmproxy's `--set` cannot parse float options.
    Option("polar_upstream_timeout", int, 600, "Seconds to wait for one upstream answer.", "backend", min=1),
    # Off by default: vLLM is silent while a call queues and prefills, so any bound is the user's to choose.
    Option("polar_upstream_stall", int, 0, "Seconds an upstream answer may bring no byte (before it begins, or "
           "between stream chunks) before polar asks the server's health probe: no answer there either = it "
           "stalled (a fleet takes it out and retries a call its client saw nothing of); an answer = busy, the "
           "call waits on. 0 = off (only --upstream-timeout).", "backend", min=0),
    Option("polar_dropped_messages", str, "splice", "A request that repeats an earlier answer after only part of "
           "that call's messages (a harness moved or dropped the messages just before it): 'splice' = the model sees "
           "what the harness sent, the answer's sampled ids spliced in, and the call starts its own trajectory; "
           "'keep' = the dropped messages stay where the model saw them, so the call extends the last and the "
           "session stays one trajectory (a runtime may set it per session: a harness's `dropped_messages`).",
           "gateway", choices=("splice", "keep")),
    Option("polar_db", str, "captures.db", "SQLite file that receives one row per model call.", "writer", path=True),
    Option("polar_db_sync", str, "FULL", "SQLite synchronous mode for captures.", "writer", choices=("FULL", "NORMAL")),
    Option("polar_db_busy_timeout", int, 30, "Seconds a capture write waits for another process's lock on the "
           "database before the call fails.", "writer", min=0),
    Option("polar_max_body", int, 64 * 1024 * 1024, "Largest request body accepted, in bytes.", "gateway", min=0),
    Option("polar_model_aliases", Sequence[str], (), "Extra model names listed on GET …/models.", "gateway"),
    Option("polar_tokenizer", str, "", "Hugging Face tokenizer dir of the served model. Set = token-faithful "
           "prompts (polar builds the prompt ids, reusing each session's sampled ids); '' = vLLM renders the chat "
           "template.", "prompt"),
    Option("polar_chat_template", str, "", "Jinja chat template file of the served model ('' = the tokenizer's "
           "own). Token-faithful prompts render with it; in both modes polar shapes messages so that this template "
           "accepts them.", "prompt"),
    Option("polar_token_endpoint", str, "auto", "Token-in vLLM endpoint.", "backend",
           choices=("auto", "generate", "completions")),
    Option("polar_client_addr_header", str, "", "Header naming the client's address, set by polar's own front "
           "(`polar proxy --workers`); '' = the connection's peer. Only for a proxy no client reaches directly: a "
           "client could claim any address.", "nothing"),
    # Under Kubernetes' default grace of 30 s, with time left to end the rest. docker stop's default is 10 s:
    # there set it below that (or give docker stop -t more).
    Option("polar_drain", int, 20, "Seconds calls in flight may go on once polar is told to stop (SIGTERM, "
           "SIGINT); then a stream ends with its provider's error event and a call waiting upstream with an error "
           "answer, each captured.", "nothing", min=0),
    Option("polar_hot_sessions", int, working_set.HOT_SESSIONS, "Sessions taking turns at once that polar keeps "
           "each one's history reads, body bases and token ids for (~8 MB of memory per 128k-token session). Fewer "
           "fit: their calls redo that work (a warning says so).", "gateway", min=1),
    Option("polar_stream_keepalive", int, 5, "Seconds a streamed answer may stay silent (queue, prefill) before "
           "the client gets a keep-alive; 0 = never.", "gateway", min=0),
)
SPEC: dict[str, Option] = {o.name: o for o in OPTIONS}


def default(name: str) -> Any:
    return SPEC[name].default


def rebuilding(*parts: Part) -> frozenset[str]:
    """The options whose change rebuilds one of `parts`."""
    return frozenset(o.name for o in OPTIONS if o.rebuilds in parts)


def add_options(loader: Any, names: Iterable[str]) -> None:
    """Declare these options with mitmproxy (an addon's `load(loader)`), as the spec says."""
    for name in names:
        o = SPEC[name]
        loader.add_option(o.name, o.type, list(o.default) if o.many else o.default, o.help,
                          choices=list(o.choices) or None)


def check(values: Any, updated: Iterable[str]) -> None:
    """Raise ValueError for the first updated polar option whose value the spec refuses (`values`: mitmproxy's
    options, read by attribute)."""
    for name in sorted(n for n in updated if n in SPEC):
        if (problem := SPEC[name].problem(getattr(values, name))) is not None:
            raise ValueError(problem)
