"""A real diffusers video transformer on P ranks under CP, against one process: `cpcourse models`.

    cpcourse models --arch wan --nproc 2 --method ring --compare --json

`run(ModelsRequest(arch="wan", nproc=2, method="ring", compare=True))`: the request checks
itself (arch, method or layout, latent sizes, dtype, ...: everything a launch would otherwise
only find out inside the ranks), `cpcourse.models.compare.rank_forward` runs it on the ranks,
and the report holds the tokens, each rank's frames, times, the bytes per mesh dim against the
prediction, and with `compare` the largest difference from the same model in one process.
`run_models(dict, nproc)` takes a dict of the Request's fields. `diffusers_cp_rank` is the rank
function that tries diffusers' own `enable_parallelism` on the same model instead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from cpcourse.launch import launch
from cpcourse.models.build import ARCHS
from cpcourse.models.compare import DTYPES, check_request, guidance, reference, tolerance
from cpcourse.models.parallel import METHODS
from cpcourse.models.split import SPLITS
from cpcourse.support.errors import guidance_scale, require
from cpcourse.support.layout import Layout
from cpcourse.support.request import (
    check_common,
    flag,
    raise_choice,
    request_of,
    set_derived,
    whole,
)


@dataclass(frozen=True)
class ModelsRequest:
    """One run of a tiny real model under CP, checked: the fields are `cpcourse models`' flags.
    After the checks `layout` is a `cpcourse.support.layout.Layout` (or None) and `nproc` is set
    (2, or the layout's world); the ranks (`cpcourse.models.compare.rank_forward`) read these
    attributes: no dict between."""

    arch: str = flag(help=f"one of {', '.join(ARCHS)}")
    nproc: int | None = flag(None, "ranks (CP degree), default 2 (with --layout: its world size)")
    layout: str | None = flag(None, "a mesh, e.g. cfg=2,ulysses=2,ring=1,tp=1 (instead of "
                              "--method)")
    method: str = flag("ring", f"one of {', '.join(METHODS)}", acts="no_layout")
    ulysses: int | None = flag(None, "usp: ranks per Ulysses group (default: the largest that "
                               "fits)", acts="usp")
    ring_mode: str = flag("overlap", "the ring's sends overlap its attention, or block",
                          choices=("overlap", "blocking"), acts="ring")
    frames: int = flag(5, "latent frames")
    height: int = flag(8, "latent height")
    width: int = flag(8, "latent width")
    batch: int = flag(1, "samples in a batch (1 to 4)")
    dtype: str = flag("float32", "the model's and inputs' dtype", choices=sorted(DTYPES))
    seed: int = flag(0, "weights and inputs seed")
    sample_steps: int | None = flag(None, "run N steps of the model's scheduler with CFG "
                                    "instead of one forward")
    cfg_scale: float = flag(5.0, "the sampler's guidance scale", acts="sampling")
    split: str = flag("frames", "whole latent frames per rank (default) or the tokens split "
                      "evenly", choices=SPLITS, acts="no_layout")
    shard_io: bool = flag(False, "the model takes and returns frame shards; gathered once at "
                          "the end", acts="one_forward")
    repeat: int = flag(3, "timed runs after a warm-up (0 to 20)")
    compare: bool = flag(False, "also run in this process: max_abs_err, seconds_single")
    timeout: float = flag(300.0, "seconds the ranks may run")
    config: dict | None = flag(None, "tiny-config overrides (build's keywords)", cli=False)
    threads_per_rank: int = flag(1, "torch threads on each rank", cli=False)
    threads_single: int | None = flag(None, "torch threads of the one-process run (default: "
                                      "nproc, the same cores)", cli=False)
    tokens: int = field(default=None, init=False, repr=False, compare=False)  # of one sample

    def __post_init__(self):
        if self.layout is not None:
            set_derived(self, layout=Layout.for_ranks(self.layout, self.nproc))
        if self.nproc is None:
            set_derived(self, nproc=2 if self.layout is None else self.layout.world)
        check_common(self)
        if self.arch not in ARCHS:
            raise_choice("arch", self.arch, ARCHS)
        if self.method not in METHODS:
            raise_choice("method", self.method, METHODS)
        require(self.timeout <= 3600, f"timeout {self.timeout}: use at most 3600 seconds")
        if self.sample_steps is not None:
            whole("sample_steps", self.sample_steps, high=50)
        whole("repeat", self.repeat, low=0, high=20)
        whole("batch", self.batch, high=4)
        whole("threads_per_rank", self.threads_per_rank)
        if self.threads_single is not None:
            whole("threads_single", self.threads_single)
        if self.ulysses is not None:
            whole("ulysses", self.ulysses)
        guidance_scale("cfg_scale", self.cfg_scale)
        set_derived(self, tokens=check_request(self))

    @staticmethod
    def conditions(values: dict) -> dict[str, tuple[bool, str]]:
        """Which modes the values turn on, and what each needs (cpcourse.support.modes)."""
        layout, method = values["layout"] is not None, values["method"]
        sampling = values["sample_steps"] is not None
        return {"no_layout": (not layout, "no --layout (a layout sets the ring and Ulysses "
                              "degrees)"),
                "usp": (method == "usp" and not layout, "--method usp (the Ulysses group size)"),
                "ring": (method in ("ring", "usp") or layout, "a ring: --method ring or usp, or "
                         "a --layout"),
                "sampling": (sampling, "--sample-steps N (one forward takes no guidance)"),
                "one_forward": (not sampling, "one forward: the sampler gathers its frames "
                                "itself, so drop --sample-steps")}

    @property
    def mesh_method(self) -> str:
        """What the report calls the method: "mesh" under a layout."""
        return "mesh" if self.layout is not None else self.method



def as_request(spec, **overrides) -> ModelsRequest:
    """A ModelsRequest from a ModelsRequest or a dict of its fields (notebooks write dicts)."""
    return request_of(ModelsRequest, spec, **overrides)


def run_models(spec, nproc: int, compare: bool = True, timeout: float = 300.0,
               stream=False) -> dict:
    """`run(...)` for a dict of ModelsRequest's fields (benchmarks write dicts)."""
    return run(as_request(spec, nproc=nproc, compare=compare, timeout=timeout), stream=stream)


def run(req: ModelsRequest, stream=False) -> dict:
    """Run `req` on `req.nproc` ranks (and in one process with `req.compare`)."""
    results = launch("cpcourse.models.compare:rank_forward", req.nproc, timeout=req.timeout,
                     args=(req,), stream=stream, threads=req.threads_per_rank)
    r0 = results[0]
    report = {"arch": req.arch, "method": req.mesh_method, "nproc": req.nproc,
              "tokens": req.tokens, "split": req.split,
              "frame_sizes": r0["frame_sizes"], "tokens_per_rank": r0["tokens_per_rank"],
              "ulysses": r0["ulysses"], "ring": r0["ring"],
              "dtype": req.dtype, "sample_steps": req.sample_steps,
              "shard_io": bool(req.shard_io),
              "seconds_cp": max((r["seconds"] or 0.0) for r in results) or None,
              "ranks_identical": all(torch.equal(r0["out"], r["out"]) for r in results)}
    if req.layout is not None:
        measured = [r["bytes_by_dim"] for r in results]
        predicted = [r["predicted_bytes_by_dim"] for r in results]
        report.update(layout=req.layout.as_dict(), bytes_by_dim_per_rank=measured,
                      predicted_bytes_by_dim_per_rank=predicted,
                      bytes_match_prediction=None if None in predicted else measured == predicted)
    if req.compare:
        report.update(compare_with_one_process(req, results, report))
    return report


def compare_with_one_process(req: ModelsRequest, results: list, report: dict) -> dict:
    """The ranks' outputs against this process's: error, tolerance, times."""
    threads = torch.get_num_threads()
    single = req.threads_single or req.nproc  # as many threads as ranks: the same cores
    torch.set_num_threads(single)
    try:
        ref, seconds = reference(req)
    finally:
        torch.set_num_threads(threads)
    err = max(float((r["out"].double() - ref.double()).abs().max()) for r in results)
    scale = float(ref.double().abs().max())
    tol = tolerance("usp" if req.layout is not None else req.method, req.dtype, guidance(req),
                    scale=scale)
    extra = {"max_abs_err": err, "max_abs_output": scale, "tolerance": tol,
             "within_tolerance": err <= tol, "seconds_single": seconds,
             "threads_single": single}
    if seconds and report["seconds_cp"]:
        extra["ratio_cp_to_single"] = report["seconds_cp"] / seconds
    return extra


def diffusers_cp_rank(spec) -> dict:
    """On each rank: try diffusers' `enable_parallelism` on the same model; time it if it runs.
    `spec`: a ModelsRequest or a dict of its fields."""
    from diffusers import ContextParallelConfig

    from cpcourse.models.compare import model_and_inputs

    req = as_request(spec)
    model, inputs = model_and_inputs(req)
    degree = {"ulysses_degree": req.nproc} if req.method == "ulysses" else {
        "ring_degree": req.nproc}
    try:
        model.enable_parallelism(config=ContextParallelConfig(**degree))
        with torch.inference_mode():
            out = model(**inputs, return_dict=False)[0]
            t0 = time.perf_counter()
            model(**inputs, return_dict=False)
        return {"ran": True, "seconds": time.perf_counter() - t0, "out": out}
    except Exception as exc:  # noqa: BLE001  the reason is the result
        where = exc.__traceback__
        while where.tb_next is not None:
            where = where.tb_next
        frame = where.tb_frame.f_code
        return {"ran": False, "reason": f"{type(exc).__name__}: {str(exc).splitlines()[0]} "
                f"(in {frame.co_name}, {frame.co_filename.split('site-packages/')[-1]})"}
