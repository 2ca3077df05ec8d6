"""The compiled decoder: the readable model's decode step traced once and replayed as a CUDA graph.

On a GPU a decode step of the readable engine is hundreds of small kernels, each launched from
Python; for a model that fits in one GPU the launches take longer than the kernels (chapter 2's
overhead-bound regime). `torch.compile(mode="reduce-overhead", fullgraph=True)` traces
`step.forward_static` into a few fused kernels (the quantized layers' dequantization fused into
their products; `compiled_step` says how) and records them as a CUDA graph, which the GPU replays
for each token at the cost of one launch. A graph has fixed shapes, so batches are padded up to
the next of a few captured sizes (`BATCH_SIZES`, as nano-vllm does), and the cache is a
`StaticKVCache`.

The scheduler's one-token steps on the paged cache that `new_paged_cache` makes are compiled the
same way (`paged.decode_paged`). Prefill and speculative verify passes (several new tokens) run
eagerly, over the slots written so far: one pass per prompt is rarely launch-bound. Anything else
the wrapper cannot take (no cache, the readable engine's caches) goes to the readable model
unchanged; `fallback_reason(cache)` says why.

The same code runs on a CPU under `torch.compile` (no graphs there): that is how CI tests it.
"""

from __future__ import annotations

import bisect
import functools
import warnings
import weakref

import torch
from torch import nn

from memwall.engine.cuda.paged import CompiledPagedCache, decode_paged
from memwall.engine.cuda.static_cache import StaticKVCache
from memwall.engine.cuda.step import forward_static, pad_rows, widen_mask

# Batch sizes with a graph of their own; a batch in between runs padded to the next one up.
BATCH_SIZES = (1, 2, 4, 8, *range(16, 513, 16))
# Why a step may fail to compile: dynamo's own errors, and (torch >= 2.7) the recompile limit hit
# by a fullgraph compile, which is a plain Exception.
COMPILE_ERRORS = (
    torch._dynamo.exc.TorchDynamoException,
    getattr(torch._dynamo.exc, "FailOnRecompileLimitHit", torch._dynamo.exc.TorchDynamoException),
)
# dynamo's limit on compiled variants per function, under the name this torch gives it
RECOMPILE_LIMIT = (
    "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
)
POOLED_SHAPES = 4  # cache shapes whose buffers are kept for reuse once their cache is dropped


def padded_rows(batch: int) -> int:
    """The captured batch size that a batch of `batch` sequences runs at."""
    index = bisect.bisect_left(BATCH_SIZES, batch)
    return BATCH_SIZES[index] if index < len(BATCH_SIZES) else batch


@functools.cache
def compiled_step(step, device_type: str, mode: str | None, backend: str | None):
    """`step` (`forward_static` or `decode_paged`) compiled for a device: one per process, shared
    by every model, so that a second wrapper over the same model finds the first one's code.

    On a GPU, `mode`'s options plus coordinate-descent tuning: with it the compiler writes a
    one-row product as a multiply and a sum of its own, into which it fuses the int8 layers'
    cast of the codes, so that the product reads the 1-byte codes and never writes out a 2-byte
    copy of the weights (gpt-fast's recipe). Without it a one-row product is a library call fed
    by a separate dequantizing kernel, and int8 is slower than bf16."""
    if backend is None and device_type == "cuda":
        mode_options = torch._inductor.list_mode_options(mode) if mode else {}
        options = {**mode_options, "coordinate_descent_tuning": True}
        return torch.compile(step, fullgraph=True, options=options)
    options = {"fullgraph": True, "mode": mode, **({"backend": backend} if backend else {})}
    return torch.compile(step, **options)


def _allow_many_shapes(limit: int = 64) -> None:
    """Each (model, mask or none) pair is one compiled variant; dynamo's default limit of 8 per
    function would silently fall back to eager after a few models in one process. And a graph is
    recorded for each padded batch and cache size, by design: torch's warning past 8 of them
    (printed into a chapter's output) is silenced."""
    config = torch._dynamo.config
    setattr(config, RECOMPILE_LIMIT, max(getattr(config, RECOMPILE_LIMIT), limit))
    graphs = torch._inductor.config.triton
    if hasattr(graphs, "cudagraph_dynamic_shape_warn_limit"):
        graphs.cudagraph_dynamic_shape_warn_limit = None


