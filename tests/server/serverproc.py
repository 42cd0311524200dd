"""Real server processes on loopback for the server tests (``python -m bw24chat.server``).

Each server binds port 0 and writes the port it got to a file; the fixture waits for that
file, then for ``GET /health``; everything waits on conditions with deadlines, never on bare
sleeps.
"""
from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai

REPO = Path(__file__).resolve().parents[2]
_serial = itertools.count()


def wait_until(cond, timeout: float, what: str, interval: float = 0.02):
    """Poll ``cond()`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def run_concurrently(fn, args: list, timeout: float) -> list:
    """``fn(arg)`` for every arg, each in its own thread, released together; the results in
    order (the first failure is raised)."""
    results: list = [None] * len(args)
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(args))

    def worker(i: int) -> None:
        try:
            barrier.wait(timeout)
            results[i] = fn(args[i])
        except BaseException as exc:  # noqa: BLE001 - handed to the test below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(len(args))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), f"clients still running after {timeout} s"
    if errors:
        raise errors[0]
    return results


def stream_chat(client: openai.OpenAI, content: str, model: str = "fake-model", **kw) -> str:
    """The text of a streamed chat completion of one user message."""
    chunks = client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}],
                                            stream=True, **kw)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


class ServerProcess:
    def __init__(self, workdir: Path, args: list[str], api_key: str | None = None, ready_timeout: float = 30.0):
        n = next(_serial)
        self.port_file = workdir / f"server-{n}.port"
        self.log_path = workdir / f"server-{n}.log"
        self.api_key = api_key
        cmd = [sys.executable, "-m", "bw24chat.server", "--port", "0", "--port-file", str(self.port_file),
               "--log-level", "warning", *args]
        if api_key:
            cmd += ["--api-key", api_key]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        env.pop("BW24CHAT_API_KEY", None)
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            port = int(wait_until(self._port, ready_timeout, "the server to bind a port"))
            self.base_url = f"http://127.0.0.1:{port}"
            self.http = httpx.Client(base_url=self.base_url, timeout=30, headers=self.auth_headers)
            wait_until(self._healthy, ready_timeout, "GET /health")
        except BaseException:
            self.stop()
            raise

    @property
    def auth_headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _port(self) -> str | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"the server exited with {self.proc.returncode}:\n{self.log()}")
        return self.port_file.read_text() if self.port_file.exists() else None

    def _healthy(self) -> bool:
        self._port()  # fails if the process died
        try:
            return httpx.get(self.base_url + "/health", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self, api_key: str | None = None, **kw) -> openai.OpenAI:
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", 30)
        return openai.OpenAI(base_url=self.base_url + "/v1", api_key=api_key or self.api_key or "unused", **kw)

    def metrics(self) -> str:
        r = self.http.get("/metrics")
        r.raise_for_status()
        return r.text

    def metric(self, name: str, **labels) -> float:
        """One sample of /metrics (0 when absent)."""
        want = ",".join(f'{k}="{v}"' for k, v in labels.items())
        pattern = re.compile(rf"^bw24chat_{name}(?:\{{([^}}]*)\}})? (\S+)$", re.M)
        for found_labels, value in pattern.findall(self.metrics()):
            if found_labels == want:
                return float(value)
        return 0.0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if hasattr(self, "http"):
            self.http.close()
        self._log.close()
