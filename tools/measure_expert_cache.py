"""Hit rates of the expert-cache policies (backends/expert_cache.py) on routing traces, at slot
budgets of 25/50/75 % of the experts: the table in docs/performance.md "MoE expert residency".

    PYTHONPATH=. python tools/measure_expert_cache.py
"""
from __future__ import annotations

import numpy as np

from bw24chat.backends.expert_cache import POLICIES, hit_rate, synthetic_trace


def numpy_trace(n_prompts: int = 4, prompt_len: int = 32, new_tokens: int = 48, seed: int = 0) -> tuple[list, int, int]:
    """Router ids of the NumPy backend on the tiny-moe synthetic model: each prompt prefilled as
    one step (one lookup per distinct expert of the chunk), then greedy decode token by token."""
    from bw24chat.api import SamplingParams
    from bw24chat.backends import numpy_backend as nb
    from bw24chat.synthetic import synthetic_checkpoint

    ck = synthetic_checkpoint("tiny-moe", "Q8_0", seed=seed)
    calls = []
    route = nb.NumpyOps.router

    def recording(self, x, gate, spec, bias=None):
        ids, w = route(self, x, gate, spec, bias)
        calls.append(ids.reshape(-1).tolist())
        return ids, w

    nb.NumpyOps.router = recording
    try:
        runner = nb.numpy_runner(ck, n_ctx=prompt_len + new_tokens + 8)
        L, E, k = runner.args.num_hidden_layers, runner.args.num_experts, runner.args.num_experts_per_tok
        rng = np.random.default_rng(seed)
        greedy = SamplingParams(temperature=0.0)
        for _ in range(n_prompts):
            ids = rng.integers(1, runner.vocab_size, prompt_len).tolist()
            tok = runner.prefill(ids, 0, greedy, 0, [])
            hist = list(ids)
            for i in range(new_tokens):
                hist.append(tok)
                tok = runner.step([tok], prompt_len + i, greedy, 0, hist)[0]
    finally:
        nb.NumpyOps.router = route
    return [calls[i:i + L] for i in range(0, len(calls), L)], E, k


def table(name: str, trace: list, E: int) -> None:
    print(f"\n{name}: {len(trace)} steps, {len(trace[0])} layers, {E} experts")
    print("slots       " + "  ".join(f"{p:>6}" for p in POLICIES))
    for frac in (0.25, 0.5, 0.75):
        s = int(E * frac)
        print(f"{s:3d} ({frac:.0%})  " + "  ".join(f"{hit_rate(trace, E, s, p):6.3f}" for p in POLICIES))


def main() -> None:
    tr, E, k = numpy_trace()
    table(f"NumPy tiny-moe (top-{k})", tr, E)
    for s in (0.8, 1.2):
        table(f"synthetic Qwen3-30B-A3B-like (128 experts, top-8, zipf {s}, reuse 0.5)",
              synthetic_trace(8, 128, 8, 2000, seed=1, zipf_s=s), 128)
    table("synthetic, no reuse (zipf 1.0, reuse 0)", synthetic_trace(8, 128, 8, 2000, seed=2, reuse=0.0), 128)


if __name__ == "__main__":
    main()
