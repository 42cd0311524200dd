"""``bw24chat check``: every CUDA kernel against its NumPy reference on fresh random inputs, then
the exactness gates on a model for every weight format x KV-cache type:

  prefill-vs-decode   argmax of the tensor-core prefill logits = argmax of the decode path at
                      every position of a 512-token prompt, except near-ties (top-2 margin
                      under 1e-3 or under twice the paths' 99th-percentile row difference,
                      counted and reported), and their rel L2 difference bounded
  chunk-invariance    prefill logits bit-identical for chunk sizes 256 and 512
  graph-vs-eager      graph decode = eager decode, token for token (greedy, 32 tokens)
  seed                the same seed twice = the same sampled tokens
  graph-launches      no kernel launched from Python during graph decode steps
  spilled = resident  (MoE models) experts spilled to VRAM slots / pinned host / the model's
                      tensors give the all-resident run's prefill logits, tokens and m-row
                      step logits bit for bit

``--spec`` runs only the speculative-decoding gate (spec_gates), on either backend
(``--device cpu`` for the NumPy one): for K = auto, 1..8, the n-gram, the oracle and the MTP-head
drafter (the gate's model carries a random NextN head), greedy and seeded sampling and nine
prompts, the output equals plain decoding's token for token; also for a hybrid model (gated
DeltaNet layers, whose recurrent state each verify checkpoints; gated attention; an MTP head);
with ``-m`` on that model, its MTP head (shipped, or trained by ``bw24chat train-draft``) as the third.

``--batch`` runs only the batch-invariance gate (batch_gates): B = 1, 2, 8, 32 sequences of
different lengths decoded together through the continuous-batching scheduler (budget-sized
prefill chunks beside decode rows, the paged KV pool), greedy and seeded, prefix sharing on and
off, each sequence's tokens and the logits of every token bit-identical to its solo run (prefill,
then one-row steps, on a fresh runner); then the same with a pool small enough to preempt, and
with n-gram speculation inside the batch.  On the NumPy backend (``--device cpu``) and on CUDA
(backends/cuda_batch.py: the paged pool, every ``--kv-cache`` type).

``--gpus N|IDS`` runs the model gates (and ``--spec``'s) on the model split over those GPUs
(backends/cuda_sharded.py; a world of one GPU included: every exchange made through a one-rank
communicator), and split_gates: the same tokens and logits run to run, and against one GPU the
first divergent greedy position of 8 prompts (splitting a row's sums changes their order).

Gates run on the engine's default float32 activations; ``--activations f32,bf16`` also runs the
opt-in bf16-activation contract (every matmul input rounded to bf16 on both paths), whose
from-scratch prefill-vs-decode row shows a few argmax flips at margins of 1e-3..1e-2 on random
models (a bf16 rounding boundary crossed by the paths' ~1e-7 differences, amplified).
Prints a table; exits non-zero on any failure.  ``BW24CHAT_PORTABLE=1`` (or --portable) runs
everything on the portable kernels (mma.sync, no wgmma/TMA), as sm_120a would.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, replace

import numpy as np

from .api import SamplingParams
from .synthetic import FORMATS
from .speculative import MAX_K

DEFAULT_FORMATS = ",".join(FORMATS)
DEFAULT_KV = "bf16,q8_0,fp8,f32"
NO_GPU_HINT = "the CUDA kernels and the GPU gates need an NVIDIA GPU with CuPy: pip install 'bw24chat[cuda13]' (or [cuda12])"


@dataclass
class Result:
    section: str
    name: str
    value: str
    limit: str
    ok: bool


def _greedy(runner, prompt, n, use_graph: bool, sp=None, seed=0):
    if hasattr(runner, "graphs"):  # CUDA: start from a fresh capture (or none)
        runner.use_graph = use_graph
        runner.graphs.clear()
    sp = sp or SamplingParams(temperature=0)
    hist = list(int(t) for t in prompt)
    tok = runner.prefill(prompt, 0, sp, seed)
    out = [tok]
    for i in range(n - 1):
        tok = runner.step([tok], len(hist), sp, seed, hist)[0]
        hist.append(out[-1])
        out.append(tok)
    return out


def model_gates(runner, label: str, n_prompt: int = 512, n_gen: int = 32) -> list[Result]:
    from .backends.kernel_build import LaunchCounter

    res = []
    rng = np.random.default_rng()
    V = runner.args.vocab_size
    prompt = rng.integers(0, V, n_prompt)
    # chunk invariance
    a = runner.prefill_logits(prompt, 0, chunk=512)
    b = runner.prefill_logits(prompt, 0, chunk=256)
    nbad = int(np.count_nonzero(a.view(np.uint32) != b.view(np.uint32)))
    res.append(Result(label, "prefill chunk 256 vs 512", f"{nbad} bits differ", "0", nbad == 0 and np.isfinite(a).all()))
    # prefill argmax vs decode argmax, position by position (decode path: matvec kernels, graph)
    runner.use_graph = True
    runner.graphs.clear()
    dec = np.empty_like(a)
    for i, t in enumerate(prompt):
        dec[i] = runner.decode_logits(int(t), i)
    top2 = np.sort(a, axis=1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    # A near-tie: a top-2 margin under 1e-3, or under twice the paths' typical difference (the
    # 99th percentile over positions of a row's largest |prefill - decode|): the two paths differ
    # by rounding (GEMM vs matvec order, activation codes at a rounding boundary, the cache's
    # rounding of K / V compounding over 512 positions), so an order flip inside that band is a
    # tie, not a bug.  A bug on a few positions stands out of the percentile; one on many, out
    # of the rel L2 limit.
    noise = 2 * float(np.quantile(np.abs(a - dec).max(axis=1), 0.99))
    tie = max(1e-3, noise)
    near = margin < tie
    mism = (np.argmax(a, 1) != np.argmax(dec, 1)) & ~near
    rel = float(np.linalg.norm(a - dec) / np.linalg.norm(dec))
    # a MoE router is discontinuous: a rounding-level difference at a near-tie of its top-k picks
    # another expert for that row, moving its logits by far more than the band above; one such row
    # per 256 positions is allowed (the "decode step over prefill cache" row stays exact)
    allowed = len(prompt) // 256 if getattr(runner.args, "num_experts", 0) else 0
    # a gross error shows as rel L2 ~1; MoE routers turn tiny differences into another expert on a
    # few rows (GLM-4.5's sigmoid groups over a rounding cache: 1.3e-2), hence the loose bound; and
    # a flip early in the prompt moves the K / V that every later position attends to (tiny-moe
    # Q8_0 on an H100: 2.6e-4 to 5.3e-2 over four random prompts), hence MoE's looser one
    rel_limit = (1e-2 if runner.kv_type == "f32" else 5e-2) * (2 if allowed else 1)
    # how close the mismatches were: the prefill's top-2 margin at each (a few)
    margins = "".join(f", margin {m:.1e} at {i}" for i, m in zip(np.flatnonzero(mism)[:3], margin[mism][:3]))
    res.append(Result(label, "prefill argmax = decode argmax",
                      f"{int(mism.sum())} mismatches, {int(near.sum())} near-ties (< {tie:.1e}), rel L2 {rel:.1e}{margins}",
                      f"{allowed}, rel L2 <= {rel_limit:.0e}", int(mism.sum()) <= allowed and rel <= rel_limit))
    # The same comparison for ONE decode step over the prefill's own cache (32 positions): what
    # the engine does after every prompt.  With a rounding KV cache (bf16 / q8_0 / fp8) the
    # from-scratch comparison above also measures how the cache's rounding of slightly
    # different K/V values (prefill GEMM vs decode matvec, ~1e-6 apart) compounds over 512
    # positions; this one isolates the arithmetic of the two paths.
    if runner.kv_type != "f32":
        idx = np.linspace(1, len(prompt) - 1, 32).astype(int)
        step = np.empty((len(idx), a.shape[1]), np.float32)
        for j, i in enumerate(idx):
            runner.prefill(prompt[:i], 0)
            step[j] = runner.decode_logits(int(prompt[i]), int(i))
        ref = a[idx]
        near1 = near[idx]
        mism1 = (np.argmax(ref, 1) != np.argmax(step, 1)) & ~near1
        rel1 = float(np.linalg.norm(ref - step) / np.linalg.norm(step))
        res.append(Result(label, "decode step over prefill cache (32)", f"{int(mism1.sum())} mismatches, rel L2 {rel1:.1e}",
                          "0 (ties < 1e-3 excluded)", int(mism1.sum()) == 0))
    # graph vs eager
    short = prompt[:64]
    g = _greedy(runner, short, n_gen, True)
    e = _greedy(runner, short, n_gen, False)
    res.append(Result(label, "graph decode = eager decode", f"{sum(x != y for x, y in zip(g, e))} of {n_gen} differ", "0", g == e))
    # seed reproducibility
    sp = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, repeat_penalty=1.1)
    s1 = _greedy(runner, short, n_gen, True, sp, seed=1234)
    s2 = _greedy(runner, short, n_gen, True, sp, seed=1234)
    s3 = _greedy(runner, short, n_gen, True, sp, seed=4321)
    res.append(Result(label, "same seed = same tokens", "equal" if s1 == s2 else "differ", "equal", s1 == s2 and s1 != s3))
    # no launches outside the graph during graph decode
    runner.use_graph = True
    _greedy(runner, short, 4, True)
    before = LaunchCounter.count
    pos = len(short) + 3  # the next position (a recurrent state has no gaps)
    tok = 1
    for i in range(16):
        tok = runner.step([tok], pos + i, SamplingParams(temperature=0), 0, [])[0]
    launched = LaunchCounter.count - before
    res.append(Result(label, "launches outside graph (16 steps)", str(launched), "0", launched == 0))
    return res


def spill_gate(ck, kv: str, label: str, n_prompt: int = 600, n_gen: int = 32) -> list[Result]:
    """MoE experts spilled from VRAM give the resident run's bits: a runner whose layers keep
    max(top_k, E/4) experts in VRAM slots, E/2 in pinned host RAM and the rest in the model's
    tensors (the file tier) against the all-resident runner: prefill logits (two chunks, the
    experts streamed through the staging slots), greedy and seeded decode (graph), and the
    logits of an 8-row step (passes of slots // top_k rows).  A model file (-m) is evicted from the
    page cache before the spilled runner loads, so its file tier reads storage."""
    import cupy as cp

    from .bench import drop_page_cache

    from .backends.cuda_runner import CudaRunner
    from .backends.expert_tiers import ExpertTiers, fixed_plan, layout_of

    lay = layout_of(ck)
    if lay is None:
        return []
    E, k = max(lay.n_experts), lay.top_k
    tiers = ExpertTiers(lay, fixed_plan(lay, max(k, E // 4), E // 2))
    rng = np.random.default_rng()
    prompt = rng.integers(0, ck.config["vocab_size"], n_prompt)
    sp = SamplingParams(temperature=0.9, top_p=0.95, top_k=50)
    out = {}
    for name, t in (("resident", None), ("spilled", tiers)):
        if t is not None and os.path.exists(str(getattr(ck, "path", None) or "")):  # a synthetic model has no file
            drop_page_cache(str(ck.path))
        r = CudaRunner(ck, 2048, kv, prefill_chunk=512, tiers=t)
        logits = r.prefill_logits(prompt, 0)
        greedy = _greedy(r, prompt[:64], n_gen, True)
        seeded = _greedy(r, prompt[:64], n_gen, True, sp, seed=77)
        r.prefill(prompt[:100], 0)
        r.step([int(x) for x in prompt[100:108]], 100, SamplingParams(temperature=0), 0, [])
        out[name] = (logits, greedy, seeded, r.last_logits(), r.expert_stats())
        del r
        cp.get_default_memory_pool().free_all_blocks()
    (a, g1, s1, v1, _), (b, g2, s2, v2, st) = out["resident"], out["spilled"]
    bits = lambda x, y: int(np.count_nonzero(x.view(np.uint32) != y.view(np.uint32)))  # noqa: E731
    hit = f"hits vram {st['expert_hit_vram']:.0%} host {st['expert_hit_host']:.0%} disk {st['expert_hit_disk']:.0%}"
    return [Result(label, "spilled = resident: prefill logits", f"{bits(a, b)} bits differ", "0", bits(a, b) == 0),
            Result(label, "spilled = resident: decode tokens", f"greedy {'equal' if g1 == g2 else 'differ'}, seeded "
                   f"{'equal' if s1 == s2 else 'differ'}; {hit}", "equal", g1 == g2 and s1 == s2),
            Result(label, "spilled = resident: 8-row step logits", f"{bits(v1, v2)} bits differ", "0", bits(v1, v2) == 0)]


# ----------------------------------------------------------------------------- speculative decoding
# The gate's model on the NumPy backend: small enough that the whole K x drafter x sampling table
# runs in about a minute on a loaded CPU (the GPU gate takes the synthetic "tiny" shape).
SPEC_SHAPE = dict(model_type="qwen3", hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, vocab_size=512, max_position_embeddings=4096,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
# The hybrid gate's model (NumPy backend): Qwen3.5's block, gated DeltaNet and gated attention layers
# alternating, and an MTP layer: the recurrent state's exact rollback under speculation, and --spec mtp
# (the full table takes a few minutes on a loaded CPU)
SPEC_HYBRID = dict(SPEC_SHAPE, model_type="qwen3_5", num_hidden_layers=4, full_attention_interval=2,
                   partial_rotary_factor=0.25, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
                   linear_value_head_dim=32, linear_conv_kernel_dim=4, num_nextn_predict_layers=1)
# the oracle's wrong drafts, by output index: singles, a pair, and a run longer than any K (each
# of its rounds accepts nothing and gets the true token as the bonus)
ORACLE_ERRORS = frozenset({2, 7, 8, 15, *range(36, 44), 60, 61, 90, 100, 127})
SPEC_SAMPLING = {"greedy": SamplingParams(temperature=0),
                 "sampled": SamplingParams(temperature=0.9, top_k=40, top_p=0.95, repeat_penalty=1.1)}


def word_tokenizer(vocab: int):
    """Token i is the word ``wi``: text and stop strings for a random-weight model."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from .tokenizer import TokenizerInfo

    tk = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return TokenizerInfo(tk)


@dataclass
class SpecCase:
    name: str
    prompt: list[int]
    max_tokens: int
    stop_at: int | None = None  # a stop string: the text of the free run's tokens i, i + 1
    eos_at: int | None = None  # a stop id: the free run's token i


def spec_cases(vocab: int, n_ctx: int, n_gen: int) -> list[SpecCase]:
    """Nine prompts: random, repeating, an edit (a paragraph, then its start again), tiny,
    max_tokens 1, a stop string and a stop id inside accepted runs, and two over 1k tokens, one
    of which reaches the end of the context mid-run."""
    rng = np.random.default_rng(33)
    r = lambda n: [int(t) for t in rng.integers(0, vocab, n)]  # noqa: E731
    para = r(80)
    return [
        SpecCase("random", r(24), n_gen),
        SpecCase("repeating", r(6) * 7, n_gen),
        SpecCase("edit", para + r(4) + para[:20], n_gen),
        SpecCase("3 tokens", r(3), n_gen),
        SpecCase("max_tokens 1", r(16), 1),
        SpecCase("stop string", r(40), n_gen, stop_at=n_gen // 3),
        SpecCase("eos", r(40), n_gen, eos_at=n_gen // 2),
        SpecCase("long", r(1030), n_gen),
        SpecCase("context end", r(n_ctx - n_gen // 2), n_gen),
    ]


class RecordingRunner:
    """A runner that logs each step's rows and each rollback: ("step", m) / ("rollback", n)."""

    def __init__(self, runner):
        self.runner, self.log = runner, []

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def step(self, tokens, *args):
        self.log.append(("step", len(tokens)))
        return self.runner.step(tokens, *args)

    def rollback(self, n: int) -> None:
        self.log.append(("rollback", n))
        self.runner.rollback(n)


def oracle_log(n_prompt: int, truth_len: int, n_out: int, k, max_tokens: int, n_ctx: int, errors) -> tuple[list, tuple]:
    """The steps and rollbacks the oracle must cause, worked out without the generator.  The
    prefill starts from an empty cache (rollback 0).  With c tokens out, a step feeds token c - 1
    at position n_prompt + c - 1 plus the drafts truth[c:c + n] (n capped as generate.py caps
    it); the drafts before the first error are accepted (a of them) and the cache keeps
    n_prompt + c + a positions; c grows by a + 1 (the bonus).  A step without drafts is a plain
    decode step (no rollback).  At the end the cache is cut to the prompt + the n_out tokens
    output, if it holds more (a stop inside an accepted run).  Also returns the (rounds, drafted,
    accepted) counts those steps make.  ``k``: K, or K per step (a list: an adaptive K's, 0 for a
    plain step)."""
    log, c, cached, counts = [("rollback", 0)], 1, n_prompt, [0, 0, 0]
    per_step = list(k) if not isinstance(k, int) else None
    while c < truth_len:
        if per_step is not None:
            k = per_step.pop(0) if per_step else 0
        n = min(k, max_tokens - c - 1, n_ctx - n_prompt - c - 1, truth_len - c)
        if n <= 0:
            log.append(("step", 1))
            c, cached = c + 1, n_prompt + c
            continue
        a = next((i for i in range(n) if c + i in errors), n)
        cached = n_prompt + c + a
        log += [("step", n + 1), ("rollback", cached)]
        counts = [counts[0] + 1, counts[1] + n, counts[2] + a]
        c += a + 1
    return log + [("rollback", min(cached, n_prompt + n_out))], tuple(counts)


def _generate(runner, tok, case: SpecCase, sp, stop: list[str], stop_ids: set, drafter=None, k: int = 0):
    """One generation from an empty cache, then a probe step at the last position that plain and
    speculative runs both hold: its logits' bits show the KV cache the run left (rollbacks)."""
    from dataclasses import replace

    from .generate import Generator

    rec = RecordingRunner(runner)
    res = Generator(rec, replace(tok, stop_ids=stop_ids)).generate(
        case.prompt, replace(sp, max_tokens=case.max_tokens, stop=stop, seed=7), drafter=drafter, spec_k=k)
    runner.step([1], len(case.prompt) + len(res.token_ids) - 1, SamplingParams(temperature=0), 0, [])
    return res, rec.log, runner.last_logits()[0].copy()


def _first_difference(a: list, b: list) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def spec_gates(runner, tok, ks=range(MAX_K + 1), n_gen: int = 48, label: str = "spec") -> list[Result]:
    """For every case, sampling mode, drafter (n-gram, oracle, and the MTP head where the runner
    has one: a random head drafts almost nothing that is accepted, so its rows check the head's
    pairing and that its drafts never change the output) and K (0: adaptive, whose K changes
    from round to round): the output (tokens, text, finish reason) equals plain decoding's, else
    the first divergent position is reported; the cache the run leaves gives the same probe
    logits; the oracle's runs step and roll back exactly as oracle_log says (the accepted length
    of every round; for the adaptive K, at the K of each of its steps)."""
    from .speculative import MTPDrafter, NgramDrafter, OracleDrafter

    V = runner.vocab_size
    drafters = ("ngram", "oracle") + (("mtp",) if getattr(runner, "mtp", None) is not None else ())
    table: dict[tuple, list] = {}  # (drafter, sampling, K) -> [failures, [rounds, drafted, accepted], runs]
    for case in spec_cases(V, runner.n_ctx, n_gen):
        for mode, sp in SPEC_SAMPLING.items():
            stop, stop_ids = [], set(tok.stop_ids)
            if case.stop_at is not None or case.eos_at is not None:  # a stop that falls inside the output
                free = _generate(runner, tok, case, sp, stop, stop_ids)[0].token_ids
                if case.stop_at is not None:
                    stop = [tok.decode(free[case.stop_at:case.stop_at + 2])]
                else:
                    stop_ids = {free[case.eos_at]}
            plain, _, probe = _generate(runner, tok, case, sp, stop, stop_ids)
            # the oracle's truth: the output, and the stop id that ended it (the step that drew it)
            by_id = case.eos_at is not None and plain.finish_reason == "stop"
            truth = plain.token_ids + ([free[case.eos_at]] if by_id else [])
            for k in ks:
                for name in drafters:
                    drafter = {"ngram": NgramDrafter, "mtp": lambda: MTPDrafter(runner),
                               "oracle": lambda: OracleDrafter(truth, ORACLE_ERRORS, V)}[name]()
                    res, log, probe2 = _generate(runner, tok, case, sp, stop, stop_ids, drafter, k)
                    row = table.setdefault((name, mode, k), [[], [0, 0, 0], 0])
                    row[2] += 1
                    for i, key in enumerate(("spec_rounds", "spec_drafted", "spec_accepted")):
                        row[1][i] += res.stats.get(key, 0)
                    bad = None
                    if (res.token_ids, res.text, res.finish_reason) != (plain.token_ids, plain.text, plain.finish_reason):
                        bad = (f"diverges at token {_first_difference(res.token_ids, plain.token_ids)} "
                               f"({res.finish_reason} vs {plain.finish_reason})")
                    elif not np.array_equal(probe.view(np.uint32), probe2.view(np.uint32)):
                        bad = "the cache it left differs (probe logits)"
                    elif name == "oracle":
                        ks_run = [m - 1 for kind, m in log if kind == "step"] if k == 0 else k
                        want = oracle_log(len(case.prompt), len(truth), len(plain.token_ids), ks_run, case.max_tokens,
                                          runner.n_ctx, ORACLE_ERRORS)[0]
                        if log != want:
                            i = _first_difference(log, want)
                            bad = f"event {i}: {log[i:i + 2]} != {want[i:i + 2]}"
                    if bad:
                        row[0].append(f"{case.name}/{mode}: {bad}")
    out = []
    for (name, mode, k), (fails, (rounds, drafted, accepted), runs) in table.items():
        value = (f"{runs - len(fails)}/{runs} identical, acc {100 * accepted / max(drafted, 1):3.0f}%, "
                 f"len {1 + accepted / max(rounds, 1):.2f}" + (f"; {fails[0]}" if fails else ""))
        out.append(Result(label, f"{name:6} {mode:7} K={k or 'auto'}", value, "= plain" + (" + rounds" if name == "oracle" else ""),
                          not fails))
    return out


def spec_runner(device: str = "cpu", n_ctx: int = 1280, model: str | None = None, draft_head: str | None = None,
                hybrid: bool = False, gpus: tuple = ()):
    """The gate's runner, tokenizer and a name for the backend: ``model`` with its MTP head (shipped
    or trained: loaders/draft_head.py), else SPEC_SHAPE (``hybrid``: SPEC_HYBRID) on the NumPy backend
    and the synthetic "tiny" shape (``hybrid``: "tiny-qwen3.5") on CUDA (what the other CUDA gates run),
    each with a random MTP head (its trunk's weights are the same as without).  ``gpus``: the model
    split over those GPUs (cuda_sharded.py, which loads no MTP head: n-gram and oracle drafters)."""
    from .backends import pick_device
    from .synthetic import synthetic_checkpoint

    def cuda_runner(ck):
        if gpus:
            from .backends.cuda_sharded import ShardedCudaRunner

            return ShardedCudaRunner(ck, gpus, n_ctx, "bf16", prefill_chunk=512)
        from .backends.cuda_runner import CudaRunner

        return CudaRunner(ck, n_ctx, "bf16", prefill_chunk=512)

    if model:
        from dataclasses import replace

        from .console import print_downloads
        from .loaders import load_checkpoint
        from .model_store import resolve_model

        ck = load_checkpoint(resolve_model(model, print_downloads("bw24chat check")), draft_head)
        head = f", MTP head {ck.draft_head.name}" if ck.draft_head else ", shipped MTP head" if ck.mtp else ""
        tok = replace(ck.tokenizer, stop_ids=set())  # only the cases' own stops end a run (as word_tokenizer)
        if pick_device(device)[0] == "cpu":
            from .backends.numpy_backend import numpy_runner

            return numpy_runner(ck, n_ctx), tok, f"NumPy, {ck.name}{head}"
        return cuda_runner(ck), tok, f"CUDA{_on_gpus(gpus)}, {ck.name}{head}"
    if pick_device(device)[0] == "cpu":
        from .backends.numpy_backend import numpy_runner

        shape = SPEC_HYBRID if hybrid else SPEC_SHAPE
        return numpy_runner(synthetic_checkpoint(shape, "Q8_0", mtp=True), n_ctx), word_tokenizer(shape["vocab_size"]), "NumPy"
    runner = cuda_runner(synthetic_checkpoint("tiny-qwen3.5" if hybrid else "tiny", "BF16", mtp=True))
    dev = runner.cp.cuda.runtime.getDeviceProperties(runner.cp.cuda.Device().id)["name"].decode()
    return runner, word_tokenizer(runner.vocab_size), f"CUDA{_on_gpus(gpus)}, {dev}"


def _on_gpus(gpus: tuple) -> str:
    return f" split over GPUs {','.join(map(str, gpus))}" if gpus else ""


def split_gates(ck, gpus: tuple, label: str, kv: str = "bf16", n: int = 8, n_gen: int = 32) -> list[Result]:
    """The model split over ``gpus`` (cuda_sharded.py) against itself and against one GPU: greedy
    tokens and prefill logits the same bits run to run (the exchanges sum in a fixed rank order:
    numpy_sharded.reduce_ranks); against one GPU, splitting a row's sums changes their order, so
    the first divergent greedy position of each of ``n`` prompts is reported (a world of one GPU
    must not diverge at all) and the prefill logits' rel L2 is bounded (an MoE router turns a
    rounding difference at a near-tie of its top-k into another expert for that row: model_gates'
    looser bound)."""
    import cupy as cp

    from .backends.cuda_runner import CudaRunner
    from .backends.cuda_sharded import ShardedCudaRunner

    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, ck.config["vocab_size"], int(rng.integers(20, 300))) for _ in range(n)]
    greedy = SamplingParams(temperature=0)

    def run(r):
        out = []
        for p in prompts:
            seq = [r.prefill(p, 0, greedy)]
            for i in range(n_gen - 1):
                seq += r.step([seq[-1]], len(p) + i, greedy, 0, [])
            out.append((seq, r.prefill_logits(p, 0)))
        return out

    split = ShardedCudaRunner(ck, gpus, 1024, kv, prefill_chunk=128)
    first, again = run(split), run(split)
    split.close()
    del split
    with cp.cuda.Device(gpus[0]):
        one = run(CudaRunner(ck, 1024, kv, prefill_chunk=128))
    same = all(s1 == s2 and np.array_equal(l1.view(np.uint32), l2.view(np.uint32)) for (s1, l1), (s2, l2) in zip(first, again))
    diverge = [_first_difference(s1, s2) for (s1, _), (s2, _) in zip(first, one)]
    rel = max(float(np.linalg.norm(l1 - l2) / np.linalg.norm(l2)) for (_, l1), (_, l2) in zip(first, one))
    where = ", ".join("-" if d == n_gen else str(d) for d in diverge)
    limit = 2e-2 if ck.config.get("num_experts") or any(t.endswith("_exps") for t in ck.tensors) else 1e-3
    return [Result(label, f"split over {len(gpus)}: run to run", "same bits" if same else "differ", "same bits", same),
            Result(label, "split vs one GPU: first divergence", f"[{where}] of {n_gen} tokens, prefill rel L2 {rel:.1e}",
                   "none with one GPU" if len(gpus) == 1 else f"reported, rel L2 <= {limit:.0e}",
                   rel <= limit and (len(gpus) > 1 or all(d == n_gen for d in diverge)))]


# ----------------------------------------------------------------------------- batch invariance
BATCH_SIZES = (1, 2, 8, 32)


def batch_prompts(n: int, vocab: int, seed: int = 37, system_len: int = 48) -> list[list[int]]:
    """n prompts of 1..system_len + 32 tokens; two in three start with the same system prompt of
    ``system_len`` tokens (the gate takes three KV blocks, so that prefix sharing has whole blocks
    to share whatever the runner's block size)."""
    rng = np.random.default_rng(seed)
    system = [int(t) for t in rng.integers(0, vocab, system_len)]
    return [(system if i % 3 else []) + [int(t) for t in rng.integers(0, vocab, int(rng.integers(1, 33)))]
            for i in range(n)]


def solo_run(make_runner, prompt: list[int], sp: SamplingParams, seed: int, n_gen: int) -> tuple[list[int], list[np.ndarray]]:
    """A sequence alone on a fresh runner: its prompt prefilled, then one-row steps; the tokens
    and the logits each was sampled from."""
    runner = make_runner()
    tok = runner.prefill(np.asarray(prompt), 0, sp, seed, [])
    out, logits, hist = [tok], [runner.last_logits()[-1].copy()], list(prompt)
    while len(out) < n_gen:
        tok = runner.step([out[-1]], len(hist), sp, seed, hist)[0]
        hist.append(out[-1])
        out.append(tok)
        logits.append(runner.last_logits()[0].copy())
    return out, logits


def batch_run(make_runner, tok, prompts, sp: SamplingParams, seeds, n_gen: int, share: bool, n_blocks: int = 0,
              step_tokens: int = 64, drafters=None):
    """The prompts decoded together by the scheduler: per sequence (tokens, the logits of each),
    the scheduler and its sequences (for their figures)."""
    from .generate import Output
    from .scheduler import Scheduler, Sequence

    class Recording(Output):
        def feed(self, t, logits):
            self.rows.append(np.array(logits()))
            return super().feed(t, logits)

    runner = make_runner()
    sched = Scheduler(runner, n_blocks or 64 * len(prompts) + 64, share, step_tokens)
    seqs = []
    for i, p in enumerate(prompts):
        spi = replace(sp, seed=seeds[i], max_tokens=n_gen)
        out = Recording(tok, spi, len(p), runner.n_ctx)
        out.rows = []
        seq = Sequence(list(p), spi, out, drafter=drafters[i] if drafters else None)
        sched.add(seq)
        seqs.append(seq)
    while not sched.idle():
        sched.step()
    return [(s.out.ids, s.out.rows) for s in seqs], sched, seqs


def _same(a: tuple[list[int], list[np.ndarray]], b: tuple[list[int], list[np.ndarray]]) -> bool:
    return a[0] == b[0] and len(a[1]) == len(b[1]) and all(np.array_equal(x.view(np.uint32), y.view(np.uint32))
                                                          for x, y in zip(a[1], b[1]))


def batch_gates(make_runner, tok, sizes=BATCH_SIZES, n_gen: int = 24, label: str = "batch") -> list[Result]:
    """Every sequence decoded in a batch = its solo run (tokens and the logits bits of every
    token), for each batch size, greedy and seeded, prefix sharing on and off; then a pool of one
    context (preemption and recompute) and n-gram speculation inside the batch."""
    from .backends.runner import max_batch
    from .speculative import NgramDrafter

    probe = make_runner()
    if max_batch(probe) < max(sizes):
        return [Result(label, "batched step", f"{type(probe).__name__} takes {max_batch(probe)} sequence(s) a step",
                       f">= {max(sizes)}", False)]
    V = probe.vocab_size
    prompts = batch_prompts(max(sizes), V, system_len=3 * probe.block_size)
    del probe
    seeds = [1000 + 17 * i for i in range(len(prompts))]
    out = []
    for mode, sp in SPEC_SAMPLING.items():
        solo = [solo_run(make_runner, p, sp, seeds[i], n_gen) for i, p in enumerate(prompts)]
        for b in sizes:
            for share in (True, False):
                got, sched, _ = batch_run(make_runner, tok, prompts[:b], sp, seeds, n_gen, share)
                same = sum(_same(g, s) for g, s in zip(got, solo))
                st = sched.stats()
                out.append(Result(label, f"B={b:<2} {mode:7} sharing {'on ' if share else 'off'}",
                                  f"{same}/{b} identical, {st['batch_steps']} steps, prefix hits "
                                  f"{st['prefix_hit_tokens']} tokens", "= solo (tokens + logits bits)", same == b))
        b, long = 8, 4 * n_gen  # long generations outgrow a pool of one context
        solo_long = [solo_run(make_runner, p, sp, seeds[i], long) for i, p in enumerate(prompts[:b])]
        got, sched, _ = batch_run(make_runner, tok, prompts[:b], sp, seeds, long, True, n_blocks=1, step_tokens=32)
        same = sum(_same(g, s) for g, s in zip(got, solo_long))
        pre = sched.stats()["batch_preemptions"]
        out.append(Result(label, f"B={b:<2} {mode:7} pool of one context", f"{same}/{b} identical, {pre} preemptions",
                          "= solo, preemptions > 0", same == b and pre > 0))
        got, _, seqs = batch_run(make_runner, tok, prompts[:b], sp, seeds, n_gen, True,
                                 drafters=[NgramDrafter() for _ in range(b)])
        same = sum(_same(g, s) for g, s in zip(got, solo))
        drafted, accepted = sum(s.spec.drafted for s in seqs), sum(s.spec.accepted for s in seqs)
        out.append(Result(label, f"B={b:<2} {mode:7} n-gram drafts", f"{same}/{b} identical, {accepted}/{drafted} "
                          "drafts accepted", "= solo", same == b))
    return out


def batch_runner(device: str = "cpu", shape: str = "tiny", fmt: str = "Q8_0", n_ctx: int = 512, kv: str = "bf16"):
    """The gate's runner factory, tokenizer and a name for the backend: a random-weight model of
    ``shape`` (CUDA: KV cache ``kv``)."""
    from .backends import pick_device
    from .synthetic import SHAPES, synthetic_checkpoint

    ck = synthetic_checkpoint(shape, fmt)
    tok = word_tokenizer(SHAPES[shape]["vocab_size"])
    if pick_device(device)[0] == "cpu":
        from .backends.numpy_backend import NumpyBackend, NumpyRunner
        from .models import build_model

        model = build_model(ck, NumpyBackend(), n_ctx)
        return lambda: NumpyRunner(model, NumpyBackend()), tok, f"NumPy, {shape}/{fmt.lower()}"
    from .backends.cuda_runner import CudaRunner

    return lambda: CudaRunner(ck, n_ctx, kv, prefill_chunk=512), tok, f"CUDA, {shape}/{fmt.lower()}/kv={kv}"


def spec_fixed(runner, tok, k: int = 4, n: int = 128) -> tuple[tuple[int, int, int], str, str]:
    """One fixed configuration: the oracle at K = 4, greedy, the "random" prompt, 128 tokens.
    Returns the (rounds, drafted, accepted) counts, the sha256 of the 128 tokens (int32
    little-endian) and that of plain decoding's."""
    import hashlib
    from dataclasses import replace

    from .speculative import OracleDrafter

    case = replace(spec_cases(runner.vocab_size, runner.n_ctx, n)[0], max_tokens=n)
    sha = lambda ids: hashlib.sha256(np.asarray(ids, "<i4").tobytes()).hexdigest()  # noqa: E731
    sp = SPEC_SAMPLING["greedy"]
    plain = _generate(runner, tok, case, sp, [], set(tok.stop_ids))[0]
    res = _generate(runner, tok, case, sp, [], set(tok.stop_ids), OracleDrafter(plain.token_ids, ORACLE_ERRORS, runner.vocab_size), k)[0]
    counts = tuple(res.stats[key] for key in ("spec_rounds", "spec_drafted", "spec_accepted"))
    return counts, sha(res.token_ids), sha(plain.token_ids)


def spec_fixed_gate(runner, tok, label: str = "spec") -> Result:
    """The fixed configuration's counts against oracle_log's, its tokens' sha256 against plain's."""
    counts, got, want = spec_fixed(runner, tok)
    n_prompt = len(spec_cases(runner.vocab_size, runner.n_ctx, 128)[0].prompt)
    expect = oracle_log(n_prompt, 128, 128, 4, 128, runner.n_ctx, ORACLE_ERRORS)[1]
    return Result(label, "fixed: oracle K=4 greedy 128 tokens", f"(rounds, drafted, accepted) {counts}, sha256 {got[:16]}",
                  f"{expect}, plain's {want[:16]}", counts == expect and got == want)


def kernel_checks() -> list[Result]:
    from . import kernel_checks as kc

    return [Result("kernels", name, value, limit, ok) for name, value, limit, ok in kc.run_all()]


def numpy_checks(formats: list[str], shape: str, n_prompt: int = 96, n_gen: int = 16) -> list[Result]:
    """What runs without a GPU: the NumPy dequantization of every format against gguf's own
    (bit for bit), and on a random-weight model per format the NumPy backend's prefill argmax
    against its decode argmax at every position, and seed reproducibility."""
    from gguf import quants as gq
    from gguf.constants import GGMLQuantizationType as T

    from . import quants
    from .backends.numpy_backend import numpy_runner
    from .synthetic import synthetic_checkpoint

    res = []
    rng = np.random.default_rng()
    for qtype in sorted(t for t in quants.SUPPORTED if t != T.F32):
        raw = rng.integers(0, 256, size=(7, 5 * quants.block_info(qtype)[1]), dtype=np.uint8)
        with np.errstate(all="ignore"):  # random bytes make NaN / inf scales too
            ours, theirs = quants.dequantize(raw, qtype), gq.dequantize(raw, qtype).astype(np.float32)
        bad = int(np.count_nonzero(ours.view(np.uint32) != theirs.view(np.uint32)))
        res.append(Result("numpy", f"dequantize {T(qtype).name} = gguf.quants", f"{bad} bit mismatches", "0", bad == 0))
    for fmt in formats:
        ck = synthetic_checkpoint(shape, fmt.upper())
        runner = numpy_runner(ck, 1024)
        prompt = rng.integers(0, runner.vocab_size, n_prompt)
        a = runner.prefill_logits(prompt, 0)
        dec = np.concatenate([runner.forward([int(t)], i) for i, t in enumerate(prompt)])
        top2 = np.sort(a, axis=1)[:, -2:]
        near = top2[:, 1] - top2[:, 0] < 1e-3
        mism = int(((np.argmax(a, 1) != np.argmax(dec, 1)) & ~near).sum())
        res.append(Result(f"{shape}/{fmt}", "numpy prefill argmax = decode argmax", f"{mism} mismatches, {int(near.sum())} near-ties",
                          "0 (ties < 1e-3 excluded)", mism == 0))
        sp = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, repeat_penalty=1.1)
        s1, s2 = (_greedy(runner, prompt[:32], n_gen, False, sp, seed=1234) for _ in range(2))
        res.append(Result(f"{shape}/{fmt}", "numpy same seed = same tokens", "equal" if s1 == s2 else "differ", "equal", s1 == s2))
    return res


def build_parser() -> argparse.ArgumentParser:
    from .options import KV_CACHE_TYPES, MODEL_HELP, add_device_arg, add_model_arg, comma_list, gpu_ids, parser
    from .synthetic import SHAPES

    p = parser("bw24chat check", __doc__)
    add_model_arg(p, help="also gate this model on the GPU: " + MODEL_HELP + " (default: none)")
    add_device_arg(p, help="cuda: every kernel against its NumPy reference, then the gates; cpu: the NumPy-side checks "
                           "alone (dequantization against gguf, the NumPy backend's prefill vs decode and seeds); auto: "
                           "cuda where CuPy and a GPU are usable, else the NumPy-side checks and exit status 2")
    p.add_argument("--synthetic", default="tiny", choices=sorted(SHAPES), help="random-weight shape gated in every format")
    p.add_argument("--formats", type=comma_list(FORMATS), default=DEFAULT_FORMATS,
                   help="comma list of the weight formats gated: " + ", ".join(FORMATS))
    p.add_argument("--kv-cache", type=comma_list(KV_CACHE_TYPES), default=DEFAULT_KV,
                   help="comma list of the KV cache types gated: " + ", ".join(KV_CACHE_TYPES))
    p.add_argument("--kv", dest="kv_cache", type=comma_list(KV_CACHE_TYPES), help=argparse.SUPPRESS)  # the old spelling
    p.add_argument("--skip-kernels", action="store_true", help="skip the kernel-vs-reference section")
    p.add_argument("--skip-gates", action="store_true", help="skip the model gates")
    p.add_argument("--portable", action="store_true", help="force the portable (non-wgmma) kernels")
    p.add_argument("--activations", type=comma_list(("f32", "bf16")), default="f32",
                   help="comma list of the matmul-input contracts gated: f32 (the default engine), bf16 (opt-in: "
                        "its prefill-vs-decode rows are expected to show a few flips on random models)")
    p.add_argument("--spec", action="store_true",
                   help="only the speculative-decoding gate (every K x drafter x greedy/sampled = plain decoding)")
    p.add_argument("--spec-k", default=",".join(["auto", *map(str, range(1, MAX_K + 1))]),
                   help="--spec: comma list of K (auto: the adaptive K)")
    p.add_argument("--draft-head", metavar="FILE", help="--spec -m: the model's trained MTP head, if not the one beside "
                                                         "it (bw24chat train-draft)")
    p.add_argument("--gpus", type=gpu_ids, default=(), metavar="N|IDS",
                   help="run the model gates (and --spec) on the model split over N GPUs of this host (or the devices "
                        "listed, 0,1; --gpus 1: the split runner over a world of one GPU), plus its run-to-run and "
                        "against-one-GPU comparison")
    p.add_argument("--batch", action="store_true",
                   help="only the batch-invariance gate (B = 1, 2, 8, 32 sequences decoded together = each alone, "
                        "greedy and seeded, prefix sharing on and off; on CUDA, or the NumPy backend with --device cpu) on the "
                        "--synthetic shape in the first of --formats")
    return p


def no_gpu(why: str) -> str:
    """cuda_status's reason without its install advice (the caller gives its own)."""
    return "no usable CUDA GPU: " + why.split(";")[0]


def _print(results: list[Result], title: str) -> list[Result]:
    print(f"\n{title}")
    w = max(len(r.section) for r in results) if results else 10
    for r in results:
        print(f"{'PASS' if r.ok else 'FAIL'}  {r.section:{w}}  {r.name:36} {r.value:48} limit {r.limit}")
    bad = [r for r in results if not r.ok]
    print(f"{len(results) - len(bad)} passed, {len(bad)} failed")
    return bad


def report(results: list[Result], title: str) -> int:
    """Print the table; 1 if anything failed."""
    return 1 if _print(results, title) else 0


def main(argv: list[str]) -> int:
    from .backends import cuda_status, pick_device

    a = build_parser().parse_args(argv)
    if a.portable:
        os.environ["BW24CHAT_PORTABLE"] = "1"
    t0 = time.time()
    if a.gpus:
        from .backends import check_gpus
        from .options import OptionError

        try:
            ids = ",".join(map(str, a.gpus))
            if a.batch:
                raise OptionError(f"--gpus {ids} --batch: batched decoding does not run over several GPUs")
            usable, why = (False, "--device cpu") if a.device == "cpu" else cuda_status()
            if not usable:
                raise OptionError(f"--gpus {ids}: the model is split over GPUs, but {no_gpu(why)}")
            check_gpus(a.gpus, "cuda")
        except OptionError as exc:
            sys.stderr.write(f"bw24chat check: {exc}\n")
            return 2
    if a.batch:  # the NumPy backend's one cache type; on CUDA every --kv-cache type
        results, wheres = [], []
        for kv in a.kv_cache if pick_device(a.device)[0] == "cuda" else a.kv_cache[:1]:
            make_runner, tok, where = batch_runner(a.device, a.synthetic, a.formats[0].upper(), kv=kv)
            results += batch_gates(make_runner, tok, label=f"batch/kv={kv}" if "kv=" in where else "batch")
            wheres.append(where)
        return report(results, f"bw24chat check --batch on {'; '.join(wheres)}, {time.time() - t0:.0f}s")
    if a.spec:
        ks = [0 if k == "auto" else int(k) for k in a.spec_k.split(",")]
        runner, tok, where = spec_runner(a.device, model=a.model, draft_head=a.draft_head, gpus=a.gpus)
        results = spec_gates(runner, tok, ks) + [spec_fixed_gate(runner, tok)]
        if not a.model:  # and a hybrid model (its state's rollback; its MTP head)
            del runner
            runner, tok, _ = spec_runner(a.device, hybrid=True, gpus=a.gpus)
            results += spec_gates(runner, tok, ks, label="spec/hybrid") + [spec_fixed_gate(runner, tok, "spec/hybrid")]
        return report(results, f"bw24chat check --spec on {where}, {time.time() - t0:.0f}s")
    usable, why = (False, "") if a.device == "cpu" else cuda_status()
    if not usable:
        if a.device == "cuda":
            sys.stderr.write(f"bw24chat check: --device cuda: {no_gpu(why)}; {NO_GPU_HINT}\n")
            return 2
        results = [] if a.skip_gates and a.skip_kernels else numpy_checks(a.formats, a.synthetic)
        bad = _print(results, f"bw24chat check on the CPU (NumPy), {time.time() - t0:.0f}s")
        if a.device == "auto":
            sys.stderr.write(f"bw24chat check: {no_gpu(why)}: ran the NumPy-side checks only (--device cpu runs "
                             f"just those); {NO_GPU_HINT}\n")
            return 2
        return 1 if bad else 0
    import cupy as cp

    from .backends import kernel_build
    from .backends.cuda_runner import CudaRunner
    from .synthetic import synthetic_checkpoint

    def make_runner(ck, kv: str, act: str):
        if a.gpus:  # the split runner (its expert tiers are not built: no spill gate)
            from .backends.cuda_sharded import ShardedCudaRunner

            return ShardedCudaRunner(ck, a.gpus, 2048, kv, prefill_chunk=512, activations=act)
        return CudaRunner(ck, 2048, kv, prefill_chunk=512, activations=act)

    def gate_model(ck, name: str) -> list[Result]:
        out = []
        for kv in a.kv_cache:
            for act in a.activations:
                runner = make_runner(ck, kv, act)
                out += model_gates(runner, f"{name}/kv={kv}" + ("" if act == "f32" else f"/x={act}"))
                if hasattr(runner, "close"):
                    runner.close()
                del runner
                cp.get_default_memory_pool().free_all_blocks()
            if not a.gpus:
                out += spill_gate(ck, kv, f"{name}/kv={kv}")
        if a.gpus:
            out += split_gates(ck, a.gpus, name)
        return out

    results: list[Result] = []
    if not a.skip_kernels:
        results += kernel_checks()
    if not a.skip_gates:
        for fmt in a.formats:
            results += gate_model(synthetic_checkpoint(a.synthetic, fmt.upper()), f"{a.synthetic}/{fmt}")
        if a.model:
            from .console import print_downloads
            from .model_store import open_checkpoint

            ck = open_checkpoint(a.model, print_downloads("bw24chat check"))
            results += gate_model(ck, ck.name[:20])
    dev = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
    bad = _print(results, f"bw24chat check on {dev} ({kernel_build.active_arch()}){_on_gpus(a.gpus)}, {time.time() - t0:.0f}s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
