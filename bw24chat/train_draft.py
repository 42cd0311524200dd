"""``bw24chat train-draft``: give a model that ships no multi-token-prediction head one, trained by
self-distillation, so that ``--spec mtp`` can speed it up.

The head is DeepSeek-V3's NextN module (models/mtp.py): enorm / hnorm / eh_proj, one decoder layer
of the model's own architecture, the model's LM head.  Row t pairs the trunk's hidden state h_t
with the embedding of token t+1 and predicts token t+2.

  data      the model writes it: continuations of each built-in prompt (draft_prompts.json,
            ``train``; its chat template applied), one greedy and ``samples - 1`` sampled at
            temperatures cycling through ``temperatures`` (varied text), on the PyTorch backend
            (backends/torch_backend.py: the model files' own blocks) in batches.  Nothing is
            downloaded.  The ``heldout`` prompts, never trained on, measure the head.
  loss      KL(trunk's next-token distribution at t+1 || head's distribution at row t): the head
            learns the trunk's own prediction of token t+2, the token speculative decoding
            must guess.  The chained rows (a draft fed its own output g, as speculative.
            MTPDrafter runs it) are trained too, to ``depth`` (backends/torch_backend.py).
  init      the head starts as the trunk's own next-token prediction at t: eh_proj = [0 | I]
            passes the trunk's (normed) state, the decoder layer is the trunk's last with its
            output projections scaled by 1 / (the trunk's hidden RMS), so that on this unit-RMS
            stream it makes the small relative update it makes in the trunk (pre-norm branches
            scale with their output matrix only), and shared_head_norm restores the final
            norm's scale.  The embedding's half of eh_proj starts at zero and is learned.
  measure   on held-out texts (the model's greedy continuations of the held-out prompts):
            the share of rows where the head's greedy draft at each depth is the trunk's greedy
            token, and from it the mean accepted length per round at K = depth (1 + expected
            accepted drafts); the same on training texts shows overfitting.  Training stops
            early once ``patience`` measurements in a row did not improve the held-out accepted
            length, and the head saved is the best one measured.
  vocab     the head drafts over the ``draft_vocab`` tokens most frequent in the generated
            training texts (FR-Spec, Zhao et al. 2025): its LM head is the trunk's rows of those
            ids only, a fraction of the full head's cost per draft; the verify keeps the full
            head, so the output is unchanged (models/mtp.py).  The ids are saved with the head.

Only the head trains (the trunk is frozen, its dequantized weights in bf16 on a GPU, float32 on
the CPU).  The run can be resumed: every ``--save-every`` steps the head, the optimizer and the
generated texts go to ``OUT.resume`` (removed when the run completes).  The head is saved as a
small safetensors file beside the model (loaders/draft_head.py), where loading finds it.

PyTorch is an optional extra: ``pip install 'bw24chat[train]'``.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import sys
import threading
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable

import numpy as np

DENSE = ("llama", "qwen2", "qwen3")  # the families the PyTorch backend runs
TORCH_HINT = "pip install 'bw24chat[train]'"


class TrainError(RuntimeError):
    """Why a model cannot be trained here (one line for the user)."""


class TrainCancelled(Exception):
    """The run was cancelled; its state is saved for --resume."""


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def import_torch():
    try:
        import torch
    except ImportError:
        raise TrainError(f"training a draft head needs PyTorch, an optional extra: {TORCH_HINT}") from None
    return torch


def builtin_prompts() -> dict[str, list[str]]:
    """The training and held-out prompts shipped with the package (no two alike)."""
    return json.loads(resources.files("bw24chat").joinpath("draft_prompts.json").read_text(encoding="utf-8"))


@dataclass
class TrainConfig:
    steps: int = 600
    depth: int = 3  # chained rows trained: the first `depth` drafts of a round
    batch: int = 16  # texts per step
    lr: float = 5e-4  # AdamW; linear warm-up over `warmup` steps, then cosine to lr / 10
    warmup: int = 30
    gen_tokens: int = 256  # continuation tokens per prompt (fewer where the model stops)
    samples: int = 16  # continuations per training prompt: the greedy one, then sampled ones
    temperatures: tuple = (0.5, 0.7, 0.9, 1.1)  # of the sampled continuations, in turn
    max_len: int = 512  # prompt + continuation, tokens
    gen_batch: int = 256  # texts generated side by side
    draft_vocab: int = 8192  # tokens the head drafts over (the most frequent in its texts); 0: all
    patience: int = 4  # held-out measurements without improvement before training stops
    loss_chunk: int = 2048  # rows whose V-wide logits are formed at a time
    save_every: int = 100
    eval_every: int = 50
    seed: int = 0


@dataclass
class TrainProgress:
    stage: str  # "generating" | "training" | "saving"
    done: int
    total: int
    loss: float | None = None
    heldout: dict | None = None  # the latest measurement (TrainResult.heldout)
    elapsed_s: float = 0.0

    @property
    def fraction(self) -> float:
        return self.done / max(self.total, 1)

    def text(self) -> str:
        if self.stage == "generating":
            return f"generating the training texts: {self.done}/{self.total}"
        if self.stage == "saving":
            return "saving the head"
        parts = [f"step {self.done}/{self.total}"]
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4f}")
        if self.heldout:
            parts.append(f"held-out accepted length {self.heldout['mean_len']:.2f} at K={len(self.heldout['accept'])} "
                         f"(acceptance {' '.join(f'{100 * a:.0f}%' for a in self.heldout['accept'])})")
        if self.done and self.elapsed_s:
            rate = self.done / self.elapsed_s
            parts.append(f"{rate:.1f} steps/s, ETA {_duration((self.total - self.done) / rate)}")
        return " · ".join(parts)


def _duration(s: float) -> str:
    s = int(round(s))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


@dataclass
class TrainResult:
    path: Path
    steps: int
    device: str
    texts: int  # training texts
    tokens: int  # their tokens
    generate_s: float
    train_s: float
    peak_gpu_bytes: int | None  # torch's peak allocation on the GPU; None on the CPU
    heldout: dict = field(default_factory=dict)  # {"accept": [per depth], "mean_len": accepted length at K = depth}
    train: dict = field(default_factory=dict)  # the same on training texts


def resume_path(out: Path) -> Path:
    return out.with_name(out.name + ".resume")


def initial_head_tensors(ckpt, args, hidden_rms: float = 1.0) -> dict:
    """The head's starting point under its canonical names (layer N = the trunk's layer count):
    eh_proj = [0 | I] (the trunk's state through, the embedding's half to be learned), enorm =
    hnorm = 1, the trunk's last layer with attn_o and ffn_down divided by ``hidden_rms`` (the RMS
    of the trunk's last hidden states), shared_head_norm = the RMS of the final norm's weights:
    with a small update, head(row t) ~ the trunk's logits at t."""
    from .loaders.tensor import QTensor

    n, D = args.num_hidden_layers, args.hidden_size
    p = f"blk.{n}.nextn."
    out = {}

    def f32(name, a):
        out[name] = QTensor(name, "F32", a.shape, np.ascontiguousarray(a, np.float32))

    last = f"blk.{n - 1}."
    for k, t in ckpt.tensors.items():
        if k.startswith(last):
            name = f"blk.{n}.{k[len(last):]}"
            if k.endswith(("attn_o", "ffn_down")):
                f32(name, t.dequantize() / np.float32(hidden_rms))
            else:
                out[name] = dataclasses.replace(t, name=name)
    f32(p + "eh_proj", np.concatenate([np.zeros((D, D)), np.eye(D)], axis=1))
    f32(p + "enorm", np.ones(D))
    f32(p + "hnorm", np.ones(D))
    w = ckpt.tensors["output_norm"].dequantize()
    f32(p + "shared_head_norm", np.full(D, np.sqrt(np.mean(w * w))))
    return out


