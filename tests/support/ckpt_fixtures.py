"""Real checkpoints for the checkpoint, verify, prune and disk tests: a small nanoGPT-shaped GPT
(same module names, tied wte/lm_head, AdamW state after one real step) and what nanoGPT's
train.py puts around it in out/ckpt.pt."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, BLOCK, N_LAYER, N_HEAD, N_EMBD = 96, 16, 2, 2, 32


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self, n_embd: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(
        self, vocab: int = VOCAB, n_layer: int = N_LAYER, n_embd: int = N_EMBD, tied: bool = True
    ) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(vocab, n_embd),
                "wpe": nn.Embedding(BLOCK, n_embd),
                "h": nn.ModuleList([Block(n_embd, N_HEAD) for _ in range(n_layer)]),
                "ln_f": nn.LayerNorm(n_embd),
            }
        )
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        if tied:
            self.transformer.wte.weight = self.lm_head.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(
                    p, 0.0, 0.02 / (math.sqrt(2 * n_layer) if name.endswith("c_proj.weight") else 1)
                )

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1])
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def nanogpt_checkpoint(
    n_layer: int = N_LAYER, iter_num: int = 300, tied: bool = True, seed: int = 0, model: GPT | None = None
) -> tuple[dict[str, Any], GPT]:
    """What nanoGPT's train.py saves: model, AdamW state after a real step, model_args, iter_num,
    best_val_loss (a tensor there) and the config dict of its globals."""
    torch.manual_seed(seed)
    model = model or GPT(n_layer=n_layer, tied=tied)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    idx = torch.randint(0, VOCAB, (2, BLOCK))
    loss = model(idx, torch.roll(idx, -1, 1))
    loss.backward()
    opt.step()
    model_args = {
        "n_layer": n_layer,
        "n_head": N_HEAD,
        "n_embd": N_EMBD,
        "block_size": BLOCK,
        "bias": True,
        "vocab_size": VOCAB,
        "dropout": 0.0,
    }
    config = {
        "out_dir": "out",
        "eval_interval": 2000,
        "log_interval": 1,
        "eval_only": False,
        "always_save_checkpoint": True,
        "init_from": "scratch",
        "wandb_log": False,
        "dataset": "openwebtext",
        "gradient_accumulation_steps": 40,
        "batch_size": 12,
        "learning_rate": 6e-4,
        "max_iters": 600000,
        "beta1": 0.9,
        "beta2": 0.95,
        "grad_clip": 1.0,
        "decay_lr": True,
        "warmup_iters": 2000,
        "min_lr": 6e-5,
        "backend": "nccl",
        "device": "cpu",
        "dtype": "float32",
        "compile": False,
    }
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "model_args": model_args,
        "iter_num": iter_num,
        "best_val_loss": loss.detach(),
        "config": config,
    }
    return state, model


def small_state(step: int, width: int = 64) -> dict[str, Any]:
    """A tiny checkpoint for tests that need many of them (prune, disk)."""
    g = torch.Generator().manual_seed(step)
    return {
        "model": {
            "transformer.wte.weight": torch.randn(width, 16, generator=g) * 0.02,
            "transformer.h.0.mlp.c_fc.weight": torch.randn(32, 16, generator=g) * 0.02,
        },
        "iter_num": step,
    }


def flip_byte_in(path: Path, needle: bytes) -> int:
    """Flip one byte in the middle of `needle`'s bytes inside the file (tensor data); returns the offset."""
    data = bytearray(path.read_bytes())
    at = data.find(needle)
    assert at >= 0, "tensor bytes not found in the file"
    off = at + len(needle) // 2
    data[off] ^= 0x01
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(bytes([data[off]]))
        f.flush()
        os.fsync(f.fileno())
    return off


class NotAllowed:
    """A training-state object weights_only refuses (it could run code on load)."""

    def __init__(self) -> None:
        self.value = 1
