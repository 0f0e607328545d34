"""Train TinyLM's shipped weights on Python's own documentation (a tool, not a dependency).

The text is the standard library's ``pydoc_data/topics.py`` (the help topics of Python's
documentation, under the PSF licence, which allows shipping weights trained on it): every
paragraph (a run of lines between blank lines) ends with TinyLM's end-of-sequence byte
0x03 (ASCII "end of text"; it never occurs in the docs), so the model learns where a
text ends and output lengths vary. Bytes are tokens, so the vocabulary stays 256 ids and
every byte-level path (tokenizer, HTTP, detokeniser) stays as it is.

The model here is TinyLM's forward (``labserve/lab/tinylm.py``) in torch, the same ops in
the same order: integer weights per column, activations quantised per row, keys and values
on their 1/32 grid, softmax weights rounded to 16 bits. Training rounds with a
straight-through gradient (the rounding's gradient taken as 1). At the end the weights
are saved as float16 and loaded into the numpy TinyLM, and its logits are checked
against this forward in float64 (within 1e-5).

Needs torch (``pip install -c constraints.txt torch==2.13.0``). Runs on one thread
(the machine is shared):

    .venv/bin/python scripts/train_tinylm.py   # writes labserve/lab/tinylm_weights.npz
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from pydoc_data import topics

import numpy as np
import torch
from torch import Tensor, nn

from labserve.generation.batch import SeqBatch
from labserve.lab.tinylm import TINYLM_EOS, TinyLM

OUT = Path(__file__).resolve().parent.parent / "labserve" / "lab" / "tinylm_weights.npz"
D, LAYERS, HEADS, FF, CTX, VOCAB = 128, 2, 4, 512, 1024, 256
Q, KV_SCALE, P_ONE = 127.0, 1.0 / 32.0, 65536.0


def corpus() -> np.ndarray:
    """The docs as bytes, every paragraph ended by TINYLM_EOS (topics in a fixed order)."""
    out = bytearray()
    for key in sorted(topics.topics):
        for para in topics.topics[key].split("\n\n"):
            if para.strip():
                out += para.strip("\n").encode("utf-8") + bytes((TINYLM_EOS,))
    assert TINYLM_EOS not in b"".join(t.encode() for t in topics.topics.values())
    return np.frombuffer(bytes(out), np.uint8).astype(np.int64)


def ste_round(x: Tensor) -> Tensor:
    """Round forward, identity backward."""
    return x + (torch.round(x) - x).detach()


def quant_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """As numpy's _quantise_rows: integers per row and the row's scale (no gradient)."""
    peak = x.detach().abs().amax(-1, keepdim=True)
    scale = torch.where(peak > 0, peak / Q, torch.ones_like(peak))
    return ste_round(x / scale), scale


class Linear(nn.Module):
    """As numpy's _Linear: integer weights per output column, integer activations per row."""

    def __init__(self, n_in: int, n_out: int, gain: float = 1.0) -> None:
        super().__init__()
        self.w = nn.Parameter(gain * torch.randn(n_in, n_out) / math.sqrt(n_in))

    def forward(self, x: Tensor, w: Tensor | None = None) -> Tensor:
        """``x @ w`` on integers, as numpy's ``_Linear.__call__`` (``w``: a tied weight)."""
        w = self.w if w is None else w
        peak = w.detach().abs().amax(0, keepdim=True)
        ws = torch.where(peak > 0, peak / Q, torch.ones_like(peak))
        xq, xs = quant_rows(x)
        return (xq @ ste_round(w / ws)) * xs * ws


def rms(x: Tensor) -> Tensor:
    """RMS norm with no gain, as numpy's ``_rms_norm``."""
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)


def grid(x: Tensor) -> Tensor:
    """Keys or values on the 1/32 grid, as integers in [-127, 127] (``_on_grid``)."""
    return torch.clamp(ste_round(x * (1.0 / KV_SCALE)), -Q, Q)


