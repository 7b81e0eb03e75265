"""Notebook 10's validation figure draws `validate()`'s numbers: one panel per published table,
every published and predicted point where validate() puts it; and Amdahl's helpers.

    python -m pytest tests/unit/test_viz_planner.py -q
"""

from __future__ import annotations

import math

import matplotlib
import pytest

matplotlib.use("Agg")

from cpcourse.planner.validation import validate  # noqa: E402
from cpcourse.support.errors import InputError  # noqa: E402
from cpcourse.support.layout import Layout  # noqa: E402
from cpcourse.viz import planner as vp  # noqa: E402


@pytest.fixture(scope="module")
def v():
    return validate()


def _points(fig) -> dict[tuple[str, str, int], tuple[float, float]]:
    out = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            gid = line.get_gid() or ""
            kind, _, rest = gid.partition(":")
            if kind in ("published", "predicted"):
                table, gpus = rest.rsplit(":", 1)
                (x,), (y,) = line.get_xdata(), line.get_ydata()
                out[kind, table, int(gpus)] = (float(x), float(y))
    return out


def test_every_point_is_a_number_of_validate(v):
    fig = vp.validation_figure(v)
    drawn = _points(fig)
    assert len(drawn) == 2 * len(v["rows"])
    for row in v["rows"]:
        for kind in ("published", "predicted"):
            x, y = drawn[kind, row["table"], row["gpus"]]
            assert x == row["gpus"] and y == row[f"{kind}_s"], (kind, row["table"], row["gpus"])


def test_one_panel_per_table_and_the_errors_in_the_title(v):
    fig = vp.validation_figure(v)
    names = {r["table"] for r in v["rows"]}
    used = [ax for ax in fig.axes if ax.get_lines() and ax.axison]
    assert len(used) == len(names) == len(vp.tables(v))
    for ax, name in zip(used, vp.tables(v), strict=True):
        tables_here = {(ln.get_gid() or "").split(":")[1] for ln in ax.get_lines()
                       if (ln.get_gid() or "").startswith("published:")}
        assert tables_here == {name}
    assert f"{v['median_abs_rel_error']:.1%}" in fig._suptitle.get_text()
    # the perfect-scaling line starts at the published fewest-GPU time
    for ax, (name, rows) in zip(used, vp.tables(v).items(), strict=True):
        ideal = next(ln for ln in ax.get_lines() if ln.get_gid() == f"ideal:{name}")
        assert list(ideal.get_ydata()) == pytest.approx(
            [rows[0]["published_s"] * rows[0]["gpus"] / r["gpus"] for r in rows])


def test_the_held_out_runs_draw_with_their_own_title(v):
    held = v["holdout"]
    fig = vp.validation_figure(held, ncols=3, title="Held out")
    drawn = _points(fig)
    assert len(drawn) == 2 * len(held["rows"])
    assert fig._suptitle.get_text().startswith("Held out: ")
    assert f"{held['worst_abs_rel_error']:.1%}" in fig._suptitle.get_text()
    titles = [ax.get_title() for ax in fig.axes if ax.axison and ax.get_lines()]
    assert all(t.startswith("hunyuanvideo, 960x960") for t in titles), titles


def test_amdahl_and_the_serial_part():
    from cpcourse.planner.validation import amdahl_fit

    t1, serial = 1000.0, 40.0
    for p in (2, 4, 8, 64):
        tp = serial + (t1 - serial) / p
        assert amdahl_fit([(1, t1), (p, tp)])[0] == pytest.approx(serial)
        assert vp.amdahl_speedup(t1, serial, p) == pytest.approx(t1 / tp)
    assert vp.amdahl_speedup(t1, serial, math.inf) == pytest.approx(t1 / serial)
    assert vp.amdahl_speedup(t1, 0.0, 8) == pytest.approx(8)
    with pytest.raises(InputError):
        amdahl_fit([(1, t1)])


def test_step_video_quote_is_sourced_and_parses():
    q = vp.STEP_VIDEO_XDIT_H20
    assert "xDiT" in q["source"] and q["gpu"] == "h20"
    for run in q["runs"]:
        lay = Layout.parse(run["layout"]) if run["layout"] else Layout()
        assert lay.world == run["gpus"] and run["latency_s"] > 0 and run["memory_MB"] > 0


def test_video_parts_add_up_to_the_plan_and_are_drawn():
    from cpcourse.planner.plan import plan
    from cpcourse.support.layout import Layout

    alts = plan("hunyuanvideo-13b", gpus=8, gpu="h100")["alternatives"][:5]
    fig = vp.video_parts_figure(alts)
    for c in alts:
        parts = vp.video_parts(c)
        assert sum(parts.values()) == pytest.approx(c["seconds_total"], rel=1e-9)
        label = str(Layout(**c["layout"]))
        drawn = {a.get_gid().rsplit(":", 1)[1]: a.get_width()
                 for a in fig.axes[0].patches if a.get_gid().startswith(f"part:{label}:")}
        assert drawn == pytest.approx(parts), label
