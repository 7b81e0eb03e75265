"""Benchmark: the ring (overlapped, blocking), all-gather, Ulysses, torch's context parallel and
one-process fused attention, in ONE launch on the same inputs.

    cpcourse bench ring --nproc 2 --json
    cpcourse bench ring --nproc 4 --seq-len 4096 --heads 8 --head-dim 64
    cpcourse bench ring --quick --json         # seconds, for tests

Every rank builds the same seeded q, k, v `[1, H, L, D]` (float32) and keeps its shard. Each
method runs once to warm up, then `--repeats` times, interleaved (A B C ..., then reversed) so a
noisy neighbour hits all alike; a run's time is the slowest rank's (all-reduce MAX) after a
barrier, and the median is reported. Ranks use one thread each; the one-process baseline runs
on rank 0 alone with P threads (the same cores). torch's `context_parallel` + SDPA (CPU/gloo,
non-causal, load balancing off) is skipped when L % P != 0, where it aborts the process.
Also reported: per ring step, compute and time in communication calls (overlapped: the exposed
part; blocking: all of it), the share of communication the overlap hid, and the peak tensor
memory per rank (`cpcourse.support.peak_memory.peak_memory`) against `predicted_peak_bytes`.
What each rank runs is in `cpcourse.bench.ring_rank`; this module checks, launches, reports.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

from cpcourse.support.errors import positive_int, require
from cpcourse.support.modes import ALWAYS, refuse_inactive
from cpcourse.support.peak_memory import require_fits
from cpcourse.support.request import check_common, flag
from cpcourse.support.request_flags import build_parser, mode_table, request_values

METHODS = ("ring_overlap", "ring_blocking", "allgather", "ulysses", "torch_cp", "fused")
LABELS = {"ring_overlap": "ring (overlapped)", "ring_blocking": "ring (blocking)",
          "allgather": "all-gather K/V", "ulysses": "Ulysses (all-to-all)",
          "torch_cp": "torch context_parallel", "fused": "one process, fused"}


@dataclass(frozen=True)
class RingBenchRequest:
    """One `cpcourse bench ring` launch, checked: the fields are its flags (one declaration);
    `bench_rank(req)` reads them on every rank. `methods`: a comma-separated text or a tuple,
    a tuple once made."""

    nproc: int = flag(2, "ranks", acts="sized")
    seq_len: int = flag(16384, "tokens L", acts="not_quick")
    heads: int = flag(8, "heads H", acts="sized")
    head_dim: int = flag(64, "channels per head D", acts="sized")
    repeats: int = flag(3, "timed rounds after a warm-up", acts="not_quick")
    timeout: float = flag(600.0, "seconds the ranks may run", acts="launched")
    methods: tuple | str = flag(",".join(METHODS), "comma-separated subset of "
                                + ",".join(METHODS), acts="launched")

    def __post_init__(self):
        check_common(self, whole=("seq_len", "heads", "head_dim", "repeats"))
        require(self.repeats <= 1000, f"repeats {self.repeats}: use at most 1000")
        methods = self.methods
        if isinstance(methods, str):
            methods = tuple(m.strip() for m in methods.split(",") if m.strip())
        object.__setattr__(self, "methods", tuple(methods))  # set once, when made
        unknown = sorted(set(self.methods) - set(METHODS))
        require(not unknown, f"methods: unknown {', '.join(unknown)}; choose from "
                f"{', '.join(METHODS)}")
        require({"ring_overlap", "ring_blocking", "fused"} <= set(self.methods),
                "methods must include ring_overlap, ring_blocking and fused (what the others "
                "are compared with)")
        # Each rank builds the whole q, k, v, then runs the method with the largest peak.
        whole = 3 * self.seq_len * self.heads * self.head_dim * 4
        peak = max(predicted_peak_bytes(m, self.seq_len, self.nproc, self.heads,
                                        self.head_dim) or 0 for m in self.methods)
        require_fits(self.nproc * (whole + peak), f"seq_len {self.seq_len} on {self.nproc} "
                     "ranks", "use a smaller `seq_len`, `heads` or `nproc`")


def _parser() -> argparse.ArgumentParser:
    """RingBenchRequest's fields as flags (`cpcourse.support.request_flags`), --json, and the
    flags of the modes that are not one launch of the Request."""
    p = build_parser("cpcourse bench ring", RingBenchRequest, __doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="L=1024, one repeat: for tests")
    p.add_argument("--small", action="store_true",
                   help="per-call overhead at 64, 256 and 1,024 tokens per rank (2 ranks)")
    p.add_argument("--calls", type=int, default=40, help="--small: calls per median (40)")
    p.add_argument("--compute-only", action="store_true",
                   help="no processes: P virtual ranks' blockwise attention + merge on one "
                        "device against one fused call over the whole sequence")
    p.add_argument("--device", default=None, help="for --compute-only: cpu or cuda")
    return p


# Each flag with the mode it acts in (`cpcourse.support.modes`): --small measures per-call overhead
# on its own fixed sizes, --compute-only runs no processes, --quick fixes the length and repeats.
# The Request's flags say theirs in their fields (`acts`).
MODE_FLAGS = {"json": ALWAYS, "small": ALWAYS, "calls": "small", "quick": "sized",
              "compute_only": "sized", "device": "compute_only"} | mode_table(RingBenchRequest)


def mode_conditions(args: argparse.Namespace) -> dict[str, tuple[bool, str]]:
    """Which of MODE_FLAGS' conditions these arguments meet, and what each needs."""
    sized = not args.small
    return {"small": (args.small, "--small"),
            "sized": (sized, "no --small (it measures 2 ranks at its own sizes)"),
            "not_quick": (sized and not args.quick, "no --small and no --quick (--quick runs "
                          "L=1024 once)"),
            "compute_only": (sized and args.compute_only, "--compute-only"),
            "launched": (sized and not args.compute_only, "processes: no --small and no "
                         "--compute-only")}


