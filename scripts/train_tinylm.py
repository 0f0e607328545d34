r"""Train TinyLM's shipped weights on Python's own documentation (a tool, not a dependency).

The text is the standard library's ``pydoc_data/topics.py`` (the help topics of Python's
documentation, under the PSF licence, which allows shipping weights trained on it): every
paragraph (a run of lines between blank lines) ends with TinyLM's end-of-sequence byte
0x03 (ASCII "end of text"; it never occurs in the docs), so the model learns where a
text ends and output lengths vary. Bytes are tokens, so the vocabulary stays 256 ids and
every byte-level path (tokenizer, HTTP, detokeniser) stays as it is.

The model here is TinyLM's forward (``labserve/lab/tinylm.py``) in torch, the same ops in
the same order: integer weights per column, activations quantised per row, keys and values
on their 1/32 grid, softmax weights rounded to 16 bits. By default training rounds with a
straight-through gradient (the rounding's gradient taken as 1). ``--float`` trains the same
network without rounding (keys and values clipped to the grid's range, torch's attention):
1.35x less CPU per byte (47 against 64 us at batches of 32 x 128), and the rounded forward
of its weights lost 0.002 nats/byte against the float one, so the later stages are float.
At the end the weights are saved as float16 and loaded into the numpy TinyLM, and its
logits are checked against the rounded forward in float64 (within 1e-5). ``--every N``
saves a checkpoint every N steps and scores it: held-out loss and issue 36's words bar on
``DEV_PROMPTS`` (not the test's prompts).

Needs torch (``pip install -c constraints.txt torch==2.13.0``). Runs on one thread
(the machine is shared). The shipped weights are four stages, each from the last:

    T=".venv/bin/python scripts/train_tinylm.py"
    $T --out /tmp/s1.npz                                                     # rounded
    $T --init /tmp/s1.npz --seed 1 --steps 600 --lr 1e-3 --out /tmp/s2.npz   # rounded
    $T --init /tmp/s2.npz --seed 2 --float --batch 32 --length 128 \
        --steps 3000 --schedule constant --out /tmp/s3.npz
    $T --init /tmp/s3.npz --seed 3 --float --batch 32 --length 128 \
        --steps 2000 --schedule linear      # writes labserve/lab/tinylm_weights.npz

(benchmarks/RESULTS.md, "TinyLM's trained weights", has each stage's losses and time.)
"""

from __future__ import annotations

import argparse
import math
import re
import time
from pathlib import Path
from pydoc_data import topics

import numpy as np
import torch
from torch import Tensor, nn

from labserve.generation.batch import SeqBatch
from labserve.lab.tinylm import TINYLM_EOS, TinyLM

# English sentences not in the docs, to choose checkpoints by; tests/lab/test_tinylm_words.py
# has its own ten, never used here.
DEV_PROMPTS = [
    "The old dog slept by the fire and",
    "Yesterday my brother bought a",
    "The river was cold, so we",
    "Every summer the family goes to",
    "I think the best part of the film",
    "The teacher asked the students to",
    "On Sunday we usually",
    "The shop on the corner sells",
    "Her new bicycle is",
    "It started to rain while they",
]
WORD = re.compile(r"[A-Za-z]{2,}")

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

    def forward(self, x: Tensor, w: Tensor | None = None, exact: bool = True) -> Tensor:
        """``x @ w`` on integers, as numpy's ``_Linear.__call__`` (``w``: a tied weight).

        ``exact=False``: a float product, no rounding (the float phase).
        """
        w = self.w if w is None else w
        if not exact:
            return x @ w
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

    def __init__(self, exact: bool = True) -> None:
        super().__init__()
        self.exact = exact  # False: the float phase (no rounding, torch's attention)
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

    def attend_float(self, qkv: Tensor) -> Tensor:
        """Causal attention in float; keys and values clipped to the grid's range (+-127/32)."""
        b, n, _ = qkv.shape
        q, k, v = (p.reshape(b, n, HEADS, D // HEADS).transpose(1, 2) for p in qkv.split(D, -1))
        lim = Q * KV_SCALE
        k, v = torch.clamp(k, -lim, lim), torch.clamp(v, -lim, lim)
        att = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return att.transpose(1, 2).reshape(b, n, D)

    def forward(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """Logits at every position, shape (batch, length, 256)."""
        ex = self.exact
        attend = self.attend if ex else self.attend_float
        x = self.embed[tokens] + self.positions[positions]
        for qkv, out, up, down in self.layers:  # type: ignore[misc]
            x = x + out(attend(qkv(rms(x), exact=ex)), exact=ex)
            x = x + down(torch.relu(up(rms(x), exact=ex)), exact=ex)
        return self.unembed(rms(x), self.embed.T, exact=ex)


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


def learning_rate(args: argparse.Namespace, step: int) -> float:
    """Linear warm-up over 100 steps, then ``args.schedule``.

    constant; linear to 0; cosine to 5% (the first weights' two stages were trained so).
    """
    warm = min(1.0, (step + 1) / 100)
    cosine = 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * step / args.steps))
    shape = {"constant": 1.0, "linear": 1.0 - step / args.steps, "cosine": cosine}
    return args.lr * warm * shape[args.schedule]


def held_out_loss(model: Torchy, held: np.ndarray) -> float:
    """Mean loss in nats per byte over 32 windows of 256 bytes at positions 0-255."""
    h = torch.from_numpy(held[: 32 * 257].reshape(32, 257))
    with torch.no_grad():
        logits = model(h[:, :-1], torch.arange(256).expand(32, 256))
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), h[:, 1:].reshape(-1))
    return float(loss)


