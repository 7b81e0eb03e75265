"""The parallel VAE decode equals one process's, P = 1..4, uneven splits, both VAEs.

    python -m pytest tests/dist/test_vae_cp.py -q

ONE 4-rank gloo launch: each world size P runs on the group of ranks 0..P-1 (`dist.new_group`),
so P = 4, 3, 2 and 1 cost one start-up. Latent heights not divisible by P, 1 to 3 latent
frames, a seeded random size per P, Wan (zero padding, a per-frame causal cache) and
HunyuanVideo (replicate padding, GroupNorm). Without the GroupNorm all-reduce HunyuanVideo's
decode is caught far outside the tolerance. Rank 0 returns rows; the assertions happen here
so a failure names the case. One more 2-rank launch runs the command itself with --save.
"""

import random
import sys
from pathlib import Path

import pytest

from cpcourse.launch import launch

pytestmark = pytest.mark.dist

TOL = 1e-5  # float32, outputs clamped to [-1, 1]

# (arch, frames, height, width, sync_norm, world sizes)
CASES = [("wan", 5, 40, 24, True, (1, 2, 3, 4)),
         ("hunyuanvideo", 5, 40, 24, True, (1, 2, 3, 4)),
         ("wan", 1, 56, 16, True, (3,)),
         ("wan", 9, 24, 16, True, (2,)),
         ("hunyuanvideo", 9, 24, 16, True, (3,)),
         ("hunyuanvideo", 5, 40, 24, False, (2, 4))]


def _random_cases(seed: int = 28) -> list[tuple]:
    """One seeded random size per world size: any latent height from P rows up, either VAE."""
    rng = random.Random(seed)
    return [(rng.choice(["wan", "hunyuanvideo"]), rng.choice([1, 5, 9]),
             8 * rng.randint(world, 7), 8 * rng.randint(1, 3), True, (world,))
            for world in (2, 3, 4)]


CASES += _random_cases()


def decode_on_groups(cases):
    """Every rank: each case on the group of ranks 0..P-1; rank 0 returns its error rows."""
    import torch
    import torch.distributed as dist

    from cpcourse.models.vae import build_vae, decode_cp, decode_rows, example_latents

    rank, rows, models = dist.get_rank(), [], {}
    for world in (4, 3, 2, 1):
        group = dist.new_group(list(range(world)))  # every rank takes part in creating it
        for arch, frames, height, width, sync, worlds in cases:
            if world not in worlds or rank >= world:
                continue
            vae = models.setdefault(arch, build_vae(arch, seed=1))
            z = example_latents(arch, frames, height, width, seed=1)
            with torch.inference_mode():
                out = decode_cp(vae, z, group=group, sync_norm=sync)
                mine, split = decode_rows(vae, z, group=group, sync_norm=sync)
                if rank == 0:
                    want = vae.decode(z).sample
                    rows.append({"case": (arch, frames, height, width, sync, world),
                                 "err": float((out - want).abs().max()),
                                 "rows_ok": torch.equal(mine, out[..., :mine.shape[3], :]),
                                 "halo_bytes": split.halo_bytes})
        dist.barrier()
    return rows


@pytest.fixture(scope="module")
def rows():
    return launch(f"{__file__}:decode_on_groups", 4, args=(CASES,), timeout=240, stream=False)[0]


def test_every_case_ran(rows):
    assert len(rows) == sum(len(c[-1]) for c in CASES)


def test_exact_at_every_world_size(rows):
    for row in rows:
        if row["case"][4]:
            assert row["err"] <= TOL, row


def test_each_rank_keeps_its_rows_and_only_a_split_sends_halos(rows):
    for row in rows:
        assert row["rows_ok"], row
        assert (row["halo_bytes"] > 0) == (row["case"][5] > 1), row


def test_the_planners_halo_recording_is_what_rank_0_sent(rows):
    """tools/derive_vae_halo.py records the halo the planner prices by running the library's
    split without processes; rank 0 (one neighbour) sent exactly that, in float32 bytes."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    from derive_vae_halo import record

    from cpcourse.models.vae import build_vae, example_latents

    first = {}  # each VAE's first split case
    for row in rows:
        if row["case"][5] > 1:
            first.setdefault(row["case"][0], row)
    assert len(first) == 2
    for row in first.values():
        arch, frames, height, width = row["case"][:4]
        z = example_latents(arch, frames, height, width, seed=1)
        assert row["halo_bytes"] == record(build_vae(arch, seed=1), z)["halo"] * 4, row


def test_groupnorm_without_the_all_reduce_is_caught(rows):
    unsynced = [row for row in rows if not row["case"][4]]
    assert unsynced and all(row["err"] > 1000 * TOL for row in unsynced), unsynced


def test_the_command_saves_the_one_process_video(tmp_path, capsys):
    """`cpcourse vae --save` on 2 ranks writes the pixels one process decodes, and says so."""
    import json

    import torch

    from cpcourse.cli import main
    from cpcourse.runs.vae import single_decode

    path = tmp_path / "video.pt"
    argv = ["vae", "--arch", "hunyuanvideo", "--nproc", "2", "--frames", "1", "--height", "16",
            "--width", "8", "--seed", "2", "--save", str(path), "--compare", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["within_tolerance"] and report["video_shape"] == [1, 3, 1, 16, 8]
    assert max(report["peak_bytes_per_rank"]) < report["peak_bytes_single"]
    spec = {"arch": "hunyuanvideo", "frames": 1, "height": 16, "width": 8, "seed": 2}
    want = single_decode(spec)[0]
    assert float((torch.load(path) - want).abs().max()) <= TOL


def test_the_runner_reports_the_naive_norm_beside_the_exact_one():
    """`run_vae` with `naive_norm`: the per-rank GroupNorm error beside the exact decode's."""
    from cpcourse.runs.vae import run_vae

    spec = {"arch": "hunyuanvideo", "frames": 1, "height": 16, "width": 8, "seed": 4,
            "naive_norm": True}
    report = run_vae(spec, 2, compare=True, timeout=120)
    assert report["within_tolerance"], report["max_abs_err"]
    assert report["max_abs_err_naive_norm"] > 1000 * TOL, report["max_abs_err_naive_norm"]
