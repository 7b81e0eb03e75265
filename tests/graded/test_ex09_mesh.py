"""Graded tests of notebook 09: CFG-parallel's step, a rank's place in the mesh, an SP MLP.

    python -m pytest tests/graded --ex 09.1 --impl solutions

09.1 runs on 2 gloo ranks (one launch) against guidance computed in one process, and counts
what it sends. 09.2 is checked in this process against `Layout.coords` and the groups
`make_mesh` builds (DeviceMesh's rule: the slices of arange(world).view(cfg, ring, ulysses, tp)
along each dim; tests/dist/test_mesh_groups.py holds that rule to live meshes), exhaustively for
small worlds and for properties over random layouts. 09.3 (the MLP under Megatron sequence
parallelism) runs on 4 ranks (one launch) split into two groups of 2 and one of 4, against the
unsplit MLP in float64, and counts its bytes against one all-reduce of the output.
An untouched stub raising inside a rank comes back as launch's error, which the grader
recognises as the stub's own.
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cpcourse.course.testing import assert_close
from cpcourse.launch import LaunchError, launch
from cpcourse.support.layout import DIMS, Layout, layouts

CFG_CASES = [((1, 4, 3, 5, 6), torch.float32, 4.0), ((2, 7), torch.float64, -2.5),
             ((3, 1, 9), torch.float32, 1.0), ((1, 16, 24), torch.float32, 0.0)]


def _launch(worker: str, nproc: int, args: tuple):
    try:
        return launch(f"{__file__}:{worker}", nproc, timeout=60, args=args, stream=False)
    except LaunchError as exc:
        if "NotImplementedError" in str(exc):
            raise  # an untouched stub inside a rank: the grader recognises it as such
        raise AssertionError(
            f"{exc}\n\nA rank that hangs or is killed inside a collective usually means the "
            "ranks did not all make the same calls with the same sizes: every rank of the group "
            "must take part in the one exchange, with a buffer of the same shape.") from None


def _stub_first(fn, *args):
    """Call the learner's function here, outside any process group: an untouched stub raises its
    NotImplementedError at once, without a launch; a written one fails on the missing group,
    which is ignored (the ranks test it)."""
    try:
        fn(*args)
    except NotImplementedError:
        raise
    except Exception:  # noqa: BLE001  no process group here: expected of a real answer
        pass


# --- 09.1 the CFG-parallel step ------------------------------------------------------------------

def _pair(shape, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype) for _ in range(2)]


def cfg_worker(impl_name):
    """Each rank: its half of each (cond, uncond) pair in, the learner's guided prediction out,
    with what it sent."""
    import torch.distributed as dist

    from cpcourse.course import load
    from cpcourse.support.bytecount import count_bytes

    mod = load(impl_name, "ex09_mesh")
    rank = dist.get_rank()
    group = dist.new_group([0, 1])  # the cfg dim's group, as a mesh would hand it over
    out = []
    for i, (shape, dtype, scale) in enumerate(CFG_CASES):
        cond, uncond = _pair(shape, dtype, i)
        mine = (cond if rank == 0 else uncond).clone()
        with count_bytes() as sent:
            got = mod.cfg_parallel_step(mine, group, scale)
        out.append({"got": got, "sent": sent.total, "ops": dict(sent.by_op),
                    "untouched": torch.equal(mine, cond if rank == 0 else uncond)})
    return out


@pytest.mark.ex("09.1")
def test_cfg_parallel_step_equals_one_process_guidance(impl, impl_name):
    _stub_first(impl("ex09_mesh").cfg_parallel_step, torch.zeros(2), None, 1.0)
    runs = _launch("cfg_worker", 2, (impl_name,))
    for i, (shape, dtype, scale) in enumerate(CFG_CASES):
        cond, uncond = (t.double() for t in _pair(shape, dtype, i))
        want = uncond + scale * (cond - uncond)
        r0, r1 = runs[0][i], runs[1][i]
        case = f"pred {list(shape)} {str(dtype).removeprefix('torch.')}, scale {scale:g}"
        for rank, r in enumerate((r0, r1)):
            got = r["got"]
            assert isinstance(got, torch.Tensor) and got.shape == torch.Size(shape), (
                f"{case}: rank {rank} returned {getattr(got, 'shape', type(got).__name__)}, "
                f"want a tensor of pred's shape {list(shape)}")
            assert got.dtype == dtype, f"{case}: rank {rank} returned {got.dtype}, want {dtype}"
            tol = 1e-12 if dtype == torch.float64 else 2e-5
            assert_close(got.double(), want, atol=tol, rtol=tol,
                         name=f"guided, rank {rank}, {case}",
                         hint="rank 0 of the group holds the conditional prediction, rank 1 the "
                              "unconditional: uncond + scale * (cond - uncond)")
            assert r["untouched"], f"{case}: rank {rank}'s pred was changed in place"
            nbytes = got.numel() * got.element_size()
            assert r["sent"] <= nbytes, (
                f"{case}: rank {rank} sent {r['sent']} bytes ({r['ops']}); one exchange sends "
                f"its prediction once, {nbytes} bytes (an all-gather; an all-reduce of a "
                f"[2, ...] buffer sends twice that)")
        assert torch.equal(r0["got"], r1["got"]), (
            f"{case}: the two ranks' guided predictions differ (largest gap "
            f"{float((r0['got'] - r1['got']).abs().max()):.1e}): both must evaluate the same "
            "formula on the same two tensors, or their samples drift apart step by step")


# --- 09.2 which rank talks to which --------------------------------------------------------------

def _mesh_groups(layout: Layout, dim: str) -> list[list[int]]:
    """The groups of one dim, as DeviceMesh builds them from arange(world).view(shape)."""
    d = DIMS.index(dim)
    grid = torch.arange(layout.world).view(layout.shape)
    return grid.movedim(d, -1).reshape(-1, layout.shape[d]).tolist()


def _truth(rank: int, layout: Layout) -> dict:
    co = layout.coords(rank)
    groups = {dim: next(g for g in _mesh_groups(layout, dim) if rank in g)
              for dim in ("ulysses", "ring")}
    return {"coords": co, "cp_rank": co["ring"] * layout.ulysses + co["ulysses"], **groups}


def _compare(got, want, rank, layout):
    where = f"rank {rank} of {layout} ({layout.world} ranks)"
    assert isinstance(got, dict), f"{where}: returned {type(got).__name__}, want a dict"
    for key in ("coords", "cp_rank", "ulysses", "ring"):
        assert key in got, f"{where}: the result has no {key!r} (keys: {sorted(got)})"
    coords = {k: int(v) for k, v in dict(got["coords"]).items()}
    assert coords == want["coords"], (
        f"{where}: coords {coords}, want {want['coords']} (rank = ((c * R + r) * U + u) * T + t: "
        "tp is the innermost digit)")
    assert int(got["cp_rank"]) == want["cp_rank"], (
        f"{where}: cp_rank {got['cp_rank']}, want {want['cp_rank']} = ring {coords['ring']} x "
        f"ulysses degree {layout.ulysses} + ulysses {coords['ulysses']}")
    for dim in ("ulysses", "ring"):
        mine = [int(x) for x in got[dim]]
        assert mine == want[dim], (
            f"{where}: {dim} group {mine}, want {want[dim]} (the ranks whose other coordinates "
            f"equal this rank's, ascending)")


@pytest.mark.ex("09.2")
def test_mesh_position_matches_layout_coords_and_the_mesh_groups(impl):
    mod = impl("ex09_mesh")
    for world in (1, 2, 3, 4, 6, 8, 12, 16):
        for layout in layouts(world):
            for rank in range(world):
                _compare(mod.mesh_position(rank, layout), _truth(rank, layout), rank, layout)


DEGREES = st.integers(1, 6)


@pytest.mark.ex("09.2")
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(cfg=st.sampled_from([1, 2]), ring=DEGREES, ulysses=DEGREES, tp=DEGREES, data=st.data())
def test_groups_partition_the_world_and_shards_are_neighbours(impl, cfg, ring, ulysses, tp, data):
    """`impl` only loads the module: the same for every example hypothesis draws."""
    mod = impl("ex09_mesh")
    layout = Layout(cfg=cfg, ring=ring, ulysses=ulysses, tp=tp)
    rank = data.draw(st.integers(0, layout.world - 1), label="rank")
    got = mod.mesh_position(rank, layout)
    _compare(got, _truth(rank, layout), rank, layout)
    for dim, size in (("ulysses", ulysses), ("ring", ring)):
        members = [int(x) for x in got[dim]]
        assert len(members) == size and rank in members
        for m in members:  # a group is the same list from each of its members
            assert [int(x) for x in mod.mesh_position(m, layout)[dim]] == members, (
                f"{layout}: rank {rank}'s {dim} group is {members}, but rank {m} puts itself in "
                f"{mod.mesh_position(m, layout)[dim]}")
    cps = [int(mod.mesh_position(m, layout)["cp_rank"]) for m in got["ulysses"]]
    assert cps == list(range(cps[0], cps[0] + ulysses)), (
        f"{layout}: a Ulysses group's frame shards must be neighbours in the sequence, got "
        f"cp ranks {cps}")
    cps = [int(mod.mesh_position(m, layout)["cp_rank"]) for m in got["ring"]]
    assert cps == [cps[0] + ulysses * i for i in range(ring)], (
        f"{layout}: a ring group's cp ranks step by the Ulysses degree, got {cps}")


# --- 09.3 the MLP under Megatron sequence parallelism --------------------------------------------

# (tokens L, batch B, d, f, activation): the DiT's tanh GELU, exact GELU, and SiLU (the mlp's own)
MLP_CASES = [(12, 1, 6, 20, "gelu-tanh"), (8, 2, 8, 16, "gelu"), (4, 3, 4, 12, "silu")]
ACTS = {"gelu-tanh": lambda: torch.nn.GELU(approximate="tanh"), "gelu": torch.nn.GELU,
        "silu": torch.nn.SiLU}


def _mlp(case: int):
    """(x of all L tokens `[L, B, d]`, the mlp) of one case, seeded."""
    length, batch, d, f, act = MLP_CASES[case]
    gen = torch.Generator().manual_seed(case)
    mlp = torch.nn.Sequential(torch.nn.Linear(d, f), ACTS[act](), torch.nn.Linear(f, d))
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)  # biases far from 0 on purpose
    return torch.randn(length, batch, d, generator=gen), mlp


def sp_worker(impl_name):
    """Each rank: the learner's SP MLP on its token shard, in groups of 2 ({0, 1}, {2, 3}) and
    of 4, with its traffic."""
    import torch.distributed as dist

    from cpcourse.course import load
    from cpcourse.support.bytecount import count_bytes

    mod = load(impl_name, "ex09_mesh")
    rank = dist.get_rank()
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates both
    groups = {2: pairs[rank // 2], 4: None}
    out = []
    for tp, group in groups.items():
        for i in range(len(MLP_CASES)):
            x, mlp = _mlp(i)
            shard = x.tensor_split(tp, dim=0)[dist.get_rank(group)]
            before = [p.clone() for p in mlp.parameters()]
            with torch.no_grad(), count_bytes() as sent:
                got = mod.sp_mlp(shard.clone(), mlp, group)
            same = all(torch.equal(a, b) for a, b in zip(before, mlp.parameters(), strict=True))
            out.append({"tp": tp, "tp_rank": dist.get_rank(group), "case": i, "got": got,
                        "sent": sent.total, "ops": dict(sent.by_op), "weights_untouched": same})
    return out


@pytest.mark.ex("09.3")
def test_sp_mlp_gives_each_rank_its_tokens_for_one_all_reduces_bytes(impl, impl_name):
    _stub_first(impl("ex09_mesh").sp_mlp, *_mlp(0), None)
    runs = _launch("sp_worker", 4, (impl_name,))
    for rank, rows in enumerate(runs):
        for r in rows:
            length, batch, d, f, act = MLP_CASES[r["case"]]
            x, mlp = _mlp(r["case"])
            with torch.no_grad():
                want = mlp.double()(x.double()).tensor_split(r["tp"], dim=0)[r["tp_rank"]]
            where = f"T = {r['tp']}, rank {rank}, L {length}, B {batch}, d {d}, f {f}, {act}"
            got = r["got"]
            assert isinstance(got, torch.Tensor) and got.shape == want.shape, (
                f"{where}: got {getattr(got, 'shape', type(got).__name__)}, want {list(want.shape)}"
                " (this rank's tokens of the output, as x held them)")
            assert_close(got.double(), want, atol=2e-5, rtol=2e-5, name=f"MLP output, {where}",
                         dims=("L", "B", "d"),
                         hint="every token meets this rank's hidden features; the partial sums "
                              "of all ranks are added before this rank keeps its tokens, and "
                              "mlp[2]'s bias belongs to the sum")
            assert r["weights_untouched"], f"{where}: the mlp's weights were changed in place"
            allreduce = 2 * (r["tp"] - 1) * (length * batch * d * 4) // r["tp"]
            assert r["sent"] == allreduce and "all_reduce" not in r["ops"], (
                f"{where}: sent {r['sent']} bytes by {r['ops']}; the bytes of one all-reduce of "
                f"the whole output [L, B, d] are {allreduce}, split over two collectives and no "
                "all-reduce: what does the first layer need from the others, and what does "
                "each rank need of the second layer's partial sums?")


# --- 09.4 a layout for several nodes --------------------------------------------------------------

# (gpus, gpus_per_node, heads, cfg_forwards, tp): real head counts on real node sizes
PLACEMENTS = [(16, 8, 24, 1, 1), (16, 8, 24, 1, 2), (16, 8, 24, 2, 1), (32, 8, 40, 2, 1),
              (16, 8, 12, 2, 1), (16, 8, 12, 1, 1), (12, 4, 6, 2, 1), (16, 4, 8, 1, 2),
              (24, 8, 24, 1, 1), (8, 4, 12, 2, 2), (32, 8, 48, 1, 4), (8, 8, 24, 2, 1)]


def _between_nodes(layout, per_node, heads):
    """Bytes per step between nodes, per dim, for the course's DiT with `heads` heads."""
    from cpcourse.tinydit.costs import predicted_bytes_per_step
    from cpcourse.tinydit.model import DiTConfig
    from cpcourse.viz.mesh import traffic_by_link

    cfg = DiTConfig(hidden=8 * heads, heads=heads, attention="full", depth=2)
    sent = [predicted_bytes_per_step(cfg, (1, 4, 12, 8, 8), layout, r) for r in range(layout.world)]
    return {d: v["ib"] for d, v in traffic_by_link(layout, sent, per_node).items()}


