"""Notebook 00's figures, audit and dashboard, without a display (matplotlib Agg).

    python -m pytest tests/unit/test_viz.py -q
"""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib
import pytest

from cpcourse.planner.hardware import kernel_efficiency

matplotlib.use("Agg")

from cpcourse.planner.hardware import gpus  # noqa: E402
from cpcourse.planner.tokens import get_model, model_tokens, presets  # noqa: E402
from cpcourse.support.errors import InputError  # noqa: E402
from cpcourse.viz import article_audit, fmt  # noqa: E402
from cpcourse.viz import dashboard as dash  # noqa: E402
from cpcourse.viz import tokens as vt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_formatting_matches_the_figures_the_course_quotes():
    assert fmt.nbytes(27_648_000) == "27.6 MB"
    assert fmt.nbytes(884_736_000) == "884.7 MB"
    assert fmt.nbytes(6_193_152_000) == "6.19 GB"
    assert fmt.nbytes(373_248_000_000) == "373.2 GB"
    assert fmt.gb(10_616_832_000) == "10.6 GB"
    assert fmt.seconds(0.00196608) == "1.97 ms"
    assert fmt.seconds(0.01376256) == "13.8 ms"
    assert fmt.seconds(3887.4) == "1.08 h" and fmt.seconds(0.0003204) == "0.32 ms"
    assert fmt.count(432000) == "432,000"
    assert fmt.sci(1_866_240_000) == "1.87 billion"
    table = fmt.html_table([{"a": "<b>", "b": 1, "tip": "x&y"}], ["a", "b"], titles={"a": "tip"})
    assert "&lt;b&gt;" in table and 'title="x&amp;y"' in table and ">b</th>" in table
    assert '<td style="text-align:left" title' in table  # text left, quantities right
    assert '<td style="text-align:right">1</td>' in table


def test_audit_recomputes_the_articles_figures():
    rows = {r["claim"]: r for r in article_audit.audit()}
    expect = {  # claim -> (cpcourse's figure, verdict starts with)
        "tokens per 720p frame (8x VAE, 2x2 patch)": (3600, "wrong"),
        "tokens of 720p, 5 s, 24 fps": (432_000, "arithmetic right, premise wrong"),
        "one head's attention matrix": (373_248_000_000, "right"),
        "Q, K and V": (10_616_832_000, "wrong"),
        "tokens per rank at CP=8": (54_000, "right"),
        "K/V per head per ring hop": (27_648_000, "right"),
        "K/V per ring hop, all heads": (884_736_000, "right"),
        "K/V over 7 hops": (6_193_152_000, "right"),
        "time of 7 hops at 450 GB/s": (pytest.approx(0.01376256), "right"),
        # FA2, the default kernel (facts sheet: 138 ms at FA2-class, 35% of the H100's peak),
        # at the rate measured on the H200, the H100's die
            "compute of one ring step": (pytest.approx(
                0.138 * 0.35 / kernel_efficiency("h100", "fa2")[0], rel=0.01), "an underestimate"),
    }
    for claim, (value, verdict) in expect.items():
        assert rows[claim]["_cpcourse"] == value, claim
        assert rows[claim]["verdict"].startswith(verdict), (claim, rows[claim]["verdict"])
    assert "3.0x too high" in rows["Q, K and V"]["verdict"]
    assert "111,600" in rows["tokens of 720p, 5 s, 24 fps"]["fix"]
    assert "57,600" in rows["tokens of 720p, 5 s, 24 fps"]["fix"]
    assert "per layer and per forward" in rows["K/V over 7 hops"]["fix"]
    assert rows["add TP=2 across nodes"]["verdict"] == "wrong"


def test_verdict_reports_direction_and_size():
    assert article_audit.verdict(32e9, 10.6e9).startswith("wrong (3.0x too high")
    assert article_audit.verdict(900, 3600) == "wrong (4.0x too low)"
    assert article_audit.verdict(884e6, 884.736e6) == "right"


def test_tp_across_nodes_costs_more_than_it_does_inside_one():
    tp = article_audit.tp_across_nodes("cosmos-1.0-diffusion-7b", cp=8, tp=2, gpu="h100")
    assert tp["tokens_per_rank"] == 7040
    # Cosmos' FA-CA-MLP block: 3 all-reduces (self-attn, cross-attn, MLP), 2(tp-1)/tp = 1
    assert tp["allreduces_per_block"] == 3
    assert tp["allreduce_bytes_per_block"] == 3 * 7040 * 4096 * 2
    cosmos = get_model("cosmos-1.0-diffusion-7b")
    assert tp["allreduces_per_forward"] == cosmos.tp_all_reduces_per_forward
    # with the derived block costs (element-wise work priced) the IB share is about 24%
    assert tp["exposed_fraction_nvlink4"] < 0.1 < 0.2 < tp["exposed_fraction_ib-ndr"]
    assert tp["cfg_exchange_bytes_per_step"] == 16 * 16 * 88 * 160 * 2  # one latent, bf16


