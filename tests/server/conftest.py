"""Fixtures: real server processes on loopback (see serverproc.py)."""
from __future__ import annotations

import pytest
from .serverproc import ServerProcess


@pytest.fixture(scope="module")
def start_server(tmp_path_factory):
    """``start_server(*args, api_key=None)`` -> a running :class:`ServerProcess` (stopped at the
    end of the module)."""
    started: list[ServerProcess] = []
    workdir = tmp_path_factory.mktemp("servers")

    def start(*args: str, api_key: str | None = None, ready_timeout: float = 30.0) -> ServerProcess:
        s = ServerProcess(workdir, list(args), api_key, ready_timeout)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


@pytest.fixture(scope="module")
def fake_server(start_server) -> ServerProcess:
    """The fake engine, replying 'You said: <last user message or prompt>' quickly."""
    return start_server("--fake", "--fake-echo", "--fake-token-delay", "0.001",
                        "--max-body", "65536", "--max-tokens-cap", "256")


@pytest.fixture(scope="module")
def slow_server(start_server) -> ServerProcess:
    """A slow fake engine (50 ms a token) with room for one waiting request."""
    return start_server("--fake", "--fake-echo", "--fake-token-delay", "0.05", "--max-queue", "1")