def predicted_peak_bytes(method: str, seq_len: int, world: int, heads: int, head_dim: int,
                         elem: int = 4) -> int | None:
    """Tensor bytes a rank allocates at peak in each method, counted from the algorithm.

    Unit: one token of one tensor over all heads, `H * D * elem` bytes; Lr = ceil(L / P).
    ring: two K/V receive buffers, 4 Lr (the cost model's `ring_kv_bytes_held_per_rank`), plus
    the running output and the block's output (2 Lr: the ring folds each block in place), and
    lse-sized rows: the running and the block's lse and the fold's temporaries, 6 at the peak.
    all-gather: the padded local K/V (2 Lr), the gathered buffer (2 P Lr) and the whole K/V cut
    out of it (2 L). Ulysses, while moving to heads: packed q, k, v
    (3 Lr), its send layout (3 Lr), the received pieces (3 Lr) and their concatenation (3 Lr).
    fused: the output and its lse. torch_cp: None (DTensor's internals are not modelled).
    """
    if method == "torch_cp":
        return None
    lr = -(-seq_len // world)
    tok, lse = heads * head_dim * elem, heads * 4
    if world == 1 or method == "fused":
        return seq_len * (tok + lse)
    if method in ("ring_overlap", "ring_blocking"):
        return 6 * lr * (tok + lse)
    if method == "allgather":
        return (2 * lr + 2 * world * lr + 2 * seq_len) * tok
    return 12 * lr * tok  # ulysses


def summarize(req: RingBenchRequest, results: list[dict]) -> dict:
    """One report from the ranks' dicts: times, ratios, steps, hidden share, memory."""
    r0, world = results[0], req.nproc
    seconds = r0["seconds"]
    fused, tcp = seconds.get("fused"), seconds.get("torch_cp")
    methods = {}
    for name in METHODS:
        if name in r0["skipped"]:
            methods[name] = {"skipped": r0["skipped"][name]}
            continue
        peaks = [r["peak_bytes"][name] for r in results]
        methods[name] = {
            "seconds": seconds[name], "repeats": r0["all_seconds"][name],
            "ratio_vs_fused": seconds[name] / fused if fused else None,
            "ratio_vs_torch_cp": seconds[name] / tcp if tcp else None,
            "peak_bytes_per_rank": max(peaks) if name != "fused" else peaks[0],
            "predicted_peak_bytes": predicted_peak_bytes(name, req.seq_len, world, req.heads,
                                                         req.head_dim),
            "first_call_seconds": r0["first_call_seconds"][name],
            "max_abs_diff_vs_fused": r0["max_abs_diff_vs_fused"][name]}
    steps = []
    for step in range(world):
        row = {"step": step}
        for name in ("ring_overlap", "ring_blocking"):
            mine = [s for r in results for s in r["steps"][name] if s["step"] == step]
            row[f"{name}_compute_s"] = max(s["compute_s"] for s in mine)
            row[f"{name}_comm_s"] = max(s["comm_s"] for s in mine)
        row["bytes_sent_per_rank"] = max(s["bytes_sent"] for r in results
                                         for s in r["steps"]["ring_overlap"] if s["step"] == step)
        steps.append(row)
    exposed = sum(r["ring_overlap_comm_s"] for r in steps)
    full = sum(r["ring_blocking_comm_s"] for r in steps)
    hidden = max(0.0, 1.0 - exposed / full) if full > 0 else None
    over, block = seconds["ring_overlap"], seconds["ring_blocking"]
    return {"nproc": world, "seq_len": req.seq_len, "heads": req.heads,
            "head_dim": req.head_dim, "dtype": "float32", "batch": 1, "backend": "gloo",
            "threads_per_rank": 1, "fused_threads": world, "repeats": req.repeats,
            "methods": methods, "steps": steps, "comm_hidden_share": hidden,
            "torch_cp_output_layout": r0["torch_cp_output_layout"],
            "targets": {
                "overlap_vs_fused_max_ratio": 1.05,
                "overlap_within_fused_x1.05": bool(fused and over <= 1.05 * fused),
                "overlap_no_slower_than_torch_cp": (bool(over <= tcp) if tcp else None),
                "overlap_faster_than_blocking": over < block}}


def _text(rep: dict) -> str:
    lines = [f"cpcourse bench ring: P={rep['nproc']} L={rep['seq_len']} H={rep['heads']} "
             f"D={rep['head_dim']} float32, gloo, 1 thread per rank (fused: "
             f"{rep['fused_threads']} threads), median of {rep['repeats']}",
             f"{'method':<26}{'seconds':>9}{'/fused':>8}{'/torchCP':>9}{'peak MB':>9}"
             f"{'pred MB':>9}{'max diff':>10}"]
    if "seconds" in rep["methods"]["torch_cp"]:
        tcp = rep["methods"]["torch_cp"]
        notes = [f"torch context_parallel: first call {tcp['first_call_seconds']:.1f} s "
                 f"(DTensor sharding propagation), output sharded by "
                 f"{rep['torch_cp_output_layout']}"]
    else:
        notes = []
    for name, m in rep["methods"].items():
        if "skipped" in m:
            lines.append(f"{LABELS[name]:<26}  skipped: {m['skipped']}")
            continue
        ratio = lambda x: f"{x:8.2f}" if x is not None else f"{'-':>8}"  # noqa: E731
        pred_mb = lambda x: f"{x / 1e6:9.1f}" if x is not None else f"{'-':>9}"  # noqa: E731
        lines.append(f"{LABELS[name]:<26}{m['seconds']:9.3f}{ratio(m['ratio_vs_fused'])}"
                     f"{ratio(m['ratio_vs_torch_cp'])} {m['peak_bytes_per_rank'] / 1e6:8.1f}"
                     f"{pred_mb(m['predicted_peak_bytes'])}{m['max_abs_diff_vs_fused']:10.1e}")
    lines.append(f"{'step':>4}{'compute ms':>12}{'exposed comm ms':>17}{'blocking comm ms':>18}"
                 f"{'MB sent/rank':>14}")
    for s in rep["steps"]:
        lines.append(f"{s['step']:>4}{1e3 * s['ring_overlap_compute_s']:12.1f}"
                     f"{1e3 * s['ring_overlap_comm_s']:17.1f}"
                     f"{1e3 * s['ring_blocking_comm_s']:18.1f}"
                     f"{s['bytes_sent_per_rank'] / 1e6:14.2f}")
    hidden = rep["comm_hidden_share"]
    lines.append("communication hidden by overlap: "
                 + (f"{100 * hidden:.0f}%" if hidden is not None else "n/a (P = 1)"))
    lines.append("targets: " + ", ".join(f"{k}={v}" for k, v in rep["targets"].items()))
    return "\n".join(lines + notes)


def main(argv: list[str]) -> int:
    from cpcourse.launch import launch

    parser = _parser()
    args = parser.parse_args(argv)
    refuse_inactive(parser, args, MODE_FLAGS, mode_conditions(args))
    if args.small:
        from cpcourse.bench import overhead

        calls = positive_int("--calls", args.calls)
        require(calls <= 1000, f"--calls {calls}: use at most 1000")
        return overhead.main(calls, args.json)
    values = request_values(RingBenchRequest, args)
    if args.quick:
        values.update(seq_len=1024, repeats=1)
    req = RingBenchRequest(**values)
    if args.compute_only:
        import torch

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        require(device in ("cpu", "cuda"), f"--device must be cpu or cuda, got {device!r}")
        require(device == "cpu" or torch.cuda.is_available(), "--device cuda: no CUDA here")
        from cpcourse.sim import compute_path

        rep = compute_path(req.seq_len, req.nproc, req.heads, req.head_dim, device,
                           req.repeats)
        print(json.dumps(rep, allow_nan=False) if args.json
              else "\n".join(f"{k}: {v}" for k, v in rep.items()))
        return 0
    # by name: ring_rank imports METHODS from here
    results = launch("cpcourse.bench.ring_rank:bench_rank", req.nproc, timeout=req.timeout,
                     args=(req,), threads=1, pg_timeout=max(60.0, req.timeout / 2),
                     stream=lambda line: print(line, end="", file=sys.stderr, flush=True))
    report = summarize(req, sorted(results, key=lambda r: r["rank"]))
    print(json.dumps(report, allow_nan=False) if args.json else _text(report))
    return 0