def choose_draft_vocab(texts: list[list[int]], n: int, vocab_size: int, keep=()) -> np.ndarray:
    """The ``n`` token ids most frequent in ``texts`` (ties: the lower id first) with the ids in
    ``keep`` (the stop tokens) always among them, ascending (FR-Spec's frequency-ranked draft
    vocabulary); fewer where the texts use fewer distinct tokens; every id when n is 0."""
    counts = np.bincount(np.concatenate([np.asarray(t, np.int64) for t in texts] or [np.zeros(0, np.int64)]),
                         minlength=vocab_size)[:vocab_size]
    keep = [int(k) for k in keep if 0 <= int(k) < vocab_size]
    counts[keep] = counts.max(initial=0) + 1
    if n <= 0:
        return np.arange(vocab_size, dtype=np.int32)
    order = np.argsort(-counts, kind="stable")[:n]
    return np.sort(order[counts[order] > 0]).astype(np.int32)


def _shift(x, k: int, T: int):
    """Rows k .. k + T - 1 of x (B, L, ...) along axis 1, zero past the end."""
    import torch

    y = x[:, k:k + T]
    if y.shape[1] < T:
        y = torch.cat([y, y.new_zeros((y.shape[0], T - y.shape[1], *y.shape[2:]))], 1)
    return y


