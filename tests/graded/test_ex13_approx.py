"""Graded tests of notebook 13: the stale K/V buffer of displaced patches, and a first-block cache
whose decision must be the same on every rank.

    python -m pytest tests/graded --ex 13.1 --impl solutions
"""

import pytest
import torch


def _kv_steps(steps, world, gen):
    """kv[s][q] `[1, 2, L_q, 4]`, every rank a different length (the buffer must not care)."""
    return [[torch.randn(1, 2, 2 + q, 4, generator=gen) for q in range(world)]
            for _ in range(steps)]


@pytest.mark.ex("13.1")
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("warmup", [0, 1, 2, 5])
def test_displaced_buffer_is_fresh_for_itself_and_one_step_old_for_the_rest(impl, world, warmup,
                                                                         cases_rng):
    mod = impl("ex13_approx")
    steps = 4
    kv = _kv_steps(steps, world, torch.Generator().manual_seed(cases_rng.randrange(2**31)))
    for step in range(steps):
        for rank in range(world):
            got = mod.displaced_buffer(kv, rank, step, warmup)
            where = f"P={world}, warmup {warmup}, rank {rank}, step {step}"
            assert isinstance(got, list) and len(got) == world, f"{where}: one entry per rank"
            assert got[rank] is kv[step][rank], f"{where}: a rank's own K/V is always fresh"
            for q in range(world):
                if q == rank:
                    continue
                if step < warmup:
                    want, why = kv[step][q], "the warm-up gathers synchronously: fresh"
                elif step == 0:
                    want, why = None, "nothing has arrived before step 0"
                else:
                    want, why = kv[step - 1][q], "sent a step earlier, waited on now"
                assert got[q] is want, f"{where}, rank {q}'s entry: {why}"


def _first_outputs(gen, world):
    """Three steps of first-block outputs: rank 0's frames barely move, the last rank's move a
    lot, and the ranks hold different numbers of frames (an average of ratios is wrong)."""
    steps = [[torch.randn(1, 1 + q, 4, 8, generator=gen).abs() + 1 for q in range(world)]]
    for s in range(1, 3):
        steps.append([h + (0.01 if q == 0 else 0.5 * s) * torch.randn(h.shape, generator=gen)
                      for q, h in enumerate(steps[-1])])
    return steps


def _one_process(first_outputs, threshold):
    whole = [torch.cat(ranks, dim=1) for ranks in first_outputs]
    return [False] + [float((h - p).abs().sum() / p.abs().sum()) < threshold
                      for h, p in zip(whole[1:], whole[:-1], strict=True)]


@pytest.mark.ex("13.2")
@pytest.mark.parametrize("world", [2, 3])
def test_cache_decision_is_the_whole_videos_on_every_rank(impl, world, cases_rng):
    mod = impl("ex13_approx")
    gen = torch.Generator().manual_seed(cases_rng.randrange(2**31))
    firsts = _first_outputs(gen, world)
    whole = [torch.cat(ranks, dim=1) for ranks in firsts]
    change = float((whole[1] - whole[0]).abs().sum() / whole[0].abs().sum())
    mean_of_ratios = sum(float((h - p).abs().sum() / p.abs().sum())
                         for h, p in zip(firsts[1], firsts[0], strict=True)) / world
    for threshold in (0.0, change * 0.5, change * 1.5, (change + mean_of_ratios) / 2, 1e9):
        got = mod.cache_decisions(firsts, threshold)
        want = _one_process(firsts, threshold)
        assert len(got) == world, f"one list of decisions per rank, got {len(got)}"
        assert all(g == want for g in got), (
            f"P={world}, threshold {threshold:.4f}: decisions {got}, but one process holding "
            f"the whole video decides {want} (sum the ranks' sums, then divide)")
    buggy = mod.cache_decisions_buggy(firsts, change * 0.5)
    assert buggy[0][1] != buggy[-1][1], f"this case must split the colleague's ranks: {buggy}"

