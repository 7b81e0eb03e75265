"""A clip from the chunk-causal shapes model, streamed on P ranks with a KV cache under CP.

    cpcourse generate --causal --prompt circle-right --nproc 2 --kv-cache pass-q --compare --json

`run_stream(nproc, ...)`: `check_stream` turns the arguments into a `StreamRequest` (every input
checked before a process starts: the weights are causal, the chunk divides the frames, the cache
design fits the heads), the ranks run `rank(request)` (it reads the request's fields),
`stream_report` puts their pieces together into the clip `[T, 3, H, W]` and says what each rank
sent per chunk and held, and `--compare` streams the same clip in this process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from cpcourse.causal import DESIGNS, check_design
from cpcourse.support.errors import guidance_scale, positive_int, require, seed_int
from cpcourse.tinydit.moving_shapes import FRAMES, PROMPTS, SIZE, parse_prompt
from cpcourse.tinydit.sampling import DTYPES
from cpcourse.tinydit.training import SAMPLE_STEPS


@dataclass(frozen=True)
class StreamRequest:
    """One streamed clip, checked: `shape` the latents' [1, C, T, H, W], `label` the prompt's
    (shape, direction) ids, `weights` the causal weights file."""

    nproc: int
    seed: int
    prompt: str
    label: tuple[int, int]
    weights: str
    kv_cache: str
    chunk: int
    shape: tuple[int, int, int, int, int]
    steps: int
    cfg_scale: float
    dtype: str


def check_stream(nproc: int, seed: int = 0, *, prompt: str | None = None,
                 weights: str = "shipped", kv_cache: str = "pass-q", chunk: int | None = None,
                 steps: int | None = None, cfg_scale: float | None = None,
                 dtype: str = "fp32") -> StreamRequest:
    """`run_stream`'s arguments as a `StreamRequest`, or an InputError naming the parameter."""
    from cpcourse.tinydit.causal import shipped_causal_path
    from cpcourse.tinydit.model import load_weights
    from cpcourse.tinydit.streaming import causal_chunk

    path = shipped_causal_path() if weights == "shipped" else os.path.abspath(weights)
    trained_chunk = causal_chunk(path)
    cfg = load_weights(path)[0].cfg
    nproc, seed = positive_int("nproc", nproc), seed_int("seed", seed)
    chunk = trained_chunk if chunk is None else positive_int("chunk", chunk)
    require(FRAMES % chunk == 0, f"chunk {chunk} must divide the clip's {FRAMES} frames "
            f"(use {', '.join(str(c) for c in range(1, FRAMES + 1) if FRAMES % c == 0)}; the "
            f"model was trained with {trained_chunk})")
    require(chunk == trained_chunk, f"chunk {chunk}: this model was trained with chunk "
            f"{trained_chunk}, and another chunk streams it in a way it never learned: leave "
            f"`chunk` out or use {trained_chunk}")
    require(kv_cache in DESIGNS, f"kv_cache must be one of {', '.join(DESIGNS)}, got "
            f"{kv_cache!r}")
    check_design(kv_cache, cfg.heads, nproc)
    tokens = chunk * (SIZE // cfg.patch) ** 2
    require(nproc <= tokens, f"nproc {nproc}: a chunk of {chunk} frames has {tokens} tokens to "
            "split; use at most that many ranks")
    steps = positive_int("steps", SAMPLE_STEPS if steps is None else steps)
    require(steps <= 1000, f"steps {steps}: use at most 1000")
    require(dtype in DTYPES, f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    prompt = prompt or PROMPTS[1]
    return StreamRequest(nproc=nproc, seed=seed, prompt=prompt, label=parse_prompt(prompt),
                         weights=path, kv_cache=kv_cache, chunk=chunk,
                         shape=(1, cfg.in_channels, FRAMES, SIZE, SIZE), steps=steps,
                         cfg_scale=guidance_scale("cfg_scale", 4.0 if cfg_scale is None
                                                  else cfg_scale), dtype=dtype)


def run_stream(nproc: int, seed: int = 0, *, compare: bool = False, timeout: float = 120.0,
               stream=False, **kwargs) -> dict:
    """Stream on `nproc` processes (`kwargs`: `check_stream`'s). Returns {"latents"
    [1, C, T, H, W], "clip" [T, 3, H, W] in [0, 1], "report"}."""
    from cpcourse.launch import launch

    request = check_stream(nproc, seed, **kwargs)
    results = launch(rank, request.nproc, timeout=timeout, args=(request,), stream=stream)
    latents, clip, report = stream_report(request, results)
    if compare:
        report.update(compare_stream(request, clip))
    return {"latents": latents, "clip": clip, "report": report}


def rank(req: StreamRequest) -> dict:
    """What each rank of `cpcourse generate --causal` runs under `cpcourse.launch`: its pieces
    of every chunk, the bytes it sent per chunk, its peak tensor memory and its cache's bytes."""
    import torch.distributed as dist

    from cpcourse.causal import KVCacheCP
    from cpcourse.support.dtypes import torch_dtype
    from cpcourse.support.peak_memory import peak_memory
    from cpcourse.tinydit.model import load_weights
    from cpcourse.tinydit.sampling import initial_noise
    from cpcourse.tinydit.streaming import stream_sample

    rank_, world = dist.get_rank(), dist.get_world_size()
    dtype = torch_dtype(req.dtype)
    model = load_weights(req.weights, dtype)[0]
    noise = initial_noise(req.shape, req.seed, dtype)  # [1, C, T, H, W], the same on every rank
    caches, sent = [], []

    def new_cache():  # one per layer, each split over the ranks by `req.kv_cache`
        caches.append(KVCacheCP(req.kv_cache, group=dist.group.WORLD))
        return caches[-1]

    pieces, peak = peak_memory(stream_sample, model, noise, req.label, req.chunk, new_cache,
                               req.steps, req.cfg_scale, rank_, world, sent)
    return {"rank": rank_, "pieces": pieces, "bytes_per_chunk": sent, "peak_bytes": peak,
            "cache_bytes": sum(c.cache_bytes for c in caches)}


def stream_report(request: StreamRequest, results) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(latents, clip, report) from the ranks' results: bytes per chunk (all ranks together, and
    per rank), peak tensor memory and cache bytes per rank, and what the tracker sees."""
    from cpcourse.runs.generate import tracked_report
    from cpcourse.tinydit.model import load_weights
    from cpcourse.tinydit.streaming import assemble
    from cpcourse.tinydit.training import to_clip

    cfg = load_weights(request.weights)[0].cfg
    grid = (SIZE // cfg.patch, SIZE // cfg.patch)
    latents = assemble([r["pieces"] for r in results], request.chunk, grid, cfg.in_channels,
                       cfg.patch)
    per_rank = [r["bytes_per_chunk"] for r in results]
    clip = to_clip(latents)
    report = {"nproc": request.nproc, "seed": request.seed, "weights": request.weights,
              "kv_cache": request.kv_cache, "chunk": request.chunk,
              "chunks": FRAMES // request.chunk, "steps": request.steps,
              "cfg_scale": request.cfg_scale, "dtype": request.dtype,
              "tokens_per_rank": [r["pieces"][0].shape[2] for r in results],
              "bytes_per_chunk": [sum(c) for c in zip(*per_rank, strict=True)],
              "bytes_per_chunk_per_rank": per_rank,
              "peak_bytes_per_rank": [int(r["peak_bytes"]) for r in results],
              "cache_bytes_per_rank": [int(r["cache_bytes"]) for r in results],
              "launch_seconds": round(results.seconds, 3)}
    report.update(tracked_report(request.prompt, clip))
    return latents, clip, report


def compare_stream(request: StreamRequest, clip: torch.Tensor) -> dict:
    """The same clip streamed in this process (one cache per layer, no group): the largest
    difference and its tolerance (`cpcourse.support.tolerance`; ulysses runs one kernel over
    the same keys, pass-q and pass-kv merge partial softmaxes)."""
    from cpcourse.support.dtypes import torch_dtype
    from cpcourse.support.tolerance import verdict
    from cpcourse.tinydit.model import load_weights
    from cpcourse.tinydit.sampling import initial_noise
    from cpcourse.tinydit.streaming import stream_latents
    from cpcourse.tinydit.training import to_clip

    dtype = torch_dtype(request.dtype)
    model = load_weights(request.weights, dtype)[0]
    noise = initial_noise(request.shape, request.seed, dtype)
    single = to_clip(stream_latents(model, noise, request.label, request.chunk, request.steps,
                                    request.cfg_scale))
    return verdict(float((clip - single).abs().max()), float(single.abs().max()),
                   request.kv_cache, request.dtype, request.cfg_scale)
