"""Backend choice: the CUDA engine where CuPy and an NVIDIA GPU are present, else the NumPy
reference on the CPU."""
from __future__ import annotations


def cuda_devices() -> tuple[int, str]:
    """(NVIDIA GPUs usable, reason where none).  Never raises: a missing CuPy or driver is a
    reason, not an error."""
    try:
        import cupy  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return 0, f"CuPy is not installed ({type(exc).__name__}); install bw24chat[cuda13] or [cuda12]"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001
        return 0, f"no usable CUDA driver ({exc})"
    return n, "ok" if n else "no NVIDIA GPU found"


def cuda_status() -> tuple[bool, str]:
    """(usable, reason)."""
    n, why = cuda_devices()
    return n > 0, why


def check_gpus(gpus: tuple[int, ...], device: str) -> None:
    """Refuse a --gpus the host cannot give (options.OptionError: the CLI's exit code 2), naming
    what was asked and what exists.  No --gpus, or device 0 alone, is the single-GPU engine."""
    if gpus in ((), (0,)):
        return
    from ..options import OptionError

    asked = f"--gpus asks for GPU{'s' if len(gpus) > 1 else ''} {', '.join(map(str, gpus))}"
    if device == "cpu":
        raise OptionError(f"{asked}, but --device cpu runs on the CPU")
    n, why = cuda_devices()
    if max(gpus) >= n:
        has = f"{n} ({', '.join(map(str, range(n)))})" if n else f"none: {why}"
        raise OptionError(f"{asked}, but this host's usable NVIDIA GPUs: {has}")
    if len(gpus) == 1:
        raise OptionError(f"{asked}: to run on one GPU other than device 0, set CUDA_VISIBLE_DEVICES={gpus[0]}")


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
