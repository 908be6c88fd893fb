"""The export of the README's main job (Claude Code in Docker on the shipped tasks, `main_job`):
files `datasets` loads, token rows that are exactly the captured tokens, chat rows that re-render to
them with the project's prefix-stable template, and RL groups pulled from a rollout server.

Claude Code's system prompt starts with a per-request billing line (`cch=…; cc_prev_req=…`), so (as
of this writing) each of its calls re-renders the conversation and becomes its own one-turn
trajectory (broken prefix, kept by default); every row is checked on its own, turn by turn.
test_multiturn_export covers trajectories of many turns.
"""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from polar.capture.reader import CaptureReader
from polar.cli import main
from polar.datasets import load_chat, parse_chat_row, stream_rl_groups, tokens
from polar.rollout.client import RolloutClient
from polar.rollout.state import RolloutState
from polar.tokens.template import ChatTemplate
from tests.conftest import REPO
from tests.rollout.conftest import ApiServer

pytestmark = pytest.mark.docker
PROJECT_TEMPLATE = REPO / "data" / "chat_templates" / "qwen3.5-xml-tools.jinja"
SPLITS = ("train", "validation")


@pytest.fixture(scope="module")
def exported(main_job, tokenizer_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("export")
    done = CliRunner().invoke(main, [
        "export", "--state", str(main_job.state), "--captures", str(main_job.captures), "--out", str(out),
        "--min-reward", "1.0", "--val-fraction", "0.5", "--rl", "--quiet",
        "--tokenizer", str(tokenizer_dir), "--chat-template", str(PROJECT_TEMPLATE)], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    return out, done.output


@pytest.fixture(scope="module")
def results(main_job):
    state = RolloutState(main_job.state)
    try:
        return state.all_results()
    finally:
        state.close()


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def load(out, kind: str, fmt: str, tmp_path):
    from datasets import load_dataset

    files = {s: str(out / kind / f"{s}.{fmt}") for s in SPLITS}
    kwargs = {"features": tokens.features()} if (kind, fmt) == ("tokens", "jsonl") else {}
    return load_dataset("json" if fmt == "jsonl" else "parquet", data_files=files, cache_dir=str(tmp_path / "hf"),
                        **kwargs)


def test_the_main_job_ran_token_faithful_on_the_project_template(main_job, tokenizer_dir):
    # polar's gateway builds prompts with ChatTemplate.from_dir(tokenizer) (polar/mitm/addon.py: token_faithful):
    # the tokenizer dir's own template, which scripts/build_tiny_model.py copies from the project's file
    assert ChatTemplate.from_dir(tokenizer_dir).template_text == PROJECT_TEMPLATE.read_text()
    store = CaptureReader(main_job.captures)
    modes = {row["prompt_mode"].split(":")[0] for row in store.calls(with_tokens=False) if row["prompt_len"]}
    assert modes <= {"re-render", "token-faithful"}  # polar rendered every prompt, vLLM (the double) only sampled


def test_every_trajectory_exports_and_loads(exported, results, tmp_path):
    out, output = exported
    stats = json.loads((out / "stats.json").read_text())
    trajectories = [t for r in results for t in r.trajectories]
    n = len(trajectories)
    assert n >= len(results) and all(r.reward == 1.0 for r in results)
    # Each session is one multi-turn conversation: every turn continued the last one's tokens.
    assert all(len(t.turns) >= 2 and not t.broken_prefix for t in trajectories)
    # The double answers deterministically, so two samples of a task can be token-identical: kept once.
    unique = {(tuple(t.token_ids), tuple(t.loss_mask)): t for t in trajectories}
    k = len(unique)
    assert (stats["total"]["attempted"], stats["total"]["accepted"], stats["sessions"]) == (n, k, len(results))
    assert stats["rejected"] == ({"duplicate": n - k} if n > k else {})
    assert stats["total"]["trainable_tokens"] == sum(t.trainable_tokens for t in unique.values())
    assert stats["by_harness"]["claude_code"]["accepted"] == k
    assert f"{k}/{n} trajectories accepted from {len(results)} sessions" in output
    assert stats["chat"] == {"rows": k, "skipped": {}, "rerender": {"checked": k, "exact": k, "mismatches": []}}

    for kind in ("tokens", "chat"):
        for fmt in ("jsonl", "parquet"):
            ds = load(out, kind, fmt, tmp_path)
            assert sum(ds[s].num_rows for s in SPLITS) == k
            tasks = {s: set(ds[s]["task"]) for s in SPLITS}
            assert tasks["train"] and tasks["validation"] and not tasks["train"] & tasks["validation"]
    exported_ids = {row["trajectory_id"] for s in SPLITS for row in load(out, "tokens", "parquet", tmp_path)[s]}
    assert len(exported_ids) == k
    assert {(tuple(t.token_ids), tuple(t.loss_mask)) for t in trajectories if t.id in exported_ids} == set(unique)


def test_token_rows_are_the_captured_tokens(main_job, exported, tokenizer, tmp_path):
    out, _ = exported
    store = CaptureReader(main_job.captures)
    calls = {row["call_id"]: row for row in store.calls()}
    ds = load(out, "tokens", "jsonl", tmp_path)
    parquet = load(out, "tokens", "parquet", tmp_path)
    for split in SPLITS:
        assert ds[split].to_list() == parquet[split].to_list()
        for row in ds[split]:
            ids, mask = row["input_ids"], row["loss_mask"]
            assert len(ids) == len(row["labels"]) == len(mask) == len(row["logprobs"]) == row["num_tokens"]
            assert row["labels"] == [t if m else -100 for t, m in zip(ids, mask)]
            trained = 0
            for turn in row["turns"]:
                call = calls[turn["call_id"]]
                start, end = turn["completion_start"], turn["completion_end"]
                assert ids[:start] == call["prompt_ids"] and ids[start:end] == call["completion_ids"]
                assert row["logprobs"][start:end] == pytest.approx(call["completion_logprobs"])
                assert all(mask[start:end]) and not any(mask[turn["prompt_start"]:start])
                trained += end - start
            assert sum(mask) == trained == row["num_trainable"]
            last = calls[row["turns"][-1]["call_id"]]
            assert ids == last["prompt_ids"] + last["completion_ids"]
            decoded = tokenizer.decode(ids, skip_special_tokens=False)
            assert decoded == tokenizer.decode(last["prompt_ids"] + last["completion_ids"], skip_special_tokens=False)
            assert tokenizer.encode(decoded, add_special_tokens=False)[: len(last["prompt_ids"])] == last["prompt_ids"]


def test_chat_rows_rerender_to_the_tokens_with_the_project_template(exported, tokenizer, tmp_path):
    """Rendered by transformers' own apply_chat_template, independent of polar's checker."""
    out, _ = exported
    template = PROJECT_TEMPLATE.read_text()
    token_rows = {row["trajectory_id"]: row for s in SPLITS for row in load(out, "tokens", "parquet", tmp_path)[s]}
    chat = load(out, "chat", "jsonl", tmp_path)
    for split in SPLITS:
        for raw in chat[split]:
            row = parse_chat_row(raw)
            expect = token_rows[row["trajectory_id"]]
            text = tokenizer.apply_chat_template(row["messages"], tools=row["tools"], chat_template=template,
                                                 tokenize=False, add_generation_prompt=False,
                                                 **row["chat_template_kwargs"])
            ids = tokenizer.encode(text, add_special_tokens=False)
            n = len(expect["input_ids"])
            assert ids[:n] == expect["input_ids"], row["trajectory_id"]
            assert tokenizer.decode(ids[n:]) == "\n"  # the line break after the last turn's end marker
            trained = [i for i, m in enumerate(row["messages"]) if m["train"]]
            assert len(trained) == len(expect["turns"]) and row["messages"][-1]["train"]
            for turn, at in zip(expect["turns"], trained):
                prompt = tokenizer.apply_chat_template(row["messages"][:at], tools=row["tools"], chat_template=template,
                                                       tokenize=False, add_generation_prompt=True,
                                                       **row["chat_template_kwargs"])
                assert tokenizer.encode(prompt, add_special_tokens=False) == \
                    expect["input_ids"][: turn["completion_start"]]
            assert {t["function"]["name"] for t in row["tools"]} >= {"Bash"}  # Claude Code's own tools
            assert all(m.get("reasoning_content") for m in row["messages"] if m["train"])
    # the loader helper gives the same parsed rows
    assert load_chat(str(out), "train", cache_dir=str(tmp_path / "hf"))[0]["tools"] == \
        parse_chat_row(chat["train"][0])["tools"]


def test_rl_groups_from_the_export_and_from_a_rollout_server(main_job, exported, results, tmp_path):
    out, _ = exported
    from datasets import load_dataset

    rows = load_dataset("parquet", data_files=str(out / "rl" / "groups.parquet"), split="train",
                        cache_dir=str(tmp_path / "hf")).to_list()
    samples = {r.task_id for r in results}
    assert {row["group_id"] for row in rows} == samples
    assert {(row["group_size"], row["reward"], row["advantage"]) for row in rows} == {(main_job.samples, 1.0, 0.0)}

    state = tmp_path / "rollout.db"  # a server on a copy: the shared run's results stay as they are
    shutil.copy(main_job.state, state)
    with ApiServer(state) as server, RolloutClient(server.url) as client:
        groups = list(stream_rl_groups(client, main_job.samples, follow=False, include_drained=True))
    assert sorted(g.group_id for g in groups) == sorted(samples)
    by_trajectory = {row["trajectory_id"]: row for row in rows}
    for g in groups:
        assert g.sessions == main_job.samples and not g.dropped
        for row in g.rows:
            assert row["input_ids"] == by_trajectory[row["trajectory_id"]]["input_ids"]
            assert row["loss_mask"] == by_trajectory[row["trajectory_id"]]["loss_mask"]
