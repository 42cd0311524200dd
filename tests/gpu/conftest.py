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
