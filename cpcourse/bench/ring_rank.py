"""What each rank of `cpcourse bench ring` runs: every method warmed up, timed and measured.

    cpcourse bench ring --nproc 2 --quick --json

`bench_rank(req)` builds the seeded q, k, v, runs each selected method (`_methods`), times the
runs interleaved with the slowest rank's time per run (`_measure`), and reports each method's
largest difference from the fused one-process output (`_errors`). `cpcourse.bench.ring` checks
the flags, launches this on the ranks and writes the report.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time

from cpcourse.bench.ring import METHODS


def bench_rank(req) -> dict:
    """What each rank runs (`req`: a `cpcourse.bench.ring.RingBenchRequest`): every method,
    warmed up, timed, memory-measured."""
    import torch
    import torch.distributed as dist

    from cpcourse.support.shards import shard

    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    shape = (1, req.heads, req.seq_len, req.head_dim)  # [1, H, L, D]
    whole = [torch.randn(shape, generator=g) for _ in range(3)]
    mine = [shard(x, rank, world) for x in whole]  # [1, H, L/P, D] each
    stats: dict[str, list] = {}
    methods = _methods(rank, world, whole, mine, stats)
    skipped = {m: "not selected (--methods)" for m in METHODS if m not in req.methods}
    if req.heads % world:
        skipped["ulysses"] = f"{req.heads} heads are not divisible by P={world}"
    if req.seq_len % world:
        skipped["torch_cp"] = "L % P != 0: torch's context_parallel aborts on uneven shards"
    active = [m for m in METHODS if m not in skipped]
    outputs, peaks, first, times, kept = _measure(req.repeats, active, methods, whole, world, stats)
    errors = _errors(req.heads, world, outputs) if rank == 0 else {}
    medians = {name: statistics.median(t) for name, t in times.items()}
    steps = {}
    for name, runs in kept.items():  # the stats of the run whose time was the median
        order = sorted(range(len(runs)), key=lambda i: times[name][i])
        steps[name] = runs[order[len(order) // 2]]
    layout = None
    if "torch_cp" in outputs:
        layout = "sequence" if outputs["torch_cp"].shape[1] == req.heads else "heads"
    return {"rank": rank, "seconds": medians, "all_seconds": times, "peak_bytes": peaks,
            "first_call_seconds": first, "max_abs_diff_vs_fused": errors, "steps": steps,
            "skipped": skipped, "torch_cp_output_layout": layout}


def _methods(rank: int, world: int, whole: list, mine: list, stats: dict) -> dict:
    """Each method as (prepare or None, run): run(state) is the call that is timed."""
    import torch

    from cpcourse.attention import attention_with_lse
    from cpcourse.ring import ring_attention
    from cpcourse.ulysses import ulysses_attention

    def ring(mode):
        def run(_state):
            stats[f"ring_{mode}"] = []
            return ring_attention(*mine, mode=mode, stats=stats[f"ring_{mode}"])
        return None, run

    def fused(_state):
        if rank != 0:
            return None
        torch.set_num_threads(world)  # the same cores the P ranks use
        try:
            return attention_with_lse(*whole)[0]
        finally:
            torch.set_num_threads(1)

    return {"ring_overlap": ring("overlap"), "ring_blocking": ring("blocking"),
            "allgather": (None, lambda _s: ring_attention(*mine, mode="allgather")),
            "ulysses": (None, lambda _s: ulysses_attention(*mine)),
            "torch_cp": (_torch_cp_prepare, lambda s: s[1](*s[2])),
            "fused": (None, fused)}


def _measure(repeats: int, active: list, methods: dict, whole: list, world: int,
             stats: dict) -> tuple:
    """Warm up, measure memory, then time `repeats` interleaved rounds: (outputs, peaks,
    first-call seconds, every round's seconds, the ring runs' step stats per round)."""
    import torch
    import torch.distributed as dist

    from cpcourse.support.peak_memory import peak_memory

    def once(name, measure_memory=False):
        prepare, run = methods[name]
        state = prepare(whole, world) if prepare else None
        try:
            dist.barrier()
            start = time.perf_counter()
            if measure_memory:
                out, peak = peak_memory(run, state)
            else:
                out, peak = run(state), None
            elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            return out, float(elapsed), peak
        finally:
            if state is not None:
                state[0].close()

    outputs, peaks, first = {}, {}, {}
    with torch.no_grad():
        for name in active:  # warm-up and outputs; then memory (the instrumented run is untimed)
            outputs[name], first[name], _ = once(name)
            peaks[name] = once(name, measure_memory=True)[2]
        times = {name: [] for name in active}
        kept = {name: [] for name in ("ring_overlap", "ring_blocking")}
        for rep in range(repeats):
            for name in (active if rep % 2 == 0 else active[::-1]):
                times[name].append(once(name)[1])
                if name in kept:
                    kept[name].append(stats[name])
    return outputs, peaks, first, times, kept


def _errors(heads: int, world: int, outputs: dict) -> dict:
    """Rank 0's max abs difference of each method against the fused output over the whole
    sequence, on rank 0's part."""
    from cpcourse.support.shards import shard

    errors = {}
    full, hp = outputs["fused"], heads // world
    for name, out in outputs.items():
        if name == "fused":
            want = full
        elif out.shape[1] == heads:  # a sequence shard (ours)
            want = shard(full, 0, world)  # rank 0's rows [1, H, L/P, D]
        else:  # torch CP hands back a head shard: DTensor moved sequence -> heads
            want = full[:, :hp]  # rank 0's heads [1, H/P, L, D]
        errors[name] = float((out - want).abs().max()) if out.numel() else 0.0
    return errors


_MESHES: dict = {}


def _torch_cp_prepare(whole, world):
    """Enter torch's context_parallel for fresh copies of the whole q, k, v (it shards them)."""
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import _cp_options

    _cp_options.enable_load_balance = False  # load balancing is for causal masks; it raises here
    # On CPU, DTensor moves sequence -> heads by all-gather + chunk, and warns once per rank.
    logging.getLogger("torch.distributed.tensor._collective_utils").setLevel(logging.ERROR)
    if world not in _MESHES:  # one mesh (a new process group) per run, not per call
        _MESHES[world] = init_device_mesh("cpu", (world,))
    mesh = _MESHES[world]
    bufs = [x.clone() for x in whole]
    stack = contextlib.ExitStack()
    stack.enter_context(context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2, 2, 2],
                                         no_restore_buffers=set(bufs)))
    return stack, F.scaled_dot_product_attention, bufs
