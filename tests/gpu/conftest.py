"""GPU tests: skipped cleanly when CuPy or an NVIDIA GPU is missing."""
import pytest

from bw24chat.backends import cuda_status

_ok, _why = cuda_status()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
            if not _ok:
                item.add_marker(pytest.mark.skip(reason=f"no GPU: {_why}"))


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