class DraftTrainer:
    """A model's trunk and a new head on the PyTorch backend; ``run`` trains and saves the head."""

    def __init__(self, ckpt, config: TrainConfig | None = None, device: str | None = None,
                 progress: Callable[[TrainProgress], None] | None = None, cancel: threading.Event | None = None):
        torch = import_torch()
        from .backends.torch_backend import TorchBackend
        from .chat_template import ChatFormatter
        from .models import get_family
        from .models.mtp import MTPHead

        if ckpt.arch not in DENSE:
            raise TrainError(f"train-draft runs the dense families ({', '.join(DENSE)}); {ckpt.name} is {ckpt.arch}")
        if ckpt.mtp and ckpt.draft_head is None:
            raise TrainError(f"{ckpt.name} ships its own multi-token-prediction head: --spec mtp uses it")
        self.ckpt, self.cfg = ckpt, config or TrainConfig()
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise TrainError("--device cuda: PyTorch sees no CUDA GPU (a CPU build of torch, or no driver)")
        self.progress = progress or (lambda p: None)
        self.cancel = cancel
        dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        fam = get_family(ckpt.arch)
        self.args = fam.ModelArgs.from_dict(ckpt.config)
        self.eps = self.args.rms_norm_eps
        n_ctx = self.cfg.max_len + self.cfg.depth + 1
        self.tb = TorchBackend(self.device, dtype)
        self.trunk = fam.Model(self.args, self.tb, ckpt.tensors, n_ctx)
        self.tok = ckpt.tokenizer
        self.formatter = ChatFormatter.for_tokenizer(self.tok)
        _, lengths, H = self.hidden(self.prompt_ids(builtin_prompts()["train"][:16]))
        valid = torch.arange(H.shape[1], device=H.device)[None, :] < lengths[:, None]
        rms = float(H.float()[valid].pow(2).mean(-1).sqrt().mean())  # the trunk's hidden RMS, for the init
        self.hb = TorchBackend(self.device, dtype, trainable=True)
        self.head = MTPHead(self.trunk, self.hb, initial_head_tensors(ckpt, self.args, rms))
        self.params = [p for p, _ in self.hb.sources]
        self.vocab, self.vocab_mask = None, None  # the draft vocabulary (set_vocab)

    def set_vocab(self, texts: list[list[int]]) -> None:
        """The draft vocabulary from the training texts (choose_draft_vocab; None: all tokens)."""
        import torch

        V = self.args.vocab_size
        ids = choose_draft_vocab(texts, self.cfg.draft_vocab, V, self.tok.stop_ids)
        if len(ids) == V:
            self.vocab, self.vocab_mask = None, None
            return
        self.vocab = ids
        self.vocab_mask = torch.zeros(V, dtype=torch.bool, device=self.tb.device)
        self.vocab_mask[torch.as_tensor(ids, dtype=torch.long, device=self.tb.device)] = True

    # ------------------------------------------------------------------ data
    def prompt_ids(self, prompts: list[str]) -> list[list[int]]:
        keep = self.cfg.max_len - 16  # room for a continuation
        return [self.tok.encode(self.formatter.render([{"role": "user", "content": p}]))[-keep:] for p in prompts]

    def generate(self, prompts: list[list[int]], temps: list[float], seed: int, report=None) -> list[list[int]]:
        """Each prompt followed by the model's continuation (greedy where its temperature is 0,
        else sampled at it), up to and including a stop token, within max_len tokens."""
        import torch

        from .backends.torch_backend import TorchKVCache, TorchOps

        a, cfg = self.args, self.cfg
        stop = torch.tensor(sorted(self.tok.stop_ids) or [-1], device=self.tb.device)
        gen = torch.Generator(device=self.tb.device).manual_seed(seed)
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # like lengths together: less padding
        out: list[list[int]] = [[] for _ in prompts]
        with torch.no_grad():
            for c in range(0, len(order), cfg.gen_batch):
                rows = order[c:c + cfg.gen_batch]
                P = max(len(prompts[i]) for i in rows)
                n_new = min(cfg.gen_tokens, cfg.max_len - P)
                pad = torch.tensor([P - len(prompts[i]) for i in rows])
                ids = torch.tensor([[0] * (P - len(prompts[i])) + prompts[i] for i in rows], device=self.tb.device)
                cache = TorchKVCache(self.tb, a.num_hidden_layers, pad, P + n_new, a.num_key_value_heads, a.head_dim)
                temp = torch.tensor([temps[i] for i in rows], device=self.tb.device)
                is_greedy = temp <= 0
                done = torch.zeros(len(rows), dtype=torch.bool, device=self.tb.device)
                new, start = [], 0
                for step in range(n_new):
                    ops = TorchOps(self.tb, self.eps, cache=cache, start=start)
                    h = self.trunk.trunk(ops, ids)
                    z = self.trunk.logits(ops, h[:, -1:]).logits(self.tb)[:, 0]
                    drawn = torch.multinomial(torch.softmax(z / torch.where(is_greedy, 1.0, temp)[:, None], -1), 1, generator=gen)[:, 0]
                    t = torch.where(is_greedy, z.argmax(-1), drawn)
                    new.append(torch.where(done, -1, t))
                    done |= torch.isin(t, stop)
                    start += ids.shape[1]
                    ids = t[:, None]
                    if bool(done.all()):
                        break
                cont = torch.stack(new, 1).tolist()
                for r, i in enumerate(rows):
                    out[i] = prompts[i] + [t for t in cont[r] if t >= 0]
                if report:
                    report(min(c + cfg.gen_batch, len(order)), len(order))
        return out

    def hidden(self, texts: list[list[int]]):
        """(tokens (N, L), lengths (N,), the trunk's pre-norm hidden states (N, L, D)) on the device."""
        import torch

        from .backends.torch_backend import PassKV, TorchOps

        L = max(map(len, texts))
        tokens = torch.zeros((len(texts), L), dtype=torch.long)
        for i, t in enumerate(texts):
            tokens[i, :len(t)] = torch.tensor(t)
        tokens = tokens.to(self.tb.device)
        lengths = torch.tensor([len(t) for t in texts], device=self.tb.device)
        H = torch.zeros((len(texts), L, self.args.hidden_size), dtype=self.tb.dtype, device=self.tb.device)
        per = max(1, 8192 // L)
        with torch.no_grad():
            for s in range(0, len(texts), per):
                n = int(lengths[s:s + per].max())
                ops = TorchOps(self.tb, self.eps, kv=PassKV())
                H[s:s + per, :n] = self.trunk.trunk(ops, tokens[s:s + per, :n]).to(self.tb.dtype)
        return tokens, lengths, H

    # ------------------------------------------------------------------ the head's rows
    def head_rows(self, x, h, lens):
        """Per depth d: (the head's normed rows (B, T, D), the trunk's normed rows at t + d + 1
        (the teacher), valid (B, T)) for the texts x (B, L) with hidden states h and lengths."""
        import torch

        from .backends.torch_backend import PassKV, TorchOps

        T = x.shape[1] - 1
        teacher = self.trunk.logits(TorchOps(self.tb, self.eps, kv=PassKV()), h).x  # final norm of every position
        s = torch.arange(T, device=x.device)[None, :]
        kv, g, out = PassKV(), None, []
        for d in range(self.cfg.depth):
            ops = TorchOps(self.hb, self.eps, kv=kv, depth=d)
            lm, g = self.head.forward(ops, _shift(x, d + 1, T), h[:, :T] if d == 0 else g, d == 0)
            out.append((lm.x, _shift(teacher, d + 1, T), s <= lens[:, None] - d - 2))
        return out

    def _kl(self, xs, xt):
        import torch

        w = self.trunk.output
        lt = torch.log_softmax(self.tb_linear(xt, w), -1)
        ls = torch.log_softmax(self.tb_linear(xs, w), -1)
        return (lt.exp() * (lt - ls)).sum()

    def tb_linear(self, x, w):
        from .backends.torch_backend import _linear

        return _linear(self.tb, x, w)

    def loss(self, x, h, lens):
        """Mean over depths of the mean KL per valid row; the V-wide logits are formed
        ``loss_chunk`` rows at a time and recomputed in the backward pass (checkpointing)."""
        from torch.utils.checkpoint import checkpoint

        total = 0.0
        for xs, xt, valid in self.head_rows(x, h, lens):
            xs, xt = xs[valid], xt[valid]
            c = self.cfg.loss_chunk
            kl = sum(checkpoint(self._kl, xs[i:i + c], xt[i:i + c], use_reentrant=False) for i in range(0, len(xs), c))
            total = total + kl / max(len(xs), 1)
        return total / self.cfg.depth

    def measure(self, data, idx) -> dict:
        """On texts ``idx``: the acceptance of each depth's greedy draft given the drafts before
        it were accepted, and the mean accepted length per round at K = depth (1 + the expected
        accepted drafts, rows where a whole round fits in the text)."""
        import torch

        tokens, lengths, H = data
        agree, full = [], None
        with torch.no_grad():
            for b in range(0, len(idx), 16):
                sel = torch.as_tensor(idx[b:b + 16], device=tokens.device)
                n = int(lengths[sel].max())
                rows = self.head_rows(tokens[sel, :n], H[sel, :n], lengths[sel])
                ok = []
                for xs, xt, valid in rows:
                    same = torch.zeros(valid.shape, dtype=torch.bool, device=valid.device)
                    zs, zt = self.tb_linear(xs[valid], self.trunk.output), self.tb_linear(xt[valid], self.trunk.output)
                    if self.vocab_mask is not None:  # the draft's argmax over its vocabulary only
                        zs = zs.masked_fill(~self.vocab_mask, float("-inf"))
                    same[valid] = zs.argmax(-1) == zt.argmax(-1)
                    ok.append(same)
                chained = torch.cumprod(torch.stack(ok).int(), 0)  # (depth, B, T): drafts 0..d all accepted
                whole = rows[-1][2]  # a round of `depth` drafts fits
                agree.append(chained[:, whole].sum(1).double())
                full = (full or 0) + int(whole.sum())
        counts = torch.stack(agree).sum(0).cpu().numpy()  # rows whose drafts 0..d were all accepted
        full = max(full or 0, 1)
        accept = [float(counts[0] / full)] + [float(counts[d] / max(counts[d - 1], 1)) for d in range(1, len(counts))]
        return {"accept": accept, "mean_len": float(1 + counts.sum() / full)}

    # ------------------------------------------------------------------ the run
    def run(self, out: Path, resume: bool = False) -> TrainResult:
        import torch

        from .loaders.draft_head import trunk_sha256, write_head

        cfg = self.cfg
        on_gpu = self.tb.device.type == "cuda"
        if on_gpu:
            torch.cuda.reset_peak_memory_stats()
        sha = trunk_sha256(self.ckpt)
        opt = torch.optim.AdamW(self.params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
        state_file, step, elapsed = resume_path(out), 0, 0.0
        if resume and state_file.exists():
            texts, heldout, step, elapsed, best = self._load_state(state_file, opt, sha)
            generate_s = 0.0
        else:
            p = builtin_prompts()
            train_ids, held_ids = self.prompt_ids(p["train"]), self.prompt_ids(p["heldout"])
            prompts = [ids for ids in train_ids for _ in range(cfg.samples)] + held_ids
            temps = [0.0 if j == 0 else cfg.temperatures[(j - 1) % len(cfg.temperatures)]
                     for _ in train_ids for j in range(cfg.samples)] + [0.0] * len(held_ids)
            report = lambda done, total: self.progress(TrainProgress("generating", done, total))  # noqa: E731
            t0 = time.perf_counter()
            made = self.generate(prompts, temps, cfg.seed, report)
            generate_s = time.perf_counter() - t0
            texts, heldout = made[:len(train_ids) * cfg.samples], made[len(train_ids) * cfg.samples:]
            best = None
        self.set_vocab(texts)
        train, held = self.hidden(texts), self.hidden(heldout)
        greedy_train = list(range(0, len(texts), cfg.samples))[:len(heldout)]  # like the held-out texts: greedy
        sched = lambda i: min(1.0, (i + 1) / cfg.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(i / cfg.steps, 1))))  # noqa: E731
        measured, ema, t0 = None, None, time.perf_counter() - elapsed
        best = best or {"mean_len": -1.0, "step": 0, "since": 0, "params": None}  # the best held-out head so far
        steps_run = step
        for i in range(step, cfg.steps):
            if self.cancel is not None and self.cancel.is_set():
                self._save_state(state_file, opt, i, time.perf_counter() - t0, sha, texts, heldout, best)
                raise TrainCancelled(f"cancelled at step {i}; resume with --resume ({state_file})")
            for group in opt.param_groups:
                group["lr"] = cfg.lr * sched(i)
            pick = np.random.default_rng([cfg.seed, i]).choice(len(texts), size=min(cfg.batch, len(texts)), replace=False)
            sel = torch.as_tensor(pick, device=self.tb.device)
            n = int(train[1][sel].max())
            loss = self.loss(train[0][sel, :n], train[2][sel, :n], train[1][sel])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.params, 1.0)
            opt.step()
            value = loss.item()
            ema = value if ema is None else 0.9 * ema + 0.1 * value
            steps_run = i + 1
            stop = False
            if (i + 1) % cfg.eval_every == 0 or i + 1 == cfg.steps:
                measured = self.measure(held, list(range(len(heldout))))
                if measured["mean_len"] > best["mean_len"]:
                    best = {"mean_len": measured["mean_len"], "measured": measured, "step": i + 1, "since": 0,
                            "params": [p.detach().clone() for p in self.params]}
                else:
                    best["since"] += 1
                    stop = best["since"] >= cfg.patience  # early stopping on held-out acceptance
            if (i + 1) % cfg.save_every == 0 and i + 1 < cfg.steps and not stop:
                self._save_state(state_file, opt, i + 1, time.perf_counter() - t0, sha, texts, heldout, best)
            self.progress(TrainProgress("training", i + 1, cfg.steps, ema, measured, time.perf_counter() - t0))
            if stop:
                break
        train_s = time.perf_counter() - t0
        if best["params"] is not None:  # the best head measured, not the last
            with torch.no_grad():
                for p, b in zip(self.params, best["params"]):
                    p.copy_(b)
            measured = best["measured"]
        measured = measured or self.measure(held, list(range(len(heldout))))
        on_train = self.measure(train, greedy_train)
        peak = int(torch.cuda.max_memory_allocated()) if on_gpu else None
        self.progress(TrainProgress("saving", 0, 1))
        result = TrainResult(out, steps_run, str(self.tb.device), len(texts), sum(map(len, texts)), generate_s, train_s,
                             peak, measured, on_train)
        a = self.args
        tensors = self.hb.unfuse()
        if self.vocab is not None:
            tensors[f"blk.{a.num_hidden_layers}.nextn.draft_vocab"] = self.vocab
        write_head(out, tensors, dict(
            trunk_sha256=sha, trunk=self.ckpt.name, arch=self.ckpt.arch, hidden_size=a.hidden_size, vocab_size=a.vocab_size,
            num_hidden_layers=a.num_hidden_layers, config=dataclasses.asdict(cfg), device=result.device, texts=result.texts,
            tokens=result.tokens, generate_s=round(generate_s, 1), train_s=round(train_s, 1), peak_gpu_bytes=peak,
            heldout=measured, train=on_train, best_step=best["step"] or steps_run,
            draft_vocab=len(self.vocab) if self.vocab is not None else a.vocab_size))
        state_file.unlink(missing_ok=True)
        return result

    def _save_state(self, path: Path, opt, step: int, elapsed: float, sha: str, texts, heldout, best: dict) -> None:
        """The head's parameters, AdamW's moments, the generated texts and the best head measured
        so far (early stopping) (safetensors)."""
        import torch
        from safetensors.torch import save_file

        t = {f"param.{i}": p.detach().float().cpu() for i, p in enumerate(self.params)}
        if best["params"] is not None:
            t.update({f"best.{i}": p.float().cpu() for i, p in enumerate(best["params"])})
        for i, p in enumerate(self.params):
            st = opt.state.get(p)
            if st:
                t[f"adam.{i}.exp_avg"], t[f"adam.{i}.exp_avg_sq"] = st["exp_avg"].cpu(), st["exp_avg_sq"].cpu()
        for name, group in (("train", texts), ("heldout", heldout)):
            L = max(map(len, group))
            arr = torch.full((len(group), L), -1, dtype=torch.int32)
            for j, ids in enumerate(group):
                arr[j, :len(ids)] = torch.tensor(ids, dtype=torch.int32)
            t[f"texts.{name}"] = arr
        meta = {"step": str(step), "elapsed_s": repr(elapsed), "trunk_sha256": sha, "config": json.dumps(dataclasses.asdict(self.cfg)),
                "best": json.dumps({k: v for k, v in best.items() if k != "params"})}
        tmp = path.with_name(path.name + ".part")
        save_file(t, str(tmp), metadata=meta)
        tmp.replace(path)

    def _load_state(self, path: Path, opt, sha: str):
        import torch
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            t = {k: f.get_tensor(k) for k in f.keys()}
        if meta.get("trunk_sha256") != sha:
            raise TrainError(f"{path} is the state of a run for another model; remove it or train without --resume")
        saved = json.loads(meta["config"])
        if {k: saved.get(k) for k in ("depth",)} != {"depth": self.cfg.depth}:
            raise TrainError(f"{path} was trained with depth {saved.get('depth')}; resume with the same --depth")
        step = int(meta["step"])
        with torch.no_grad():
            for i, p in enumerate(self.params):
                p.copy_(t[f"param.{i}"])
                if f"adam.{i}.exp_avg" in t:
                    opt.state[p] = {"step": torch.tensor(float(step)), "exp_avg": t[f"adam.{i}.exp_avg"].to(p.device),
                                    "exp_avg_sq": t[f"adam.{i}.exp_avg_sq"].to(p.device)}
        texts = [[int(v) for v in row if v >= 0] for row in t["texts.train"].tolist()]
        heldout = [[int(v) for v in row if v >= 0] for row in t["texts.heldout"].tolist()]
        best = json.loads(meta["best"]) if "best" in meta else None
        if best is not None:
            n = len(self.params)
            best["params"] = ([t[f"best.{i}"].to(p.device, p.dtype) for i, p in enumerate(self.params)]
                              if f"best.{n - 1}" in t else None)
        return texts, heldout, step, float(meta.get("elapsed_s", 0.0)), best