def test_gpu_memory_cp_splits_activations_never_weights():
    m = get_model("hunyuanvideo-13b")
    n = model_tokens(m.id).sequence_length
    rows = [vt.gpu_memory(m, n, p) for p in (1, 2, 4, 8)]
    assert len({r["weights"] for r in rows}) == 1
    assert rows[0]["weights"] == int(m.params_b * 1e9 * 2)
    assert all(a["fused"] > b["fused"] for a, b in zip(rows, rows[1:], strict=False))
    assert rows[0]["ring_kv"] == 0 and rows[1]["ring_kv"] > 0
    assert rows[0]["scores"] == n * n * m.heads * 2
    assert rows[3]["scores"] == -(-n // 8) * n * m.heads * 2


def test_snap_and_short_parallel():
    assert vt.snap_to_grid(720, 32) == 704 and vt.snap_to_grid(720, 16) == 720
    assert vt.snap_to_grid(5, 16) == 16
    short = {r["id"]: r["official multi-GPU"] for r in vt.model_rows()}
    assert short["cosmos-1.0-diffusion-7b"] == "ring, split over time"
    assert short["wan2.2-t2v-a14b"].startswith("Ulysses all-to-all")
    # derived from its rule at 720p (45 rows of tokens: no P of 2, 4, 8 divides them), not read
    # off the word "height" in the rule's text
    assert short["hunyuanvideo-13b"] == "Ulysses x ring (USP), split over width at 8 GPUs"
    assert vt.short_parallel("split along HEIGHT if ..., else WIDTH") == "TP only"
    opensora = next(r for r in vt.model_rows() if r["id"] == "open-sora-1.2-stdit3")
    assert "max trained" in opensora["default video"]
    assert short["ltx-video-2b"] == "none (single GPU)"


def test_model_rows_match_the_calculator():
    rows = vt.model_rows()
    assert [r["id"] for r in rows] == list(presets())
    for r in rows:
        assert r["_tokens"] == model_tokens(r["id"]).sequence_length
    assert next(r for r in rows if r["id"] == "hunyuanvideo-13b")["video tokens"] == "118,800"


def _lines(ax):
    return [ln for ln in ax.get_lines() if len(ln.get_xdata()) > 2]


def test_growth_figure_draws_the_calculators_numbers():
    fig = vt.growth_figure(720, 1280, fps=24, max_seconds=10, mark_seconds=5)
    ax_t, ax_m = fig.axes
    at5 = []
    for line in _lines(ax_t)[:3]:
        x, y = list(line.get_xdata()), list(line.get_ydata())
        at5.append(y[x.index(5.0)])
    assert at5 == [432_000, 111_600, 57_600]
    hbm = {ln.get_ydata()[0] for ln in ax_m.get_lines() if ln.get_linestyle() == ":"}
    assert hbm == {g.hbm_bytes for g in gpus().values()}  # 80 GB, 141 GB, 180 GB from the data
    assert ax_t.get_yscale() == "log" and ax_m.get_yscale() == "log"


def test_cp_memory_figure_has_hbm_lines_and_falls_with_cp():
    n = model_tokens("hunyuanvideo-13b").sequence_length
    fig = vt.cp_memory_figure("hunyuanvideo-13b", n, highlight_gpu="h200", mark_cp=8)
    ax = fig.axes[0]
    naive = next(ln for ln in ax.get_lines() if ln.get_marker() == "s")
    y = list(naive.get_ydata())
    assert y == sorted(y, reverse=True) and list(naive.get_xdata()) == list(vt.CP_DEGREES)
    hbm = [ln for ln in ax.get_lines() if ln.get_linestyle() == ":"]
    assert {ln.get_ydata()[0] for ln in hbm} >= {80e9, 141e9}
    assert [ln.get_color() for ln in hbm if ln.get_ydata()[0] == 141e9] == ["crimson"]


def test_numbers_snap_frames_and_sizes():
    r = dash.numbers("wan2.1-t2v-14b", fps=16, seconds=5, cp=8)
    assert (r["frames"], r["sequence_length"]) == (81, 75_600)
    assert r["tokens_per_rank"] == 9450 and r["notes"] == []
    r = dash.numbers("wan2.1-t2v-14b", fps=24, seconds=5)
    assert r["frames_wanted"] == 121 and r["frames"] == 121
    r = dash.numbers("cogvideox-2b", fps=8, seconds=5.5)  # 45 frames -> 8n+1 = 49
    assert (r["frames_wanted"], r["frames"]) == (45, 49) and "snapped to 49" in r["notes"][0]
    r = dash.numbers("wan2.2-ti2v-5b", resolution=(720, 1280), fps=24, seconds=5)
    assert (r["height"], r["width"], r["tokens_per_frame"]) == (704, 1280, 880)
    r = dash.numbers("wan2.1-t2v-14b", resolution=(720, 1280), fps=24, seconds=5,
                     manual=(1, 8, (1, 2, 2)))
    assert r["sequence_length"] == 432_000 and r["frames"] == 120
    joint = dash.numbers("hunyuanvideo-13b", fps=24, seconds=5.3)
    assert joint["sequence_length"] == 119_056 and joint["text_tokens"] == 256
    with pytest.raises(InputError, match="CP degree"):
        dash.numbers("latte-xl-2", cp=10**9)


def test_seconds_for_finds_every_presets_default_clip():
    for m in presets().values():
        fps = m.default_fps or 8
        s = dash.seconds_for(m.default_frames, fps, m.rule)
        r = dash.numbers(m.id, fps=fps, seconds=s, cp=1)
        assert r["frames"] == m.default_frames, m.id
        assert r["sequence_length"] == model_tokens(m.id).sequence_length, m.id


def _shown_tokens(d) -> int:
    match = re.search(r"class='cpc-token-count' data-tokens='(\d+)'>([\d,]+)<", d.headline.value)
    assert match, d.headline.value
    assert int(match.group(2).replace(",", "")) == int(match.group(1))
    return int(match.group(1))


def test_dashboard_updates_without_a_display():
    d = dash.token_dashboard(model="wan2.1-t2v-14b", cp=8, gpu="h100", link="nvlink4")
    assert _shown_tokens(d) == 75_600 and d.error is None
    assert d.plot.value[:8] == b"\x89PNG\r\n\x1a\n"
    assert "cpc-dashboard" in d.widget._dom_classes and "cpc-seconds" in d.seconds._dom_classes
    d.seconds.value = 10
    assert _shown_tokens(d) > 75_600 and d.result["frames"] == 161
    d.model.value = "cosmos-1.0-diffusion-7b"  # jumps to the model's own default clip
    assert (d.fps.value, d.result["frames"]) == (24, 121)
    assert _shown_tokens(d) == model_tokens("cosmos-1.0-diffusion-7b").sequence_length
    d.cp.value = 16
    assert d.result["tokens_per_rank"] == 56_320 // 16 and "CP=16" in d.details.value
    d.own_vae.value = False
    assert not d.vae_t.disabled
    d.vae_t.value, d.vae_s.value = 1, 8
    assert d.result["latent_frames"] == d.result["frames"] == 120  # 5 s x 24 fps, no +1
    d.gpu.value = "h200-sxm"
    assert d.result["hbm_bytes"] == gpus()["h200-sxm"].hbm_bytes
    assert d._repr_mimebundle_()  # displayable as the cell's value


def test_verdict_sets_a_guess_beside_the_truth():
    from cpcourse.viz.fmt import verdict

    assert "left the guess empty" in verdict(None, 8, "the CP degree")
    assert "spot on" in verdict(8, 8, "the CP degree")
    assert "off by 4.0x, too low" in verdict(2, 8, "the CP degree")
    assert "too high" in verdict(80, 8, "x") and "close" in verdict(10, 8, "x")
    assert "**8**" in verdict(0, 8, "x")   # a zero guess is shown, not divided by


def test_reveal_folds_answers_in_a_notebook_and_prints_them_elsewhere(monkeypatch, capsys):
    import IPython
    import IPython.display
    from matplotlib.figure import Figure

    fmt.reveal("**A1.** 42", ([{"a": 1, "b": 2}], ["a"]), summary="Show the answers")
    out = capsys.readouterr().out
    assert out.startswith("--- Show the answers (folded in a notebook) ---") and "**A1.** 42" in out
    shown = []
    monkeypatch.setattr(IPython, "get_ipython", lambda: object())
    monkeypatch.setattr(IPython.display, "display", shown.append)
    fig = Figure()
    fig.add_subplot().plot([0, 1])
    fmt.reveal("**A1.** 42", [{"a": 1, "_hidden": 3}], fig, summary="Show the result")
    md = shown[0].data
    assert md.startswith(f'<details class="{fmt.REVEAL_CLASS}"><summary><b>Show the result')
    assert md.rstrip().endswith("</details>") and "\n\n**A1.** 42\n\n" in md  # Markdown inside
    assert "<table" in md and "_hidden" not in md and "data:image/png;base64," in md