@pytest.mark.ex("09.4")
def test_choose_layout_keeps_blocking_traffic_in_a_node_and_sends_least_across(impl):
    mod = impl("ex09_mesh")
    for gpus, per_node, heads, forwards, tp in PLACEMENTS:
        case = (f"{gpus} GPUs in nodes of {per_node}, {heads} heads, {forwards} forward(s) per "
                f"step, tp {tp}")
        got = mod.choose_layout(gpus, per_node, heads, forwards, tp)
        assert isinstance(got, Layout), f"{case}: return a Layout, got {got!r}"
        allowed = [lay for lay in layouts(gpus, heads, cfg=forwards == 2) if lay.tp == tp]
        assert got in allowed, (
            f"{case}: {got} is not a layout of {gpus} ranks with tp {tp} that the heads (and "
            f"the forwards per step) allow; those are: {', '.join(map(str, allowed))}")
        priced = {lay: _between_nodes(lay, per_node, heads) for lay in allowed}
        blocking = {d: b for d, b in priced[got].items() if d in ("tp", "ulysses") and b}
        assert not blocking, (
            f"{case}: {got} sends {blocking} bytes per step of blocking collectives between "
            "nodes: which ranks share a node, and which ranks form a Ulysses or TP group?")
        fine = {lay: sum(b.values()) for lay, b in priced.items()
                if not any(b.get(d) for d in ("tp", "ulysses"))}
        best = min(fine.values())
        assert sum(priced[got].values()) == best, (
            f"{case}: {got} sends {sum(priced[got].values()):,.0f} bytes per step between nodes "
            f"({ {d: int(b) for d, b in priced[got].items() if b} }); "
            f"{', '.join(str(lay) for lay, b in fine.items() if b == best)} send(s) "
            f"{best:,.0f}. Which dim's traffic is smallest, and how long must the ring be?")