class Torchy(nn.Module):
    """TinyLM's forward for whole sequences (batch, length) at given positions."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Parameter(0.1 * torch.randn(VOCAB, D))
        self.positions = nn.Parameter(0.01 * torch.randn(CTX, D))
        self.layers = nn.ModuleList(
            nn.ModuleList([Linear(D, 3 * D), Linear(D, D, 0.5), Linear(D, FF), Linear(FF, D, 0.5)])
            for _ in range(LAYERS)
        )
        self.unembed = Linear(D, VOCAB)  # its weight is never used: tied to embed.T

    def attend(self, qkv: Tensor) -> Tensor:
        """Causal attention, as numpy's ``_attend`` for a whole prefill."""
        b, n, _ = qkv.shape
        hd = D // HEADS
        q, k, v = (p.reshape(b, n, HEADS, hd).transpose(1, 2) for p in qkv.split(D, -1))
        qq, qs = quant_rows(q)
        qs = qs * (KV_SCALE / math.sqrt(hd))
        scores = (qq @ grid(k).transpose(-1, -2)) * qs
        future = torch.ones(n, n, dtype=torch.bool, device=qkv.device).triu(1)
        scores = scores.masked_fill(future, -math.inf)
        weights = ste_round(torch.exp(scores - scores.amax(-1, keepdim=True).detach()) * P_ONE)
        att = (weights @ grid(v)) / weights.sum(-1, keepdim=True) * KV_SCALE
        return att.transpose(1, 2).reshape(b, n, D)

    def forward(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """Logits at every position, shape (batch, length, 256)."""
        x = self.embed[tokens] + self.positions[positions]
        for qkv, out, up, down in self.layers:  # type: ignore[misc]
            x = x + out(self.attend(qkv(rms(x))))
            x = x + down(torch.relu(up(rms(x))))
        return self.unembed(rms(x), self.embed.T)


def batches(data: np.ndarray, rng: np.random.Generator, size: int, length: int):
    """Windows of length+1 bytes, without end.

    Half start right after an EOS at position 0 (as a prompt does), half anywhere in the
    text at a random position (so every one of the 1024 positions is trained).
    """
    starts_eos = np.flatnonzero(data[: -length - 1] == TINYLM_EOS) + 1
    while True:
        half = size // 2
        s = np.concatenate(
            [rng.choice(starts_eos, half), rng.integers(0, len(data) - length - 1, size - half)]
        )
        offs = np.concatenate(
            [np.zeros(half, np.int64), rng.integers(0, CTX - length, size - half)]
        )
        x = np.stack([data[i : i + length + 1] for i in s])
        pos = offs[:, None] + np.arange(length)[None, :]
        yield torch.from_numpy(x[:, :-1]), torch.from_numpy(x[:, 1:]), torch.from_numpy(pos)


def train(args: argparse.Namespace) -> Torchy:
    """AdamW, 100 warm-up steps, cosine decay to 5%; the last 2% of the text held out."""
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    data = corpus()
    cut = int(len(data) * 0.98)
    train_data, held = data[:cut], data[cut:]
    model = Torchy()
    if args.init is not None:  # go on from saved weights (a second stage)
        with np.load(args.init) as npz:
            load_into(model, {k: npz[k] for k in npz.files})
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    it = batches(train_data, rng, args.batch, args.length)
    t0 = time.monotonic()
    for step in range(args.steps):
        warm = min(1.0, (step + 1) / 100)
        lr = args.lr * warm * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        x, y, pos = next(it)
        loss = nn.functional.cross_entropy(model(x, pos).reshape(-1, VOCAB), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(
                f"step {step} loss {loss.item():.3f} lr {lr:.2e} {time.monotonic() - t0:.0f}s",
                flush=True,
            )
    with torch.no_grad():
        h = torch.from_numpy(held[: 8 * 257].reshape(8, 257))
        pos = torch.arange(256).expand(8, 256)
        hl = nn.functional.cross_entropy(
            model(h[:, :-1], pos).reshape(-1, VOCAB), h[:, 1:].reshape(-1)
        )
        print(f"held-out loss {hl.item():.3f} nats/byte ({hl.item() / math.log(2):.2f} bits)")
    return model


def save(model: Torchy, path: Path) -> dict[str, np.ndarray]:
    """The weights as float16 in an npz (about 1 MB); returns what was written."""
    arrays = {"embed": model.embed, "positions": model.positions}
    for i, layer in enumerate(model.layers):
        for name, lin in zip(("qkv", "out", "up", "down"), layer, strict=True):  # type: ignore[arg-type]
            arrays[f"layer{i}.{name}"] = lin.w
    weights = {k: v.detach().numpy().astype(np.float16) for k, v in arrays.items()}
    np.savez_compressed(path, **weights)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")
    return weights


def load_into(model: Torchy, weights: dict[str, np.ndarray]) -> Torchy:
    """Copy saved weights (an npz's arrays) into ``model``; returns it."""
    dtype = model.embed.dtype
    with torch.no_grad():
        model.embed.copy_(torch.from_numpy(weights["embed"].astype(np.float64)).to(dtype))
        model.positions.copy_(torch.from_numpy(weights["positions"].astype(np.float64)).to(dtype))
        for i, layer in enumerate(model.layers):
            for name, lin in zip(("qkv", "out", "up", "down"), layer, strict=True):  # type: ignore[arg-type]
                w = torch.from_numpy(weights[f"layer{i}.{name}"].astype(np.float64))
                lin.w.copy_(w.to(dtype))
    return model


def check(weights: dict[str, np.ndarray], path: Path) -> None:
    """The numpy TinyLM on the saved weights against this forward in float64 (within 1e-5)."""
    model = load_into(Torchy().double(), weights)
    text = np.frombuffer(b"Return the value of the attribute named by the string.", np.uint8)
    tokens = text.astype(np.int64)
    lm = TinyLM(weights=str(path))
    ours = lm.generate(SeqBatch((1,), (tokens,), (0,), (True,)))[0]
    with torch.no_grad():
        theirs = model(torch.from_numpy(tokens)[None], torch.arange(len(tokens))[None])[0, -1]
    diff = float(np.max(np.abs(ours - theirs.numpy())))
    print(f"numpy vs torch logits: max abs difference {diff:.2e}")
    if diff > 1e-5:
        raise SystemExit("the numpy TinyLM does not compute this forward")


def main() -> None:
    """Train, save, check."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--init", type=Path, default=None, help="start from these saved weights")
    args = p.parse_args()
    torch.set_num_threads(1)
    model = train(args)
    check(save(model, args.out), args.out)


if __name__ == "__main__":
    main()