def train_draft(ckpt, out: Path | None = None, config: TrainConfig | None = None, device: str | None = None,
                resume: bool = False, progress=None, cancel=None) -> TrainResult:
    """Train a head for ``ckpt`` and save it to ``out`` (default: beside the model, where loading
    finds it: loaders.draft_head.head_path)."""
    from .loaders.draft_head import head_path

    out = Path(out) if out else head_path(ckpt.path)
    return DraftTrainer(ckpt, config, device, progress, cancel).run(out, resume)


def train_model(spec: str, progress=None, cancel=None) -> Path:
    """The model manager's entry: train a head with the defaults for the model ``spec`` (a path
    or anything model_store resolves) and return the head's path."""
    from .loaders import load_checkpoint
    from .model_store import resolve_model

    import_torch()  # before reading the model: say at once what is missing
    ckpt = load_checkpoint(resolve_model(spec))
    return train_draft(ckpt, progress=progress, cancel=cancel, resume=True).path


def console_progress(stream=None) -> Callable[[TrainProgress], None]:
    """A progress line on stderr: redrawn in place on a terminal, every 10 s elsewhere."""
    out = stream or sys.stderr
    tty = out.isatty()
    last = {"stage": None, "t": 0.0}

    def report(p: TrainProgress) -> None:
        now = time.monotonic()
        new_stage = p.stage != last["stage"]
        if tty:
            out.write(("\n" if new_stage and last["stage"] else "\r") + p.text()[:160] + "\x1b[K")
        elif new_stage or now - last["t"] > 10 or p.done == p.total:
            out.write(p.text() + "\n")
            last["t"] = now
        last["stage"] = p.stage
        out.flush()

    return report


