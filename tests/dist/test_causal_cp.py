"""Block-causal attention and the KV cache's three designs on real processes (gloo), P = 1..4.

    python -m pytest tests/dist/test_causal_cp.py -q

One launch per world size runs every scheme, method and cache design; the ranks return numbers
and the assertions happen here, so a failure names the case. Outputs are checked against one
process's float64 attention; bytes are measured (`count_bytes`) and compared with closed forms.
"""

import pytest
import torch

from cpcourse.launch import launch

pytestmark = pytest.mark.dist

# (frames, chunk, tokens_per_frame, B, H, D): 8 equal chunks; 4 chunks, the last shorter; 5 chunks
CASES = [(8, 1, 2, 1, 2, 4), (7, 2, 3, 1, 2, 4), (9, 2, 1, 2, 1, 3)]
STREAM = (1, 4, 4, 5, 9)  # B, H, D, tokens per new chunk (P does not divide it), chunks
UNEVEN = [3, 1, 6]  # a chunk smaller than P: some ranks hold none of it
TOL = 1e-6  # float32 against float64


def _masked_reference(q, k, v, mask):
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return torch.softmax(scores.masked_fill(~mask, -torch.inf), dim=-1) @ v


def _block_causal_rows(rank, world):
    from cpcourse import causal
    from cpcourse.support.bytecount import count_bytes

    rows = []
    for i, (frames, chunk, tpf, b, h, d) in enumerate(CASES):
        gen = torch.Generator().manual_seed(i)
        q, k, v = (torch.randn(b, h, frames * tpf, d, generator=gen, dtype=torch.float64)
                   for _ in range(3))
        layout = causal.chunk_of_frames(frames, chunk, tpf)
        want = _masked_reference(q, k, v, causal.block_causal_mask(frames, chunk, tpf))
        for scheme in causal.SCHEMES:
            a = causal.assign_chunks(int(layout.max()) + 1, world, scheme,
                                     causal.chunk_sizes(layout))
            idx = causal.rank_tokens(layout, a, rank)
            mine = [x[:, :, idx].float() for x in (q, k, v)]
            for method in causal.METHODS:
                stats = []
                with count_bytes() as sent:
                    out = causal.block_causal_attention_cp(*mine, layout, scheme=scheme,
                                                           method=method, stats=stats)
                rows.append({"case": i, "scheme": scheme, "method": method, "bytes": sent.total,
                             "err": float((out.double() - want[:, :, idx]).abs().max()),
                             "row_bytes": 2 * b * h * d * 4, **stats[0]})
    return rows


def _stream(design, sizes, rank, world, shape):
    """Stream chunks of `sizes` tokens through a KVCacheCP; per chunk: error, bytes, memory."""
    from cpcourse.attention import reference_attention
    from cpcourse.causal import KVCacheCP
    from cpcourse.support.bytecount import count_bytes

    b, h, d = shape
    gen = torch.Generator().manual_seed(len(sizes))
    q, k, v = (torch.randn(b, h, sum(sizes), d, generator=gen, dtype=torch.float64)
               for _ in range(3))
    cache, rows, end = KVCacheCP(design), [], 0
    for n in sizes:
        new = slice(end, end + n)
        end += n
        mine = [x[:, :, new].tensor_split(world, dim=2)[rank].float() for x in (q, k, v)]
        with count_bytes() as sent:
            cache.append(mine[1], mine[2])
            out = cache.attend(mine[0])
        want, _ = reference_attention(q[:, :, new], k[:, :, :end], v[:, :, :end])
        err = out.double() - want.tensor_split(world, dim=2)[rank]
        rows.append({"err": float(err.abs().max()) if err.numel() else 0.0,
                     "bytes": sent.total, "cache_bytes": cache.cache_bytes,
                     "transient_bytes": cache.transient_bytes})
    return rows


def _errors(rank, world):
    """Bad input: every rank raises the same InputError, none hangs."""
    from cpcourse import causal
    from cpcourse.support.errors import InputError

    layout, errors = causal.chunk_of_frames(8, 2, 1), []
    x = torch.zeros(1, 1, 8, 2)
    short = torch.zeros(1, 1, 1 if rank == 0 else 2, 2)
    for call in (lambda: causal.block_causal_attention_cp(x, x, x, layout, scheme="spiral"),
                 lambda: causal.block_causal_attention_cp(short, short, short, layout),
                 lambda: causal.KVCacheCP("ulysses").append(*[torch.zeros(1, world + 1, 2, 2)]
                                                            * 2)):
        try:
            call()
            errors.append(None)
        except InputError as exc:
            errors.append(str(exc))
    return errors


def causal_cases():
    """Runs on every rank: every scheme x method, every cache design, the refusals."""
    import torch.distributed as dist

    from cpcourse.causal import DESIGNS

    rank, world = dist.get_rank(), dist.get_world_size()
    b, h, d, n, chunks = STREAM
    streams = {}
    for design in DESIGNS:
        if design == "ulysses" and h % world:
            continue
        streams[design] = _stream(design, [n] * chunks, rank, world, (b, h, d))
        streams[design + " uneven"] = _stream(design, UNEVEN, rank, world, (b, h, d))
    return {"rows": _block_causal_rows(rank, world), "streams": streams,
            "errors": _errors(rank, world)}


