"""The real engine: resolves and loads a model, picks a backend, and serves GenerationRequests
on its own thread (see api.py for the client side)."""
from __future__ import annotations

import gc
import numbers
import os
import sys
import time
import traceback
from typing import Callable

from .api import DoneEvent, ErrorEvent, LoadProgress, ModelInfo, RequestHandle, StatsEvent, TokenEvent, Usage
from .backends import check_gpus, pick_device
from .console import download_reporter
from .chat_template import ChatFormatter, ChatTemplateError
from .backends.runner import max_batch
from .engine_thread import EngineThread
from .generate import ContextFull, Generator, Output
from .loaders import load_checkpoint
from .model_store import model_aliases, resolve_model
from .sampling_defaults import model_sampling
from .kv_pages import min_pool_blocks, pool_blocks
from .options import EngineOptions, OptionError, batching
from .scheduler import DEFAULT_STEP_TOKENS, Scheduler, Sequence
from .speculative import make_drafter


def process_rss() -> int:
    """This process's resident memory in bytes (Linux: now; elsewhere: the peak)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def pool_plan(n_ctx: int, block_size: int, block_bytes: int, kv_pool: int, room: tuple[int, str] | None) -> tuple[int, str]:
    """The blocks of batched decoding's pool (kv_pages.pool_blocks: --kv-pool, else 1 GiB, at least
    one context), as many as fit ``room`` (the runner's kv_pool_room: bytes and where they come
    from; None: no device limit); 0 where not even one context fits: the engine then serves one
    request at a time.  With it, the line that says so, numbers included, where memory decided
    less than wanted ("" otherwise)."""
    want = pool_blocks(n_ctx, block_size, block_bytes, kv_pool)
    if room is None:
        return want, ""
    room_bytes, why = room
    fits = max(room_bytes, 0) // block_bytes
    if fits >= want:
        return want, ""
    gib, need = 2**30, min_pool_blocks(n_ctx, block_size)
    if fits < need:
        return 0, (f"batched decoding is off, one request at a time: its KV pool needs {need * block_bytes / gib:.2f} GiB "
                   f"(one context of {n_ctx} tokens), but {max(room_bytes, 0) / gib:.2f} GiB is left for it ({why}); "
                   "a smaller --ctx makes room")
    return fits, (f"batched decoding's KV pool holds {fits * block_size} positions ({fits * block_bytes / gib:.2f} GiB), "
                  f"not the {want * block_size} wanted: {max(room_bytes, 0) / gib:.2f} GiB is left for it ({why})")


class Engine(EngineThread):
    """Serves requests on its thread: batched (scheduler.py) where the runner has a batched step,
    else one at a time through generate.Generator.  An MTP head drafts from one sequence's hidden
    states in its own cache, so ``--spec mtp`` serves one request at a time, and a batched request
    that asks for it is decoded plainly (the same tokens); n-gram drafts run in the batch."""

    def __init__(self, checkpoint, runner, device: str, device_name: str, note: str, max_queue: int = 64,
                 ids: tuple[str, ...] = (), spec: str = "off", spec_k: int = 0, batch: int = 0, kv_pool: int = 0):
        try:  # an unknown mode (or mtp without a head) fails at load, not at the first request
            make_drafter(spec, runner)
        except ValueError as exc:
            if spec == "mtp" and checkpoint.draft_head_problem:  # the head beside the model was left out: say why
                raise ValueError(f"{exc}. {checkpoint.draft_head_problem}") from None
            raise
        self.spec, self.spec_k = spec, spec_k
        self.checkpoint = checkpoint
        self.runner = runner
        self.note = note
        tok = checkpoint.tokenizer
        self.tokenizer = tok
        self.generator = Generator(runner, tok)
        self.formatter = ChatFormatter.for_tokenizer(tok)
        self.info = ModelInfo(
            name=checkpoint.name,
            path=str(checkpoint.path),
            arch=checkpoint.arch,
            n_params=checkpoint.n_params,
            n_ctx=runner.n_ctx,
            backend="cuda" if device == "cuda" else "numpy",
            device_name=device_name,
            formats=checkpoint.formats(),
            chat_template=self.formatter.has_template,
            id=ids[0] if ids else "",
            aliases=tuple(ids[1:]),
            vocab_size=runner.vocab_size,
        )
        self.info.sampling_defaults, self.info.sampling_source = model_sampling(checkpoint)
        self.scheduler = None
        self.load_note = ""  # why batched decoding is off or its pool smaller than wanted (open_engine reports it)
        if batching(batch, spec) and max_batch(runner) > 1:
            self._open_pool(batch, kv_pool)
        self._handles: dict[int, object] = {}  # sequence id -> its RequestHandle
        super().__init__(max_queue=max_queue, batched=self.scheduler is not None)

    def _open_pool(self, batch: int, kv_pool: int) -> None:
        """Batched decoding's pool and scheduler, sized to the memory left (pool_plan); one request
        at a time where not even one context fits, or where creating the pool runs out of memory."""
        r = self.runner
        room = r.kv_pool_room(DEFAULT_STEP_TOKENS) if hasattr(r, "kv_pool_room") else None
        n_blocks, self.load_note = pool_plan(r.n_ctx, r.block_size, r.kv_block_bytes(), kv_pool, room)
        if not n_blocks:
            return
        failed = ""
        try:
            self.scheduler = Scheduler(r, n_blocks, batch=batch)
        except Exception as exc:  # noqa: BLE001 - out of memory: the engine serves one request at a time
            if not out_of_memory(exc):
                raise
            failed = f"{type(exc).__name__}"
        if failed:  # outside the handler, where the traceback no longer holds the half-made pool
            gc.collect()  # (its launches and op sets refer to each other)
            self._recover()
            self.load_note = (f"batched decoding is off, one request at a time: its KV pool of {n_blocks * r.block_size} "
                              f"positions ({n_blocks * r.kv_block_bytes() / 2**30:.2f} GiB) ran out of memory ({failed})")

    # ------------------------------------------------------------------ API
    def render_prompt(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return self.formatter.render(messages, add_generation_prompt)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_bos=False))

    def _recover(self) -> None:
        """After a failure inside the runner: what its cache holds is unknown (a prefill chunk or
        a step may have stopped half-way; a hybrid model's recurrent state with it), so the next
        request prefills from scratch; the GPU memory pools give their free blocks back."""
        self.generator.cached.clear()
        try:
            self.runner.rollback(0)
        except Exception:  # noqa: BLE001 - best effort: the cleared prefix is what matters
            pass
        cp = getattr(self.runner, "cp", None)
        if cp is not None:
            cp.get_default_memory_pool().free_all_blocks()
            cp.get_default_pinned_memory_pool().free_all_blocks()

    def _oom_message(self, exc: BaseException) -> str:
        where = "GPU" if self.info.backend == "cuda" else "host"
        return (f"the {where} ran out of memory during this reply ({type(exc).__name__}); the engine freed what it "
                "could and keeps serving: try a shorter prompt or reply, a smaller --ctx, or a smaller model or format")

    def stats(self) -> dict:
        s = {"backend": self.info.backend, "gpu_name": self.info.device_name, "ctx_max": self.runner.n_ctx,
             "rss": process_rss()}
        memory = self.runner.memory_info()
        if "kv_bytes" not in memory and hasattr(self.runner, "cache_k"):  # the CUDA runner's per-layer caches
            memory["kv_bytes"] = sum(int(c.nbytes) for c in (*self.runner.cache_k, *self.runner.cache_v))
        s.update({k: v for k, v in memory.items() if k in ("vram_used", "vram_total", "kv_bytes")})
        if self.scheduler is not None:  # the pool's blocks held (by requests, or cached for reuse), the batch's figures
            sched = self.scheduler.stats()
            held = sched["kv_blocks_used"] + sched["kv_blocks_cached"]
            s.update(sched, kv_bytes=s.get("kv_bytes", 0) + held * self.runner.kv_block_bytes())
        else:
            s["ctx_used"] = len(self.generator.cached)
        if hasattr(self.runner, "expert_stats"):  # MoE tiers: hit rates, bytes moved per token, occupancy
            s.update(self.runner.expert_stats())
        return s

    # ------------------------------------------------------------------ worker
    def _prompt_ids(self, handle: RequestHandle) -> list[int] | None:
        """The request's prompt ids (None: it ended with an ErrorEvent)."""
        req = handle.request
        if req.prompt_ids is not None:
            V = self.runner.vocab_size
            bad = next((t for t in req.prompt_ids if isinstance(t, bool) or not isinstance(t, numbers.Integral) or not 0 <= t < V), None)
            if bad is not None:
                handle.emit(ErrorEvent(f"prompt token {bad!r} is not a token id of this model (0 to {V - 1})"))
                return None
            if req.echo:
                handle.emit(TokenEvent(self.tokenizer.decode(req.prompt_ids), []))
            return [int(t) for t in req.prompt_ids]
        try:
            text = req.prompt if req.prompt is not None else self.render_prompt(req.messages, req.add_generation_prompt)
        except ChatTemplateError as exc:
            handle.emit(ErrorEvent(str(exc)))
            return None
        ids = self.tokenizer.encode(text)  # adds BOS where the model wants it, never twice
        if req.echo and req.prompt is not None:
            handle.emit(TokenEvent(req.prompt, []))
        return ids

    def run_request(self, handle: RequestHandle) -> None:
        req = handle.request
        ids = self._prompt_ids(handle)
        if ids is None:
            return

        def on_text(piece, ids_, lps):
            handle.emit(TokenEvent(piece, list(ids_), lps))

        def on_stats(s):
            s = dict(self.stats(), **s)
            handle.emit(StatsEvent(s))

        try:
            drafter = make_drafter(req.spec or self.spec, self.runner)
            k = self.spec_k if req.spec_k is None else req.spec_k
            res = self.generator.generate(ids, req.sampling, on_text, lambda: handle.cancelled, req.logprobs, on_stats, drafter, k)
        except (ContextFull, ValueError) as exc:
            handle.emit(ErrorEvent(f"context full: {exc}. Start a new chat or raise --ctx." if isinstance(exc, ContextFull) else str(exc)))
            return
        except Exception as exc:  # noqa: BLE001 - the request fails, the engine keeps serving
            self._recover()
            if not out_of_memory(exc):
                raise
            handle.emit(ErrorEvent(self._oom_message(exc)))
            return
        stats = self.stats()
        stats.update(
            decode_tps=res.decode_tps,
            prefill_tps=res.prefill_tps,
            ttft_s=res.ttft_s,
            prompt_tokens=res.prompt_tokens,
            generated_tokens=len(res.token_ids),
            cached_tokens=res.cached_tokens,
            seed=res.seed,
            **res.stats,
        )
        handle.emit(StatsEvent(stats))
        handle.emit(DoneEvent(res.finish_reason, Usage(res.prompt_tokens, len(res.token_ids)), stats, res.text))

    # ------------------------------------------------------------------ worker, batched
    def start_request(self, handle: RequestHandle) -> None:
        req = handle.request
        ids = self._prompt_ids(handle)
        if ids is None:
            return
        n_ctx = self.runner.n_ctx
        if not ids or len(ids) >= n_ctx:
            msg = "empty prompt" if not ids else f"context full: the prompt is {len(ids)} tokens; the context holds {n_ctx}. " \
                                                 "Start a new chat or raise --ctx."
            handle.emit(ErrorEvent(msg))
            return
        out = Output(self.tokenizer, req.sampling, len(ids), n_ctx,
                     lambda piece, ids_, lps: handle.emit(TokenEvent(piece, list(ids_), lps)), req.logprobs)
        drafter = make_drafter(req.spec or self.spec, self.runner)
        seq = Sequence(ids, req.sampling, out, interactive=req.interactive, cancelled=lambda: handle.cancelled,
                       on_done=self._finished, on_stats=lambda s: handle.emit(StatsEvent(dict(self.stats(), **s.stats()))),
                       drafter=None if drafter is None or drafter.needs_hidden else drafter,
                       spec_k=self.spec_k if req.spec_k is None else req.spec_k)
        self.scheduler.add(seq)
        self._handles[seq.id] = handle

    def run_step(self) -> bool:
        try:
            return self.scheduler.step() > 0
        except Exception as exc:  # noqa: BLE001 - the step's requests fail, the engine keeps serving the others
            self._recover()
            if not out_of_memory(exc):
                traceback.print_exc()
            message = self._oom_message(exc) if out_of_memory(exc) else f"{type(exc).__name__}: {exc}"
            for seq in self.scheduler.failed:
                self._handles.pop(seq.id).emit(ErrorEvent(message))
            return True

    def in_flight(self) -> tuple[int, int]:
        return self.scheduler.waiting, self.scheduler.running

    def abort_all(self, message: str) -> None:
        for seq in self.scheduler.abort():
            self._handles.pop(seq.id).emit(ErrorEvent(message))

    def _finished(self, seq: Sequence) -> None:
        handle = self._handles.pop(seq.id)
        text = seq.out.close()
        stats = dict(self.stats(), **seq.stats())
        handle.emit(StatsEvent(stats))
        handle.emit(DoneEvent(seq.finish, Usage(seq.n_prompt, len(seq.out.ids)), stats, text))


def out_of_memory(exc: BaseException) -> bool:
    """A host MemoryError or the GPU's allocation failure (CuPy's OutOfMemoryError, or a CUDA
    error naming it)."""
    text = f"{type(exc).__name__}: {exc}"
    return isinstance(exc, MemoryError) or "OutOfMemoryError" in text or "out of memory" in text.lower() \
        or "cudaErrorMemoryAllocation" in text or "CUDA_ERROR_OUT_OF_MEMORY" in text


def open_engine(options: EngineOptions, progress: Callable[[LoadProgress], None] | None = None) -> Engine:
    """Resolve, load and start.  Blocking; call from a worker thread in UIs."""
    report = progress or (lambda p: None)
    check_gpus(options.gpus, options.device)
    path = resolve_model(options.model, download_reporter(report))
    report(LoadProgress("reading", 0.0, str(path)))
    t0 = time.perf_counter()
    ckpt = load_checkpoint(path, options.draft_head)
    report(LoadProgress("reading", 1.0, f"{ckpt.name}: {ckpt.n_params / 1e6:.0f}M parameters"))
    if options.quantize:
        from .quantize import requantize_checkpoint

        requantize_checkpoint(ckpt, options.quantize, lambda f: report(LoadProgress("quantizing", f, options.quantize)))
    if len(options.gpus) > 1:  # before the weights load: a model that does not split, naming the dimension
        from .parallel import plan_for

        plan_for(ckpt, len(options.gpus))
    engine = engine_for(ckpt, options, report, model_aliases(path, options.model))
    done = f"{engine.note}; loaded in {time.perf_counter() - t0:.1f}s"
    report(LoadProgress("ready", 1.0, f"{done}; {engine.load_note}" if engine.load_note else done))
    return engine


def engine_for(ckpt, options: EngineOptions, report: Callable[[LoadProgress], None] = lambda p: None,
               aliases: tuple = ()) -> Engine:
    """The engine over a checkpoint already in memory (open_engine's file, or a random-weight
    shape: synthetic.synthetic_checkpoint for load tests): the backend picked, the experts' tiers
    decided, the weights uploaded, the engine thread started."""
    device, note = pick_device(options.device)
    if len(options.gpus) > 1 and device != "cuda":
        raise OptionError(f"--gpus {','.join(map(str, options.gpus))}: the model is split over GPUs, but the engine "
                          f"runs on the CPU ({note})")
    from .backends.expert_tiers import GiB, tiers_for
    from .model_catalog import gpu_memory

    # where the experts live, decided (or refused, with the numbers) before any weight loads; on
    # the CPU the budgets simulate a card of --vram-budget GiB, so the tiers' stats are real there too
    gpu = gpu_memory() if device == "cuda" else None
    free = gpu.free if gpu else int(options.vram_budget_gb * GiB) if device != "cuda" else 0
    # (over several GPUs each holds its range of the experts: make_sharded_runner checks each share fits)
    tiers = tiers_for(ckpt, options, free) if free and len(options.gpus) <= 1 else None
    if device == "cuda" and len(options.gpus) > 1:  # one model split over several GPUs (parallel.py)
        from .backends.cuda_sharded import make_sharded_runner

        runner, device_name = make_sharded_runner(ckpt, options, report)
    elif device == "cuda":
        from .backends.cuda_runner import make_cuda_runner

        runner, device_name = make_cuda_runner(ckpt, options, report, tiers=tiers)
    else:
        from threadpoolctl import threadpool_limits

        from .backends.numpy_backend import NumpyBackend, numpy_runner

        # the BLAS library's default (a thread per core) collapses when another process takes
        # a core; set process-wide, as the engine thread's products are this process's BLAS work
        threadpool_limits(limits=options.threads, user_api="blas")
        runner = numpy_runner(ckpt, options.n_ctx, NumpyBackend(tiers=tiers), progress=lambda f: report(LoadProgress("uploading", f)))
        device_name = "CPU (NumPy)"
    return Engine(ckpt, runner, device, device_name, note, options.max_queue, aliases,
                  spec=options.spec, spec_k=options.spec_k, batch=options.max_batch, kv_pool=options.kv_pool)

