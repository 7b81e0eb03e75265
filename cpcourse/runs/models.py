"""A real diffusers video transformer on P ranks under CP, against one process: `cpcourse models`.

    cpcourse models --arch wan --nproc 2 --method ring --compare --json

`run_models(spec, nproc)` checks `spec` (`cpcourse.models.compare.check_spec`: arch, method or
layout, latent sizes, dtype, ...), runs `cpcourse.models.compare.rank_forward` on the ranks, and
reports the tokens, each rank's frames, times, the bytes per mesh dim against the prediction, and
with `compare` the largest difference from the same model in one process. `diffusers_cp_rank`
is the rank function that tries diffusers' own `enable_parallelism` on the same model instead.
"""

from __future__ import annotations

import time

import torch

from cpcourse.launch import check_nproc, launch
from cpcourse.models.compare import check_spec, guidance, reference, tolerance


def run_models(spec: dict, nproc: int, compare: bool = True, timeout: float = 300.0,
               stream=False) -> dict:
    """Run `spec` (see cpcourse.models.compare) on `nproc` ranks, and in one process."""
    nproc = check_nproc(nproc)
    info = check_spec(spec, nproc)
    results = launch("cpcourse.models.compare:rank_forward", nproc, timeout=timeout,
                     args=(spec,), stream=stream, threads=spec.get("threads_per_rank", 1))
    r0 = results[0]
    method = spec["method"] if not spec.get("layout") else "mesh"
    report = {"arch": spec["arch"], "method": method, "nproc": nproc,
              "tokens": info["tokens"], "split": spec.get("split", "frames"),
              "frame_sizes": r0["frame_sizes"], "tokens_per_rank": r0["tokens_per_rank"],
              "ulysses": r0["ulysses"], "ring": r0["ring"],
              "dtype": spec.get("dtype", "float32"), "sample_steps": spec.get("sample_steps"),
              "shard_io": bool(spec.get("shard_io")),
              "seconds_cp": max((r["seconds"] or 0.0) for r in results) or None,
              "ranks_identical": all(torch.equal(r0["out"], r["out"]) for r in results)}
    if spec.get("layout"):
        measured = [r["bytes_by_dim"] for r in results]
        predicted = [r["predicted_bytes_by_dim"] for r in results]
        report.update(layout=spec["layout"], bytes_by_dim_per_rank=measured,
                      predicted_bytes_by_dim_per_rank=predicted,
                      bytes_match_prediction=None if None in predicted else measured == predicted)
    if compare:
        threads = torch.get_num_threads()
        torch.set_num_threads(spec.get("threads_single", nproc))
        try:
            ref, seconds = reference(spec)
        finally:
            torch.set_num_threads(threads)
        err = max(float((r["out"].double() - ref.double()).abs().max()) for r in results)
        scale = float(ref.double().abs().max())
        tol = tolerance("usp" if spec.get("layout") else spec["method"], report["dtype"],
                        guidance(spec), scale=scale)
        report.update(max_abs_err=err, max_abs_output=scale, tolerance=tol,
                      within_tolerance=err <= tol, seconds_single=seconds,
                      threads_single=spec.get("threads_single", nproc))
        if seconds and report["seconds_cp"]:
            report["ratio_cp_to_single"] = report["seconds_cp"] / seconds
    return report


def diffusers_cp_rank(spec: dict) -> dict:
    """On each rank: try diffusers' `enable_parallelism` on the same model; time it if it runs."""
    from diffusers import ContextParallelConfig

    from cpcourse.models.compare import model_and_inputs

    model, inputs = model_and_inputs(spec)
    degree = {"ulysses_degree": spec["nproc"]} if spec["method"] == "ulysses" else {
        "ring_degree": spec["nproc"]}
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
