"""The cost model: memory, FLOPs and communication of attention under context parallelism.

    cpcourse memory --tokens 432000 --hidden 4096 --heads 32 --dtype fp16 --cp 8 --json
    cpcourse comm --tokens 432000 --cp 8 --heads 32 --head-dim 128 --bandwidth 450 --json

All counts are for one attention layer, one forward pass, batch 1, per GPU, unless a key says
otherwise (`..._per_forward` multiplies by layers). Bytes are integers; bandwidth is decimal
GB/s (1 GB = 1e9 B); times are seconds. A sequence of N tokens on P ranks is split like
`torch.tensor_split`: the largest shard holds ceil(N / P) tokens, and that rank sets the pace.
"""

from __future__ import annotations

import math

from cpcourse.planner.hardware import get_gpu, get_link, kernel_efficiency
from cpcourse.support.dtypes import canonical, nbytes
from cpcourse.support.errors import InputError, positive_float, positive_int, require
from cpcourse.support.shards import shard_sizes

CALCULATOR_DTYPES = ("fp32", "bf16", "fp16")  # what `--dtype` of the calculators takes


# A bound on any GPU count the calculators take: ten times the largest cluster ever built. Past it
# an input is a typo, and an honest answer would need lists as long as the count.
MAX_GPUS = 1 << 20


