"""A clip from the chunk-causal shapes model, streamed on P ranks with a KV cache under CP.

    cpcourse generate --causal --prompt circle-right --nproc 2 --kv-cache pass-q --compare --json

`run(StreamRequest(nproc=2, prompt="circle-right"))`: the Request is the run's parameters,
declared once (the flags of `cpcourse generate --causal` are its fields) and checked when made,
before a process starts (the weights are causal, the chunk divides the frames, the cache design
fits the heads); the ranks run `rank(req)` (it reads the request's fields), `stream_report`
puts their pieces together into the clip `[T, 3, H, W]` and says what each rank sent per chunk
and held, and `compare` streams the same clip in this process. `run_stream(nproc, seed,
**fields)` is the same in one call.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from cpcourse.causal import DESIGNS, check_design
from cpcourse.support.errors import guidance_scale, positive_float, positive_int, require
from cpcourse.support.request import check_common, flag, set_derived
from cpcourse.tinydit.moving_shapes import FRAMES, PROMPTS, SIZE, parse_prompt
from cpcourse.tinydit.sampling import DTYPES
from cpcourse.tinydit.training import SAMPLE_STEPS


def _derived():
    return field(default=None, init=False, repr=False, compare=False)


@dataclass(frozen=True)
class StreamRequest:
    """One streamed clip, checked: the fields are `cpcourse generate --causal`'s flags (those
    it shares with one clip, `prompt` to `timeout`, are spelled by GenerateRequest). Derived
    when made: `path` the causal weights file, `shape` the latents' [1, C, T, H, W], `label`
    the prompt's (shape, direction) ids."""

    prompt: str | None = flag(None, "what the causal model draws (circle-right)")
    weights: str = flag("shipped", "shipped, or a file from `cpcourse train --causal`")
    nproc: int = flag(2, "ranks")
    seed: int = flag(0, "noise seed")
    kv_cache: str = flag("pass-q", "with --causal: where the cache lives under CP",
                         choices=DESIGNS, acts="causal")
    chunk: int | None = flag(None, "with --causal: frames per chunk (default: the model's, 2)",
                             acts="causal")
    steps: int | None = flag(None, f"Euler steps ({SAMPLE_STEPS})")
    cfg_scale: float | None = flag(None, "guidance scale (4)")
    dtype: str = flag("fp32", "what sampling runs in", choices=sorted(DTYPES))
    compare: bool = flag(False, "also stream the clip in this process")
    timeout: float | None = flag(None, "seconds the ranks may run (120 for the default steps, "
                                 "more for more)")
    path: str = _derived()
    label: tuple = _derived()
    shape: tuple = _derived()

    def __post_init__(self):
        from cpcourse.tinydit.causal import shipped_causal_path
        from cpcourse.tinydit.model import load_weights
        from cpcourse.tinydit.streaming import causal_chunk

        check_common(self)
        require(self.weights != "random", "weights=random: the random DiT is not causal; "
                "stream shipped weights or a file from `cpcourse train --causal`")
        path = (shipped_causal_path() if self.weights == "shipped"
                else os.path.abspath(self.weights))
        trained_chunk = causal_chunk(path)
        cfg = load_weights(path)[0].cfg
        chunk = trained_chunk if self.chunk is None else positive_int("chunk", self.chunk)
        require(FRAMES % chunk == 0, f"chunk {chunk} must divide the clip's {FRAMES} frames "
                f"(use {', '.join(str(c) for c in range(1, FRAMES + 1) if FRAMES % c == 0)}; "
                f"the model was trained with {trained_chunk})")
        require(chunk == trained_chunk, f"chunk {chunk}: this model was trained with chunk "
                f"{trained_chunk}, and another chunk streams it in a way it never learned: "
                f"leave `chunk` out or use {trained_chunk}")
        check_design(self.kv_cache, cfg.heads, self.nproc)
        tokens = chunk * (SIZE // cfg.patch) ** 2
        require(self.nproc <= tokens, f"nproc {self.nproc}: a chunk of {chunk} frames has "
                f"{tokens} tokens to split; use at most that many ranks")
        steps = positive_int("steps", SAMPLE_STEPS if self.steps is None else self.steps)
        require(steps <= 1000, f"steps {steps}: use at most 1000")
        # 120 s holds the default steps on 2 loaded cores; more steps take longer, not a hang
        timeout = (min(3600.0, 120.0 * max(1.0, steps / SAMPLE_STEPS)) if self.timeout is None
                   else positive_float("timeout", self.timeout, high=3600))
        prompt = self.prompt or PROMPTS[1]
        values = {"path": path, "chunk": chunk, "steps": steps, "timeout": timeout,
                  "prompt": prompt, "label": parse_prompt(prompt),
                  "shape": (1, cfg.in_channels, FRAMES, SIZE, SIZE),
                  "cfg_scale": guidance_scale("cfg_scale", 4.0 if self.cfg_scale is None
                                              else self.cfg_scale)}
        set_derived(self, **values)


def check_stream(nproc: int = 2, seed: int = 0, **fields) -> StreamRequest:
    """`StreamRequest(nproc=nproc, seed=seed, **fields)`, or an InputError naming the
    parameter."""
    return StreamRequest(nproc=nproc, seed=seed, **fields)


def run(req: StreamRequest, stream=False) -> dict:
    """Stream on `req.nproc` processes. Returns {"latents" [1, C, T, H, W], "clip"
    [T, 3, H, W] in [0, 1], "report"}."""
    from cpcourse.launch import launch

    results = launch(rank, req.nproc, timeout=req.timeout, args=(req,), stream=stream)
    latents, clip, report = stream_report(req, results)
    if req.compare:
        report.update(compare_stream(req, clip))
    return {"latents": latents, "clip": clip, "report": report}


def run_stream(nproc: int = 2, seed: int = 0, *, stream=False, **fields) -> dict:
    """`run(StreamRequest(nproc=nproc, seed=seed, **fields))`: the notebooks' one line."""
    return run(StreamRequest(nproc=nproc, seed=seed, **fields), stream=stream)


def rank(req: StreamRequest) -> dict:
    """What each rank of `cpcourse generate --causal` runs under `cpcourse.launch`: its pieces
    of every chunk, the bytes it sent per chunk, its peak tensor memory and its cache's bytes."""
    import torch.distributed as dist

    from cpcourse.causal import KVCacheCP
    from cpcourse.support.dtypes import torch_dtype
    from cpcourse.support.peak_memory import peak_memory
    from cpcourse.tinydit.model import load_weights
    from cpcourse.tinydit.sampling import initial_noise
    from cpcourse.tinydit.streaming import StreamRank, stream_sample

    rank_, world = dist.get_rank(), dist.get_world_size()
    dtype = torch_dtype(req.dtype)
    model = load_weights(req.path, dtype)[0]
    noise = initial_noise(req.shape, req.seed, dtype)  # [1, C, T, H, W], the same on every rank
    caches, sent = [], []

    def new_cache():  # one per layer, each split over the ranks by `req.kv_cache`
        caches.append(KVCacheCP(req.kv_cache, group=dist.group.WORLD))
        return caches[-1]

    # pieces: per chunk, this rank's denoised tokens [1, 1, n_r, F] (`stream_sample`)
    pieces, peak = peak_memory(stream_sample, model, noise, req.label, req.chunk, new_cache,
                               req.steps, req.cfg_scale, StreamRank(rank_, world, sent))
    return {"rank": rank_, "pieces": pieces, "bytes_per_chunk": sent, "peak_bytes": peak,
            "cache_bytes": sum(c.cache_bytes for c in caches)}


def stream_report(request: StreamRequest, results) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(latents, clip, report) from the ranks' results: bytes per chunk (all ranks together, and
    per rank), peak tensor memory and cache bytes per rank, and what the tracker sees."""
    from cpcourse.runs.generate import tracked_report
    from cpcourse.tinydit.model import load_weights
    from cpcourse.tinydit.streaming import assemble
    from cpcourse.tinydit.training import to_clip

    cfg = load_weights(request.path)[0].cfg
    grid = (SIZE // cfg.patch, SIZE // cfg.patch)
    latents = assemble([r["pieces"] for r in results], request.chunk, grid, cfg.in_channels,
                       cfg.patch)
    per_rank = [r["bytes_per_chunk"] for r in results]
    clip = to_clip(latents)
    report = {"nproc": request.nproc, "seed": request.seed, "weights": request.path,
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
    model = load_weights(request.path, dtype)[0]
    noise = initial_noise(request.shape, request.seed, dtype)
    single = to_clip(stream_latents(model, noise, request.label, request.chunk, request.steps,
                                    request.cfg_scale))
    return verdict(float((clip - single).abs().max()), float(single.abs().max()),
                   request.kv_cache, request.dtype, request.cfg_scale)


def print_report(report: dict) -> None:
    """`run`'s report, a few lines for a terminal."""
    from cpcourse.support.tolerance import describe

    tr = report["track"]
    n = report["nproc"]
    procs = f"{n} process{'es' * (n != 1)}"
    mb = lambda x: f"{x / 1e6:.2f} MB"  # noqa: E731  (SI, as cpcourse.viz.fmt.nbytes)
    print(f"streamed '{report['prompt']}' in {report['chunks']} chunks of {report['chunk']} "
          f"frames on {procs}, KV cache {report['kv_cache']}, tokens per rank "
          f"{report['tokens_per_rank']}")
    print(f"  the tracker sees: a {tr['shape']} moving {tr['direction']} "
          f"({'matches' if report['matches_prompt'] else 'does NOT match'} the prompt)")
    print("  bytes sent per chunk (all ranks): "
          + ", ".join(f"{b / 1e6:.2f} MB" for b in report["bytes_per_chunk"]))
    for r, (peak, cache) in enumerate(zip(report["peak_bytes_per_rank"],
                                          report["cache_bytes_per_rank"], strict=True)):
        print(f"  rank {r}: peak tensor memory {mb(peak)}, KV cache {mb(cache)}")
    if "max_abs_diff_vs_single_process" in report:
        print(f"  {describe(report)}")