@pytest.fixture(scope="module", params=[1, 2, 3, 4])
def results(request):
    world = request.param
    return world, launch(f"{__file__}:causal_cases", world, timeout=120, stream=False)


def test_every_scheme_and_method_matches_float64(results):
    world, per_rank = results
    for rank, res in enumerate(per_rank):
        for row in res["rows"]:
            where = f"P={world} rank {rank} case {row['case']} {row['scheme']}/{row['method']}"
            assert row["err"] <= TOL, f"{where}: max error {row['err']:.3g}"
            assert row["work"] == row["planned_work"], where  # skipped blocks: no compute


def test_ring_bytes_split_into_useful_and_wasted(results):
    """The ring's bytes measured on the wire = useful + wasted as counted per block, = the
    planned traffic; the all-to-all sends exactly the ring's useful bytes."""
    from cpcourse import causal

    world, per_rank = results
    for case, (frames, chunk, tpf, *_) in enumerate(CASES):
        layout = causal.chunk_of_frames(frames, chunk, tpf)
        sizes = causal.chunk_sizes(layout)
        for scheme in causal.SCHEMES:
            plan = causal.ring_traffic(causal.assign_chunks(len(sizes), world, scheme, sizes),
                                       sizes)
            got = {m: [next(r for r in res["rows"] if (r["case"], r["scheme"], r["method"])
                            == (case, scheme, m)) for res in per_rank] for m in causal.METHODS}
            ring, a2a = got["ring"], got["all_to_all"]
            row = ring[0]["row_bytes"]
            where = f"P={world} case {case} {scheme}"
            assert [(r["useful_bytes"], r["wasted_bytes"]) for r in ring] == \
                [(p["useful"] * row, p["wasted"] * row) for p in plan], where
            assert sum(r["bytes"] for r in ring) == sum(
                r["useful_bytes"] + r["wasted_bytes"] for r in ring), where
            assert sum(r["bytes"] for r in a2a) == sum(r["useful_bytes"] for r in ring), where
            assert [r["useful_bytes"] for r in a2a] == [r["useful_bytes"] for r in ring], where


def test_the_kv_cache_designs_are_exact(results):
    world, per_rank = results
    for rank, res in enumerate(per_rank):
        assert ("ulysses" in res["streams"]) == (STREAM[1] % world == 0)
        for design, rows in res["streams"].items():
            for h, row in enumerate(rows):
                assert row["err"] <= TOL, f"P={world} rank {rank} {design} chunk {h}: {row}"


def test_cache_bytes_per_chunk_flat_or_linear_in_history(results):
    """Summed over ranks, per new chunk of n tokens after h cached ones (element e bytes):
    ulysses 4 (P-1) B (H/P) n D e; pass-q P (P-1) ceil(n/P) B H D e + (P-1) n B H (D+1) 4;
    pass-kv (P-1) 2 B H (h+1) n D e: flat, flat, linear in h."""
    world, per_rank = results
    b, h, d, n, chunks = STREAM
    e, p = 4, world
    total = {design: [sum(res["streams"][design][c]["bytes"] for res in per_rank)
                      for c in range(chunks)] for design in per_rank[0]["streams"]
             if "uneven" not in design}
    want = {"ulysses": [4 * (p - 1) * b * (h // p) * n * d * e] * chunks,
            "pass-q": [p * (p - 1) * -(-n // p) * b * h * d * e + (p - 1) * n * b * h * (d + 1) * 4]
            * chunks,
            "pass-kv": [(p - 1) * 2 * b * h * (c + 1) * n * d * e for c in range(chunks)]}
    for design, got in total.items():
        assert got == want[design], f"P={world} {design}: measured {got}, closed form"
    if world > 1:
        assert total["pass-kv"][-1] > total["pass-q"][-1]  # at h = 8 the ring moves the most


def test_cache_memory_per_rank(results):
    """ulysses holds every token for H/P heads, the sequence-sharded designs all heads for the
    rank's own tokens; summed over ranks both hold the one-process cache exactly once."""
    world, per_rank = results
    b, h, d, n, chunks = STREAM
    whole = 2 * b * h * n * chunks * d * 4
    for design in per_rank[0]["streams"]:
        held = [res["streams"][design][-1]["cache_bytes"] for res in per_rank]
        if "uneven" not in design:
            assert sum(held) == whole, design
        if design == "ulysses":
            assert held == [whole // world] * world
        elif "uneven" not in design:
            mine = [len(t) for t in torch.arange(n).tensor_split(world)]
            assert held == [2 * b * h * m * chunks * d * 4 for m in mine], design
    if world > 1:
        ring = [res["streams"]["pass-kv"][-1]["transient_bytes"] for res in per_rank]
        assert ring == [2 * whole // chunks // n * -(-n // world) * chunks] * world


def test_bad_input_raises_the_same_clear_error_on_every_rank(results):
    world, per_rank = results
    errors = [res["errors"] for res in per_rank]
    assert all(e == errors[0] for e in errors), errors
    scheme, shards, heads = errors[0]
    assert "scheme must be one of" in scheme and "spiral" in scheme
    if world > 1:
        assert "tokens per rank" in shards
        assert "must divide the head count" in heads
