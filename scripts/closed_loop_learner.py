"""The learner of scripts/closed_loop.py: one GRPO policy-gradient step per request, on CPU torch.

Run by the vLLM venv's Python (~/.cache/polar/vllm-venv: torch CPU and transformers; polar's own venv
has no torch), as a child of closed_loop.py. It keeps the policy in float32 with its Adam state for
the whole run and speaks JSON lines: one request per line on stdin, one answer per line on stdout
(logs on stderr).

  {"op": "step", "rows": [row, ...], "out": DIR} → {"ok": true, "loss": …, "tokens": …, …}
      rows are polar's RL rows (polar.datasets.rl): input_ids, loss_mask, logprobs (what vLLM
      sampled with, as captured), advantage. The step's weights go to DIR as a Hugging Face
      checkpoint (the base model's config and tokenizer files beside them) for vLLM to reload.
  {"op": "quit"}

The loss is written out here (a dozen lines in `grpo_loss`) rather than taken from TRL: TRL's GRPO
loss is a method of its GRPOTrainer (accelerate, datasets, its own generation loop), not a function
that takes captured tokens, and installing TRL into the shared vLLM venv would pull packages that
the vLLM build pins.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch.utils.checkpoint import checkpoint
from transformers import AutoModelForCausalLM

CHUNK = 128  # positions whose vocabulary-wide logits exist at once (248k floats each)
KEEP = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
        "special_tokens_map.json", "chat_template.jinja")  # copied beside each step's weights


def log(message: str) -> None:
    print(f"[learner] {message}", file=sys.stderr, flush=True)


def sampled_logprobs(model, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """log π(token[p] | tokens[:p]) for each p in `positions`, under the current weights.

    The trunk runs once; the tied output head and the softmax over the 248k-token vocabulary run
    in chunks under activation checkpointing, so no more than CHUNK rows of logits are alive."""
    hidden = model.model(input_ids=input_ids[None]).last_hidden_state[0]
    before = hidden[positions - 1]  # the state that predicted each sampled token
    targets = input_ids[positions]

    def chunk(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        logits = model.lm_head(h).float()
        return torch.log_softmax(logits, dim=-1).gather(-1, t[:, None]).squeeze(-1)

    parts = [checkpoint(chunk, before[i:i + CHUNK], targets[i:i + CHUNK], use_reentrant=False)
             for i in range(0, len(positions), CHUNK)]
    return torch.cat(parts)


def grpo_loss(new: torch.Tensor, old: torch.Tensor, advantage: float, clip: float) -> torch.Tensor:
    """The clipped GRPO/PPO surrogate of one trajectory, summed over its sampled tokens.

    ratio = π_θ(token) / π_old(token), with π_old the logprob vLLM sampled the token with (polar's
    capture: the behaviour policy, exactly). The group-relative advantage is the session's, the same
    for each of its tokens. Taking the smaller of the plain and the clipped objective stops a token
    from moving further once its ratio left [1 - clip, 1 + clip] in the advantage's direction. Right
    after sampling the ratio is 1 up to the trainer/server numeric gap (float32 here, bfloat16 in
    vLLM), so a single step per batch is plain policy gradient with a trust region."""
    ratio = torch.exp(new - old)
    unclipped = ratio * advantage
    clipped = torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * advantage
    return -torch.minimum(unclipped, clipped).sum()


class Learner:
    def __init__(self, model_dir: Path, lr: float, clip: float, max_grad_norm: float, save_dtype: str, threads: int):
        torch.manual_seed(0)
        if threads:
            torch.set_num_threads(threads)
        self.model_dir = model_dir
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model.train()
        self.tied = bool(getattr(self.model.config, "tie_word_embeddings", False))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.clip, self.max_grad_norm = clip, max_grad_norm
        self.save_dtype = getattr(torch, save_dtype)

    def step(self, rows: list[dict], out: Path) -> dict:
        t0 = time.monotonic()
        self.optimizer.zero_grad(set_to_none=True)
        tokens = sum(sum(r["loss_mask"]) for r in rows)
        if not tokens:
            raise ValueError("no sampled token in the batch")
        stats = {"rows": len(rows), "tokens": tokens, "loss": 0.0, "gap_sum": 0.0, "gap_max": 0.0, "clipped": 0,
                 "missing_logprobs": 0}
        for row in rows:
            ids = torch.tensor(row["input_ids"], dtype=torch.long)
            mask = torch.tensor(row["loss_mask"], dtype=torch.bool)
            positions = torch.nonzero(mask).squeeze(-1)
            if positions.numel() and positions[0] == 0:
                raise ValueError("a trajectory starts with a sampled token: nothing predicted it")
            new = sampled_logprobs(self.model, ids, positions)
            captured = [row["logprobs"][p] for p in positions.tolist()]
            # A turn without captured logprobs (None) gets ratio 1: plain REINFORCE on those tokens.
            stats["missing_logprobs"] += sum(lp is None for lp in captured)
            old = torch.tensor([new[i].item() if lp is None else lp for i, lp in enumerate(captured)])
            gap = (new.detach() - old).abs()
            stats["gap_sum"] += gap.sum().item()
            stats["gap_max"] = max(stats["gap_max"], gap.max().item())
            ratio = torch.exp(new.detach() - old)
            stats["clipped"] += int(((ratio - 1).abs() > self.clip).sum())
            # Token-level mean over the whole batch (DAPO-style): every sampled token weighs the same,
            # so a long trajectory's tokens are not diluted by its length.
            loss = grpo_loss(new, old, float(row["advantage"]), self.clip) / tokens
            loss.backward()
            stats["loss"] += loss.item()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm).item()
        self.optimizer.step()
        train_s = time.monotonic() - t0
        self.save(out)
        return {"ok": True, "loss": stats["loss"], "rows": stats["rows"], "tokens": tokens, "grad_norm": grad_norm,
                "mean_abs_gap": stats["gap_sum"] / tokens, "max_abs_gap": stats["gap_max"],
                "clipped_fraction": stats["clipped"] / tokens, "missing_logprobs": stats["missing_logprobs"],
                "train_s": train_s, "save_s": time.monotonic() - t0 - train_s, "out": str(out)}

    def save(self, out: Path) -> None:
        """The weights as the served checkpoint holds them (dtype, names; a tied head is not stored)."""
        out.mkdir(parents=True, exist_ok=True)
        state = {name: p.detach().to(self.save_dtype).contiguous() for name, p in self.model.state_dict().items()
                 if not (self.tied and name == "lm_head.weight")}
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
        for name in KEEP:
            if (self.model_dir / name).is_file():
                shutil.copy2(self.model_dir / name, out / name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="the served model's directory (the start policy)")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--clip", type=float, default=0.2)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--save-dtype", default="bfloat16", help="dtype of the written weights (what vLLM serves)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    learner = Learner(args.model, args.lr, args.clip, args.max_grad_norm, args.save_dtype, args.threads)
    params = sum(p.numel() for p in learner.model.parameters())
    log(f"{args.model} loaded in {time.monotonic() - t0:.1f}s ({params:,} parameters, float32, torch {torch.__version__})")
    print(json.dumps({"ready": True, "parameters": params, "torch": torch.__version__}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        if request.get("op") == "quit":
            break
        try:
            if request.get("op") != "step":
                raise ValueError(f"unknown op {request.get('op')!r}")
            answer = learner.step(request["rows"], Path(request["out"]))
            log(f"step → {answer['out']}: loss {answer['loss']:+.4f}, {answer['tokens']} tokens, "
                f"grad norm {answer['grad_norm']:.3f}, |Δlogprob| vs vLLM {answer['mean_abs_gap']:.4f}")
        except Exception as exc:  # the driver reports it and stops; the learner stays up for a clean quit
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
