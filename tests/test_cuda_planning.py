"""Host-side planning of the CUDA runner (no GPU needed): the KV cache is sized to the VRAM budget."""
from bw24chat.backends.cuda_runner import fit_context


def test_context_fits_the_budget():
    # Llama-3.1-8B-like: 32 layers, 8 kv heads of 128, bf16 cache = 128 KiB per token
    gib = 2**30
    n = fit_context(131072, 0, 24 * gib, 16 * gib, 32, 8, 128, "bf16")
    assert n % 256 == 0 and 256 <= n < 131072
    per_token = 2 * 32 * 8 * 128 * 2
    assert 16 * gib + n * per_token + (3 << 29) <= 24 * gib
    assert fit_context(131072, 0, 140 * gib, 16 * gib, 32, 8, 128, "bf16") == 131072  # an H200 holds it all
    assert fit_context(131072, 8192, 24 * gib, 16 * gib, 32, 8, 128, "bf16") == 8192  # a request that fits
    assert fit_context(131072, 0, 24 * gib, 16 * gib, 32, 8, 128, "q8_0") > n  # a smaller cache holds more
    assert fit_context(4096, 0, 17 * gib, 16 * gib + gib // 2, 32, 8, 128, "bf16") == 256  # never below 256
