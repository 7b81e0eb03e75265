"""Notebook 08's figures: the five hooks of a Wan forward, and joined text in a ring.

    python -m pytest tests/unit/test_viz_models.py -q
"""

from cpcourse.sim import ring_schedule
from cpcourse.viz.models import WAN_STAGES, split_points_figure, text_cells, text_ring_figure


def test_split_points_figure_numbers_the_five_hooks_in_forward_order():
    hooks = [h for _, _, h in WAN_STAGES if h]
    assert hooks == [1, 2, 3, 4, 5]
    texts = {t.get_text() for t in split_points_figure().axes[0].texts}
    assert {str(h) for h in hooks} <= texts


def test_text_cells_meet_each_text_key_once_per_rank(cases_rng):
    world = cases_rng.randint(2, 6)
    for strategy in ("course", "rear"):
        cells = text_cells(world, strategy)
        assert [[b for b, _, _ in row] for row in cells] == ring_schedule(world)
        for rank in range(world):
            assert sum(cells[step][rank][1] for step in range(world)) == 1
    travelled = sum(t for row in text_cells(world, "course") for _, _, t in row)
    assert travelled == world - 1
    assert not any(t for row in text_cells(world, "rear") for _, _, t in row)


def test_text_ring_figure_marks_where_text_joins():
    fig = text_ring_figure(3)
    marked = [sum("+T" in t.get_text() for t in ax.texts) for ax in fig.axes]
    assert marked == [3, 3]
