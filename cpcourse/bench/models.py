"""`cpcourse bench models`: real Wan under CP at a compute-bound size, and diffusers' own CP.

    cpcourse bench models --nproc 2 --json

Wan's own diffusers class with 4 heads x 64, 2 layers and 8 x 64 x 64 latents (8,192 tokens after
2 x 2 patches): attention dominates, so splitting it shows. The ratio `seconds_cp /
seconds_single` compares P ranks with one thread each against one process with P threads (the
same cores), measured in one run, medians of `--repeat` forwards. Then the same model through
diffusers' own `enable_parallelism` (Ulysses and ring), unpatched: where it cannot run, the
reason is reported in one line, as it was raised.
"""

from __future__ import annotations

import json
import time

import torch

from cpcourse.launch import check_nproc, launch
from cpcourse.models.compare import check_spec, reference, tolerance
from cpcourse.support.errors import ArgumentParser, positive_float, positive_int, require


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
              "tokens": info["tokens"], "frame_sizes": r0["frame_sizes"],
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
        tol = tolerance("usp" if spec.get("layout") else spec["method"], report["dtype"],
                        bool(spec.get("sample_steps")))
        report.update(max_abs_err=err, max_abs_output=float(ref.abs().max()), tolerance=tol,
                      within_tolerance=err <= tol, seconds_single=seconds,
                      threads_single=spec.get("threads_single", nproc))
        if seconds and report["seconds_cp"]:
            report["ratio_cp_to_single"] = report["seconds_cp"] / seconds
    return report


BENCH_CONFIG = {"num_attention_heads": 4, "attention_head_dim": 64, "ffn_dim": 256,
                "num_layers": 2}


def diffusers_cp_rank(spec: dict) -> dict:
    """On each rank: try diffusers' `enable_parallelism` on the same model; time it if it runs."""
    from diffusers import ContextParallelConfig

    from cpcourse.models.compare import _model_and_inputs

    model, inputs = _model_and_inputs(spec)
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


def main(argv: list[str]) -> int:
    from cpcourse.launch import LaunchError

    p = ArgumentParser(prog="cpcourse bench models", description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--size", type=int, default=64, help="latent height = width (64)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--methods", default="ring,ulysses")
    p.add_argument("--no-diffusers", action="store_true", help="skip diffusers' own CP")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    nproc = positive_int("--nproc", args.nproc)
    size = positive_int("--size", args.size)
    require(size % 2 == 0 and size <= 128, "--size must be even and at most 128")
    repeat = positive_int("--repeat", args.repeat)
    require(repeat <= 10, "--repeat: use at most 10")
    timeout = positive_float("--timeout", args.timeout, high=3600)
    base = {"arch": "wan", "frames": positive_int("--frames", args.frames), "height": size,
            "width": size, "seed": 0, "repeat": repeat, "config": BENCH_CONFIG}
    report = {"arch": "wan", "config": BENCH_CONFIG, "latents": [1, 4, args.frames, size, size],
              "nproc": nproc, "threads_per_rank": 1, "threads_single": nproc, "runs": []}
    for method in args.methods.split(","):
        r = run_models({**base, "method": method}, nproc, timeout=timeout)
        report["tokens"] = r["tokens"]
        report["runs"].append({k: r[k] for k in ("method", "seconds_cp", "seconds_single",
                                                 "ratio_cp_to_single", "max_abs_err",
                                                 "within_tolerance")})
        if not args.json:
            print(f"{method:9s} {nproc} ranks x 1 thread: {r['seconds_cp']:.3f} s; one process "
                  f"x {nproc} threads: {r['seconds_single']:.3f} s; ratio "
                  f"{r['ratio_cp_to_single']:.2f}; max err {r['max_abs_err']:.1e}")
    if not args.no_diffusers:
        report["diffusers"] = []
        for method in ("ulysses", "ring"):
            spec = {**base, "method": method, "nproc": nproc}
            try:
                res = launch("cpcourse.bench.models:diffusers_cp_rank", nproc, timeout=timeout,
                             args=(spec,), stream=False)
                row = {k: v for k, v in res[0].items() if k != "out"}
            except LaunchError as exc:
                row = {"ran": False, "reason": exc.summary()}
            report["diffusers"].append({"method": method, **row})
            if not args.json:
                print(f"diffusers enable_parallelism ({method}): " + (
                    f"{row['seconds']:.3f} s" if row["ran"] else f"does not run: {row['reason']}"))
    if args.json:
        print(json.dumps(report, allow_nan=False))
    return 0