def build_parser() -> argparse.ArgumentParser:
    from .options import MODEL_HELP, add_device_arg, add_model_arg, parser

    c = TrainConfig()
    p = parser("bw24chat train-draft", __doc__)
    add_model_arg(p, help=MODEL_HELP + " (default: 'default')")
    add_device_arg(p, help="where PyTorch trains: auto is cuda when torch sees a GPU, else cpu")
    p.add_argument("--steps", type=int, default=c.steps, help="training steps")
    p.add_argument("--out", metavar="FILE", help="where to save the head (default: beside the model, NAME.draft-head."
                                                 "safetensors; in a model folder, draft-head.safetensors: found there "
                                                 "when the model loads)")
    p.add_argument("--resume", action="store_true", help="continue the run whose state is in FILE.resume")
    p.add_argument("--depth", type=int, default=c.depth, help="chained drafts trained per row")
    p.add_argument("--batch", type=int, default=c.batch, help="texts per step")
    p.add_argument("--lr", type=float, default=c.lr, help="peak learning rate (AdamW)")
    p.add_argument("--gen-tokens", type=int, default=c.gen_tokens, help="continuation tokens the model writes per prompt")
    p.add_argument("--samples", type=int, default=c.samples,
                   help="continuations per training prompt (the first greedy, the others sampled)")
    p.add_argument("--draft-vocab", type=int, default=c.draft_vocab,
                   help="tokens the head drafts over, the most frequent in its training texts (0: all)")
    p.add_argument("--patience", type=int, default=c.patience,
                   help="held-out measurements without improvement before training stops early")
    p.add_argument("--seed", type=int, default=c.seed, help="seed of the sampled texts and the batches")
    return p