def greedy(lm: TinyLM, prompts: list[str], tokens: int = 64) -> list[str]:
    """Each prompt's greedy continuation (EOS not stopping it), all prompts in one batch."""
    ids = tuple(range(len(prompts)))
    known = [lm.encode(p) for p in prompts]
    starts = [0] * len(prompts)
    for _ in range(tokens):
        toks = tuple(np.asarray(k[s:], np.int64) for k, s in zip(known, starts, strict=True))
        logits = lm.generate(SeqBatch(ids, toks, tuple(starts), (True,) * len(ids)))
        for i, token in enumerate(np.argmax(logits, axis=1)):
            starts[i] = len(known[i])
            known[i].append(int(token))
    lm.free_sequences(ids)
    return [
        bytes(k[len(p.encode()) :]).decode("latin-1") for k, p in zip(known, prompts, strict=True)
    ]


def words_score(path: Path) -> tuple[int, float, str]:
    """Issue 36's bar on the dev prompts: (prompts passing, mean share of known words, a sample).

    Passing: at least 60% letters and spaces, 5 distinct words (2+ letters), 70% of them
    in the training text.
    """
    vocab = {w.lower() for w in WORD.findall("".join(topics.topics.values()))}
    passed, shares = 0, []
    outs = greedy(TinyLM(weights=str(path)), DEV_PROMPTS)
    for text in outs:
        words = {w.lower() for w in WORD.findall(text)}
        share = len(words & vocab) / max(1, len(words))
        letters = sum(c.isascii() and (c.isalpha() or c == " ") for c in text)
        passed += letters >= 0.6 * len(text) and len(words) >= 5 and share >= 0.7
        shares.append(share)
    return passed, float(np.mean(shares)), outs[0]


def checkpoint(model: Torchy, args: argparse.Namespace, step: int, held: np.ndarray) -> None:
    """Save the weights as of ``step`` and print their held-out loss and dev prompts' words."""
    args.checkpoints.mkdir(parents=True, exist_ok=True)
    path = args.checkpoints / f"{args.out.stem}.step{step}.npz"
    save(model, path, quiet=True)
    exact = model.exact
    model.exact = True
    loss = held_out_loss(model, held)
    model.exact = exact
    passed, share, sample = words_score(path)
    print(
        f"checkpoint {path.name}: held-out {loss:.3f} nats/byte (rounded forward), "
        f"dev prompts passing {passed}/{len(DEV_PROMPTS)}, known distinct words {share:.0%}, "
        f"{sample!r}",
        flush=True,
    )


def train(args: argparse.Namespace) -> Torchy:
    """AdamW, warm-up and ``args.schedule``; the last 2% of the text held out."""
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    data = corpus()
    cut = int(len(data) * 0.98)
    train_data, held = data[:cut], data[cut:]
    model = Torchy(exact=not args.float)
    if args.init is not None:  # go on from saved weights (a later stage)
        with np.load(args.init) as npz:
            load_into(model, {k: npz[k] for k in npz.files})
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    it = batches(train_data, rng, args.batch, args.length)
    t0, c0 = time.monotonic(), time.process_time()
    for step in range(args.steps):
        lr = learning_rate(args, step)
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
                f"step {step} loss {loss.item():.3f} lr {lr:.2e} "
                f"{time.monotonic() - t0:.0f}s wall {time.process_time() - c0:.0f}s CPU",
                flush=True,
            )
        if args.every and (step + 1) % args.every == 0 and step + 1 < args.steps:
            checkpoint(model, args, step + 1, held)
    model.exact = True
    hl = held_out_loss(model, held)
    print(f"held-out loss {hl:.3f} nats/byte ({hl / math.log(2):.2f} bits), rounded forward")
    return model


def save(model: Torchy, path: Path, quiet: bool = False) -> dict[str, np.ndarray]:
    """The weights as float16 in an npz (about 1 MB); returns what was written."""
    arrays = {"embed": model.embed, "positions": model.positions}
    for i, layer in enumerate(model.layers):
        for name, lin in zip(("qkv", "out", "up", "down"), layer, strict=True):  # type: ignore[arg-type]
            arrays[f"layer{i}.{name}"] = lin.w
    weights = {k: v.detach().numpy().astype(np.float16) for k, v in arrays.items()}
    np.savez_compressed(path, **weights)
    if not quiet:
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
    p.add_argument("--schedule", choices=("constant", "linear", "cosine"), default="cosine")
    p.add_argument("--float", action="store_true", help="train without rounding (float phase)")
    p.add_argument("--every", type=int, default=0, help="checkpoint every this many steps")
    p.add_argument("--checkpoints", type=Path, default=Path("/tmp/tinylm_checkpoints"))
    args = p.parse_args()
    torch.set_num_threads(1)
    model = train(args)
    check(save(model, args.out), args.out)


if __name__ == "__main__":
    main()
