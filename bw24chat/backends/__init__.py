"""Backend choice: the CUDA engine where CuPy and an NVIDIA GPU are present, else the NumPy
reference on the CPU."""
from __future__ import annotations


def cuda_status() -> tuple[bool, str]:
    """(usable, reason).  Never raises: a missing CuPy or driver is a reason, not an error."""
    try:
        import cupy  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return False, f"CuPy is not installed ({type(exc).__name__}); install bw24chat[cuda13] or [cuda12]"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001
        return False, f"no usable CUDA driver ({exc})"
    if n == 0:
        return False, "no NVIDIA GPU found"
    return True, "ok"


def pick_device(requested: str) -> tuple[str, str]:
    """requested in auto|cpu|cuda -> (device, note for the user)."""
    if requested == "cpu":
        return "cpu", "CPU backend (NumPy), as requested"
    ok, why = cuda_status()
    if requested == "cuda":
        if not ok:
            raise RuntimeError(f"--device cuda: {why}")
        return "cuda", "CUDA backend"
    if ok:
        return "cuda", "CUDA backend"
    return "cpu", f"running on the CPU backend (NumPy): {why}"