def main(argv: list[str]) -> int:
    from .console import print_downloads
    from .model_store import open_checkpoint

    a = build_parser().parse_args(argv)
    for flag, v in (("--steps", a.steps), ("--depth", a.depth), ("--batch", a.batch), ("--gen-tokens", a.gen_tokens),
                    ("--samples", a.samples), ("--patience", a.patience)):
        if v < 1:
            sys.stderr.write(f"bw24chat train-draft: {flag} {v}: expected 1 or more\n")
            return 2
    if a.draft_vocab < 0:
        sys.stderr.write(f"bw24chat train-draft: --draft-vocab {a.draft_vocab}: expected 0 or more\n")
        return 2
    cfg = TrainConfig(steps=a.steps, depth=a.depth, batch=a.batch, lr=a.lr, gen_tokens=a.gen_tokens, samples=a.samples,
                      seed=a.seed, draft_vocab=a.draft_vocab, patience=a.patience)
    try:
        import_torch()
        ckpt = open_checkpoint(a.model or "default", print_downloads("bw24chat train-draft"))
        res = train_draft(ckpt, a.out, cfg, None if a.device == "auto" else a.device, a.resume, console_progress())
    except TrainError as exc:
        sys.stderr.write(f"bw24chat train-draft: {exc}\n")
        return 2
    except (TrainCancelled, KeyboardInterrupt) as exc:
        sys.stderr.write(f"\nbw24chat train-draft: {exc or 'interrupted'}\n")
        return 130
    sys.stderr.write("\n")
    peak = f"{res.peak_gpu_bytes / 2**30:.2f} GiB peak GPU memory" if res.peak_gpu_bytes is not None else "on the CPU"
    print(f"saved {res.path}")
    print(f"{res.texts} training texts ({res.tokens} tokens) generated in {res.generate_s:.1f}s; {res.steps} steps in "
          f"{res.train_s:.1f}s on {res.device}, {peak}")
    for name, m in (("held-out", res.heldout), ("training", res.train)):
        print(f"{name:9} texts: accepted length {m['mean_len']:.2f} per round at K={len(m['accept'])}, acceptance per "
              f"draft {' '.join(f'{100 * x:.0f}%' for x in m['accept'])} (greedy)")
    print(f"use it: bw24chat -m {ckpt.path} --spec mtp")
    return 0
