"""SmolLM2-135M-Instruct Q4_1 on the device: the CUDA and NumPy backends give the same greedy
64 tokens (chat prompts) under each activation contract, then the check gates on this real model
for every KV cache type.

    python tools/device_smollm2.py PATH/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import sys
import time



def greedy(runner, tok, prompt_ids, n=64):
    from bw24chat.api import SamplingParams
    from bw24chat.generate import Generator

    g = Generator(runner, tok)
    sp = SamplingParams(temperature=0)
    t, _ = g.prefill(prompt_ids, sp, 0)
    out = [t]
    for i in range(n - 1):
        t = g.decode(t, sp, 0, [])
        out.append(t)
    return out


def main(path):
    from bw24chat.backends.cuda_runner import CudaRunner
    from bw24chat.backends.numpy_backend import NumpyBackend, numpy_runner
    from bw24chat.chat_template import ChatFormatter
    from bw24chat.check import model_gates
    from bw24chat.loaders import load_checkpoint

    ck = load_checkpoint(path)
    tok = ck.tokenizer
    fmt = ChatFormatter(tok.chat_template, None, None)
    prompts = ["What is the capital of France?", "Write a haiku about the sea.", "Explain photosynthesis briefly.",
               "List three prime numbers."]
    # each activation contract against the NumPy backend computing the same one; the exact f32
    # cache (the NumPy reference keeps float32 K/V)
    for act in ("bf16", "f32"):
        npr = numpy_runner(ck, 2048, NumpyBackend(act_quant=True, act_bf16=act == "bf16"))
        cur = CudaRunner(ck, 2048, "f32", activations=act)
        ok = 0
        for p in prompts:
            ids = tok.encode(fmt.render([{"role": "user", "content": p}]))
            t0 = time.time()
            a = greedy(npr, tok, ids)
            b = greedy(cur, tok, ids)
            same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), 64)
            ok += same == 64
            print(f"x={act} {p[:32]:34} equal for {same}/64 tokens  ({time.time() - t0:.1f}s)  {tok.decode(b)[:60]!r}", flush=True)
        print(f"x={act}: CUDA = NumPy greedy 64 tokens on {ok}/{len(prompts)} prompts")
        del cur
    for kv in ("bf16", "q8_0", "fp8", "f32"):
        r = CudaRunner(ck, 2048, kv)
        for g in model_gates(r, f"smollm2/kv={kv}"):
            print(("PASS " if g.ok else "FAIL ") + f"{g.section} {g.name}: {g.value}", flush=True)
        del r


if __name__ == "__main__":
    main(sys.argv[1])