def tokens_per_rank(tokens: int, cp: int) -> int:
    """The largest shard when `tokens` are planned over `cp` GPUs: ceil(tokens / cp), checked."""
    tokens, cp = positive_int("tokens", tokens), positive_int("cp", cp)
    require(cp <= MAX_GPUS, f"cp {cp} is more GPUs than any cluster has: use {MAX_GPUS} or fewer")
    require(cp <= tokens, f"cp {cp} is larger than the {tokens} tokens to split: "
            f"use cp={tokens} or fewer")
    return -(-tokens // cp)


def planned_shard_sizes(tokens: int, cp: int) -> list[int]:
    """Tokens on each rank when a sequence is planned over `cp` GPUs (every GPU gets one)."""
    tokens_per_rank(tokens, cp)  # the same checks, before a list of cp entries is built
    return shard_sizes(tokens, cp)


def attention_flops(lq: int, lk: int, head_dim: int, heads: int) -> int:
    """Forward FLOPs of one attention call: QK^T and PV, 2 * 2 * Lq * Lk * D per head."""
    return 4 * lq * lk * head_dim * heads


def memory(tokens: int, hidden: int, heads: int, *, dtype: str = "bf16", cp: int = 1,
           ffn: int | None = None, layers: int | None = None, params_b: float | None = None,
           cfg_batch: int = 1) -> dict:
    """Memory of one attention layer's tensors, whole and per rank under CP.

    `cfg_batch` = 2 when the conditional and unconditional passes run as one batch. Weights are
    replicated on every CP rank: CP divides activations, never weights.
    """
    b = nbytes(canonical(dtype, CALCULATOR_DTYPES))
    hidden, heads = positive_int("hidden", hidden), positive_int("heads", heads)
    require(hidden % heads == 0, f"hidden {hidden} is not divisible by heads={heads}: "
            "pick heads that divide the hidden width")
    cfg_batch = positive_int("cfg_batch", cfg_batch)
    ffn = 4 * hidden if ffn is None else positive_int("ffn", ffn)
    local = tokens_per_rank(tokens, cp)
    per_token_act = hidden + 3 * hidden + hidden + ffn  # x, q/k/v, attention out, MLP hidden
    out = {
        "tokens": tokens, "cp": cp, "dtype": dtype, "bytes_per_element": b,
        "hidden": hidden, "heads": heads, "head_dim": hidden // heads, "ffn": ffn,
        "cfg_batch": cfg_batch,
        "attention_matrix_entries_per_head": tokens * tokens,
        "attention_matrix_bytes_per_head": tokens * tokens * b,
        "attention_matrix_bytes": tokens * tokens * b * heads * cfg_batch,
        "qkv_bytes": 3 * tokens * hidden * b * cfg_batch,
        "hidden_state_bytes": tokens * hidden * b * cfg_batch,
        "mlp_intermediate_bytes": tokens * ffn * b * cfg_batch,
        "activation_bytes_per_layer": tokens * per_token_act * b * cfg_batch,
        "tokens_per_rank": local,
        "qkv_bytes_per_rank": 3 * local * hidden * b * cfg_batch,
        # A ring step scores the local queries against one visiting K/V block.
        "ring_step_scores_bytes_per_head": local * local * b,
        "activation_bytes_per_layer_per_rank": local * per_token_act * b * cfg_batch,
        # The K/V block in flight doubles the K/V a rank holds during the ring.
        "ring_kv_buffer_bytes_per_rank": 2 * 2 * local * hidden * b * cfg_batch,
    }
    if params_b is not None:
        weights = int(positive_float("params_b", params_b, high=1e6) * 1e9 * b)
        out["weights_bytes"] = weights
        out["per_gpu_bytes"] = (weights + out["activation_bytes_per_layer_per_rank"]
                                + out["ring_kv_buffer_bytes_per_rank"])
    if layers is not None:
        out["layers"] = positive_int("layers", layers)
    return out


def _rate(gpu: str, attention_efficiency: float | None) -> tuple[float, dict]:
    g = get_gpu(gpu)
    eff = g.attention_efficiency if attention_efficiency is None else attention_efficiency
    require(1e-3 <= eff <= 1, f"attention_efficiency must be in [0.001, 1], got {eff}")
    return g.attention_flops(eff), {
        "gpu": g.id, "gpu_bf16_tflops": g.bf16_tflops, "attention_efficiency": eff,
        # the GPU's default kernel (`cpcourse.planner.hardware.default_kernel`) unless a rate
        # was given
        "kernel": g.kernel if attention_efficiency is None else None,
        "attention_efficiency_source": (g.efficiency_source if attention_efficiency is None
                                        else "given on the command line"),
        "effective_tflops": g.bf16_tflops * eff,
    }


def _bandwidth(link: str | None, bandwidth_gbps: float | None,
               link_efficiency: float | None) -> tuple[float, dict]:
    if (link is None) == (bandwidth_gbps is None):
        raise InputError("give exactly one of `link` (a name) or `bandwidth_gbps`")
    if link is not None:
        lk = get_link(link)
        eff = lk.efficiency if link_efficiency is None else link_efficiency
        info = {"link": lk.id, "link_GBps": lk.gbps_per_direction, "link_source": lk.source}
    else:
        # A bandwidth given by hand is taken at face value unless an efficiency is given too.
        eff = 1.0 if link_efficiency is None else link_efficiency
        gbps = positive_float("bandwidth_gbps", bandwidth_gbps, low=1e-3, high=1e6)
        info = {"link": None, "link_GBps": gbps}
    require(1e-3 <= eff <= 1, f"link_efficiency must be in [0.001, 1], got {eff}")
    info.update(link_efficiency=eff, effective_GBps=info["link_GBps"] * eff)
    return info["effective_GBps"] * 1e9, info


def comm(tokens: int, cp: int, heads: int, head_dim: int, *, dtype: str = "bf16",
         link: str | None = None, bandwidth_gbps: float | None = None,
         link_efficiency: float | None = None, gpu: str = "h100",
         attention_efficiency: float | None = None, layers: int = 1, cfg_forwards: int = 1
         ) -> dict:
    """Ring, Ulysses and all-gather traffic of one attention layer, and whether the ring hides.

    One ring step scores Lq local queries against Lk = Lq visiting keys (4 Lq^2 D H FLOPs) while
    the next K/V block (2 Lq D H bytes per element) travels one hop. The ratio compute / comm is
    2 Lq B / (F b): it grows with the tokens per rank and does not depend on H or D, so the ring
    hides its traffic once a rank holds more than F b / (2 B) tokens.
    """
    b = nbytes(canonical(dtype, CALCULATOR_DTYPES))
    heads, head_dim = positive_int("heads", heads), positive_int("head_dim", head_dim)
    layers = positive_int("layers", layers)
    cfg_forwards = positive_int("cfg_forwards", cfg_forwards)
    local = tokens_per_rank(tokens, cp)
    hops = cp - 1
    flops, rate_info = _rate(gpu, attention_efficiency)
    bw, link_info = _bandwidth(link, bandwidth_gbps, link_efficiency)
    per_hop_head = 2 * local * head_dim * b
    per_hop = per_hop_head * heads
    total = per_hop * hops
    step_flops = attention_flops(local, local, head_dim, heads)
    t_hop, t_step = per_hop / bw, step_flops / flops
    hidden = heads * head_dim
    # Ulysses: all-to-alls of Q, K, V in and O out, each keeping 1/P of the local shard at home.
    ulysses = 4 * local * hidden * b * hops // cp if cp > 1 else 0
    out = {
        "tokens": tokens, "cp": cp, "heads": heads, "head_dim": head_dim, "dtype": dtype,
        "tokens_per_rank": local, "ring_steps": cp, "ring_hops": hops,
        "kv_bytes_per_hop_per_head": per_hop_head,
        "kv_bytes_per_hop": per_hop,
        "kv_bytes_total": total,
        "kv_bytes_per_forward": total * layers * cfg_forwards,
        "layers": layers, "cfg_forwards": cfg_forwards,
        "comm_seconds_per_hop": t_hop,
        "comm_seconds_total": t_hop * hops,
        "flops_per_step": step_flops,
        "compute_seconds_per_step": t_step,
        "compute_seconds_total": t_step * cp,
        "compute_to_comm_ratio": (t_step / t_hop) if hops else None,
        "hidden": hops == 0 or t_step >= t_hop,
        "min_tokens_per_rank_to_hide": math.ceil(flops * b / (2 * bw)),
        "ulysses_bytes_per_rank": ulysses,
        "ulysses_seconds": ulysses / bw,
        "allgather_bytes_per_rank": total,
        "allgather_kv_bytes_held_per_rank": 2 * tokens * hidden * b,
        "ring_kv_bytes_held_per_rank": 2 * 2 * local * hidden * b,
    }
    out.update(rate_info)
    out.update(link_info)
    return out


def hide_threshold(gpu: str = "h100", link: str = "ib-ndr", kernel: str | None = None,
                   dtype: str = "bf16") -> dict:
    """The tokens per GPU from which a ring hop hides behind its block's attention, F b / (2 B)
    (`comm`'s `min_tokens_per_rank_to_hide`), on `gpu` with `kernel` (its default kernel,
    `cpcourse.planner.hardware.default_kernel`, unless given) over `link`: the one number
    notebooks 05 and 10 both show. Keys: tokens, kernel, attention_efficiency, link,
    effective_GBps."""
    g, lk = get_gpu(gpu), get_link(link)
    kernel = kernel or g.kernel
    eff, _ = kernel_efficiency(g.id, kernel)
    require(eff is not None, f"kernel {kernel} does not run on the {g.name}: use fa2 or sdpa")
    rate, bw = g.attention_flops(eff), lk.effective_gbps * 1e9
    b = nbytes(canonical(dtype, CALCULATOR_DTYPES))
    return {"tokens": math.ceil(rate * b / (2 * bw)), "kernel": kernel,
            "attention_efficiency": eff, "link": lk.id, "effective_GBps": lk.effective_gbps}


COMM_DTYPES = ("fp32", "bf16", "fp8", "fp8-tensor")  # as `cpcourse.fp8_comm` sends them


def comm_dtype_scale(comm_dtype: str, head_dim: int, dtype: str = "bf16") -> float:
    """How many times `dtype`'s bytes a collective moves when its activations travel as
    `comm_dtype` (scales included): fp8 per token and head adds one bf16 scale per head_dim
    values (1 + 2/D bytes a value: 0.508 of bf16 at D = 128), fp8 with one calibrated scale per
    message adds nothing that counts. Multiply a comm cost's bytes and seconds by it: what
    FP8 all-to-all (xDiT, cache-dit, LightX2V) saves on a given link."""
    require(comm_dtype in COMM_DTYPES,
            f"comm_dtype must be one of {', '.join(COMM_DTYPES)}, got {comm_dtype!r}")
    d = positive_int("head_dim", head_dim)
    per_value = {"fp32": 4.0, "bf16": 2.0, "fp8": 1.0 + 2.0 / d, "fp8-tensor": 1.0}[comm_dtype]
    return per_value / nbytes(canonical(dtype, CALCULATOR_DTYPES))


TILINGS = ("ring", "allgather", "ulysses", "usp", "attn2d")


def tiling_bytes_per_rank(method: str, tokens: int, heads: int, head_dim: int, world: int,
                          grid: tuple[int, int] | None = None, dtype_bytes: int = 2,
                          batch: int = 1) -> int:
    """Bytes the busiest rank sends in one attention call of `tokens` tokens (self-attention,
    split like tensor_split over `world` ranks), exactly as the course's code moves them.

    ring        P - 1 hops, each passing on the K/V block held: max over ranks 2 E (S - S // P)
    allgather   K/V padded to ceil(S / P), sent to P - 1 ranks: 2 E (P - 1) ceil(S / P)
    ulysses     q, k, v minus my head group, the output back: (E / P) (3 (P - 1) L + S - L),
                L = ceil(S / P) (`cpcourse.ulysses`); P must divide the heads
    usp         grid = (ring, ulysses): Ulysses inside its group, then the ring over the groups'
                blocks with H / U heads (`cpcourse.mesh.usp_elements`), worst rank
    attn2d      grid = (rows, cols) (`cpcourse.tiling`): Q to the row, K/V to the column, then
                (out, lse) home in float32 (float64 for 8-byte inputs):
                (cols - 1) L E + 2 (rows - 1) L E + (cols - 1) L B H (D + 1) acc, L = ceil(S / P)
    where E = batch x heads x head_dim x dtype_bytes, bytes per token of one tensor.
    """
    require(method in TILINGS, f"method must be one of {', '.join(TILINGS)}, got {method!r}")
    tokens, world = positive_int("tokens", tokens, allow_zero=True), positive_int("world", world)
    heads, head_dim = positive_int("heads", heads), positive_int("head_dim", head_dim)
    b, batch = positive_int("dtype_bytes", dtype_bytes), positive_int("batch", batch)
    per_token = batch * heads * head_dim * b
    lens, most = shard_sizes(tokens, world), -(-tokens // world)
    if method == "ring":
        return 2 * per_token * (tokens - min(lens))
    if method == "allgather":
        return 2 * per_token * (world - 1) * most
    if method == "ulysses":
        require(heads % world == 0, f"ulysses: {world} ranks do not divide the {heads} heads")
        return per_token // world * (3 * (world - 1) * most + tokens - most)
    require(isinstance(grid, (tuple, list)) and len(grid) == 2 and grid[0] * grid[1] == world,
            f"{method} needs grid = two degrees whose product is the world {world}, got {grid!r}")
    if method == "usp":
        return _usp_bytes(lens, per_token, heads, grid)
    rows, cols = grid
    acc = 8 if b == 8 else 4
    return ((cols - 1) * most * per_token + 2 * (rows - 1) * most * per_token
            + (cols - 1) * most * batch * heads * (head_dim + 1) * acc)


def _usp_bytes(lens: list[int], per_token: int, heads: int, grid) -> int:
    """USP's worst rank (`cpcourse.mesh.usp_elements`, per token of one tensor `per_token`)."""
    ring, u = grid
    require(heads % u == 0, f"usp: ulysses {u} does not divide the {heads} heads")
    per = per_token // u  # bytes per token of one tensor with H / U heads
    blocks = [sum(lens[g * u:(g + 1) * u]) for g in range(ring)]
    worst = 0
    for rank, n in enumerate(lens):
        g = rank // u
        a2a = per * (3 * (u - 1) * n + blocks[g] - n) if u > 1 else 0
        hops = sum(2 * per * blocks[(g - s) % ring] for s in range(ring - 1))
        worst = max(worst, a2a + hops)
    return worst