class CompiledDecoder(nn.Module):
    """`model` whose one-token steps on a `StaticKVCache` (from `new_cache`) run compiled."""

    def __init__(self, model: nn.Module, *, mode: str | None = "reduce-overhead", backend=None):
        super().__init__()
        self.model = model
        device = next(model.parameters()).device
        # CUDA graphs exist only on CUDA; elsewhere the plain compiled code is what there is.
        mode = mode if device.type == "cuda" else None
        _allow_many_shapes()
        for tensor in (*model.parameters(), *model.buffers()):
            # Weights keep their shapes: never let the compiler generalise them to symbolic sizes
            # because another model of other shapes was compiled before (slower kernels).
            torch._dynamo.mark_static(tensor)
        self._compiled = {
            step: compiled_step(step, device.type, mode, backend)
            for step in (forward_static, decode_paged)
        }
        self.compile_mode, self.graphs = mode, device.type == "cuda" and mode == "reduce-overhead"
        self.compile_failure = None  # why the step runs uncompiled, if compiling it failed
        # Slot numbers as views into one tensor made once: a decode step then builds no tensor.
        self.register_buffer(
            "_slots", torch.arange(model.max_positions, device=device), persistent=False
        )
        self._pool = {}  # (rows, max_tokens, dtype) -> (buffers, weak reference to their cache)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.model, name)

    def new_cache(self, batch: int = 1, max_tokens: int | None = None, dtype=None):
        """A `StaticKVCache` for `batch` sequences. The buffers of a dropped cache of the same
        shape are reused, so a graph recorded on them replays without being recorded again."""
        parameter = next(self.model.parameters())
        max_tokens = max_tokens or self.model.max_positions
        dtype = dtype or self.model.embed.weight.dtype
        rows = padded_rows(batch)
        key = (rows, max_tokens, dtype)
        free = self._pool.get(key)
        buffers = free[0] if free is not None and free[1]() is None else None
        cache = StaticKVCache(
            self.model.n_layers,
            batch,
            max_tokens,
            self.model.n_kv_heads,
            self.model.head_dim,
            dtype,
            parameter.device,
            rows=rows,
            buffers=buffers,
        )
        # Remember the newest few shapes (a batch sweep, a decode benchmark's requests); older
        # buffers are let go, so that GPU memory is not held for shapes no longer used.
        self._pool.pop(key, None)
        self._pool[key] = ((cache.layer_keys, cache.layer_values), weakref.ref(cache))
        while len(self._pool) > POOLED_SHAPES:
            self._pool.pop(next(iter(self._pool)))
        return cache

    def new_paged_cache(self, n_blocks: int, block_size: int = 16, dtype=None):
        """A paged KV cache for the scheduler, whose one-token steps on it run compiled."""
        return CompiledPagedCache.for_model(self.model, n_blocks, block_size, dtype)

    def fallback_reason(self, cache) -> str | None:
        """Why steps on `cache` go to the readable model; None when they run compiled."""
        if not isinstance(cache, (StaticKVCache, CompiledPagedCache)):
            return (
                "the compiled path takes the caches that this model's new_cache() and "
                f"new_paged_cache() make, not {type(cache).__name__}"
            )
        if cache.device != self._slots.device:
            return f"the cache is on {cache.device}, the model on {self._slots.device}"
        return None

    @torch.inference_mode()
    def forward(self, tokens, cache=None, *, positions=None, mask=None, last_only=False):
        readable = cache is None or self.fallback_reason(cache) is not None
        if not readable and isinstance(cache, CompiledPagedCache):
            # A scheduler's decode step (its positions and mask those begin() gave) runs compiled;
            # its prefill passes run the readable model on the same blocks.
            if tokens.shape[1] == 1 and cache.implies(positions, mask):
                return self._paged_step(tokens, cache)
            readable = True
        if readable:
            return self.model(tokens, cache, positions=positions, mask=mask, last_only=last_only)
        batch, new = tokens.shape
        if batch != cache.batch:
            raise ValueError(f"{batch} sequences given to a cache made for {cache.batch}")
        start, end = cache.length, cache.length + new
        if end > min(cache.max_tokens, self.model.max_positions):
            raise ValueError(
                f"KV cache is full: {end} tokens needed, room for {cache.max_tokens} "
                f"(the model's context is {self.model.max_positions}). Allocate a larger cache "
                "(max_tokens) or use a shorter prompt."
            )
        rows, slots = cache.rows, self._slots[start:end]
        keys, values, span = cache.layer_keys, cache.layer_values, cache.max_tokens
        if new > 1:
            # A decode step reads every slot (the buffers themselves, one shape for its graph);
            # an eager pass of several tokens reads only the slots written so far, through views
            # that it writes in place.
            span = end
            keys = [k[:, :, :end] for k in keys]
            values = [v[:, :, :end] for v in values]
        if positions is not None:
            positions = pad_rows(positions.reshape(-1, new).expand(batch, new), rows).contiguous()
        if mask is not None:
            mask = widen_mask(mask.to(torch.bool), batch, rows, new, span)
        tokens = pad_rows(tokens, rows)
        arguments = (self.model, tokens, positions, slots, keys, values, mask, last_only)
        logits = self._run(forward_static, arguments) if new == 1 else forward_static(*arguments)
        cache.length = end
        return logits[:batch].clone()

    def _paged_step(self, tokens, cache):
        batch = tokens.shape[0]
        rows = padded_rows(batch)
        tokens, (positions, tables) = pad_rows(tokens, rows), cache.step_inputs(rows)
        # One compile for every batch size and table width (a graph is recorded per shape).
        for tensor, dims in ((tokens, [0]), (positions, [0]), (tables, [0, 1])):
            torch._dynamo.maybe_mark_dynamic(tensor, dims)
        arguments = (self.model, tokens, positions, tables, cache.keys, cache.values)
        logits = self._run(decode_paged, arguments)
        cache.commit()
        return logits[:batch].clone()

    def _run(self, step, arguments):
        """`step(*arguments)` compiled (uncompiled once compiling has failed here)."""
        if self.compile_failure is not None:
            return step(*arguments)
        if self.graphs:
            # Each replay overwrites the last one's outputs; the logits are copied out by forward.
            torch.compiler.cudagraph_mark_step_begin()
        try:
            return self._compiled[step](*arguments)
        except COMPILE_ERRORS as error:
            # The compiler could not build the step here (an unsupported op, a missing Triton,
            # more variants than dynamo's limit): the same step runs uncompiled, correct and
            # slower, and says why. Errors while running (out of memory, say) are not caught:
            # they are the caller's to see.
            self.compile_failure = f"{type(error).__name__}: {str(error).splitlines()[0]}"
            warnings.warn(
                f"memwall: the compiled decode step failed to build ({self.compile_failure}); "
                "running it uncompiled",
                RuntimeWarning,
                stacklevel=3,
            )
            return step(*arguments)
