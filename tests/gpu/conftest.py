"""GPU tests: without CuPy or an NVIDIA GPU each module is one skip (not collected, so its
hundreds of parameter cases are neither built nor listed)."""
import pytest

from bw24chat.backends import cuda_status

_ok, _why = cuda_status()


class _NoGPUModule(pytest.Module):
    def collect(self):
        pytest.skip(f"no GPU: {_why}", allow_module_level=True)


def pytest_pycollect_makemodule(module_path, parent):
    if not _ok:
        return _NoGPUModule.from_parent(parent, path=module_path)
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(scope="session")
def cp():
    if not _ok:
        pytest.skip(f"no GPU: {_why}")
    import cupy

    return cupy


@pytest.fixture
def rng(request):
    """Fresh random inputs every run (seeded from the test id + a fresh draw; printed on failure)."""
    import numpy as np

    seed = np.random.SeedSequence().entropy % (2**32)
    print(f"rng seed {seed}")
    return np.random.default_rng(seed)
