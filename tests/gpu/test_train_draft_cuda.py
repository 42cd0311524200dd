"""bw24chat train-draft on a GPU (PyTorch with CUDA, bf16 weights): the trunk's logits agree with
the NumPy backend to bf16 precision, a tiny run reports its peak GPU memory, and the head it
saves drives --spec mtp with output equal to plain decoding.  Skipped without torch or CUDA."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("PyTorch sees no CUDA GPU", allow_module_level=True)

from bw24chat.backends.numpy_backend import numpy_runner  # noqa: E402
from bw24chat.backends.torch_backend import PassKV, TorchOps  # noqa: E402
from bw24chat.loaders import load_checkpoint  # noqa: E402
from bw24chat.train_draft import DraftTrainer, TrainConfig  # noqa: E402
from tests.model_factory import make_hf_dir  # noqa: E402
from tests.test_mtp import _identical  # noqa: E402


def test_train_draft_on_the_gpu(tmp_path):
    d, _ = make_hf_dir(tmp_path / "m", "qwen3", dtype="BF16")
    ckpt = load_checkpoint(d)
    cfg = TrainConfig(steps=8, batch=8, gen_tokens=32, samples=1, max_len=128, eval_every=4)
    tr = DraftTrainer(ckpt, cfg, "cuda")
    x = [5, 77, 120, 3, 9, 200, 31, 8, 44, 61, 2]
    ops = TorchOps(tr.tb, tr.eps, kv=PassKV())
    got = tr.trunk.logits(ops, tr.trunk.trunk(ops, torch.tensor([x], device="cuda"))).logits(tr.tb)[0].cpu().numpy()
    want = numpy_runner(ckpt, 64).prefill_logits(np.array(x), 0)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 3e-2  # bf16 products
    res = tr.run(tmp_path / "head.safetensors")
    assert res.device.startswith("cuda") and res.peak_gpu_bytes > 0 and res.train_s > 0
    ckpt = load_checkpoint(d, draft_head=tmp_path / "head.safetensors")
    runner = numpy_runner(ckpt, 256)
    tok = ckpt.tokenizer
    stats = _identical(runner, tok, (1, 3), [tok.encode("hello, how are you today?")], n_gen=16)
    assert all(s["spec_rounds"] > 0 for _, _, s in stats)
