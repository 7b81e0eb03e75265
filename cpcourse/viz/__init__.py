"""Figures and ipywidgets dashboards for the notebooks; every number drawn comes from cpcourse.

    python -m cpcourse.viz.tokens artifacts

`fmt` turns bytes, seconds and counts into text; `tokens` draws token growth and memory per GPU;
`dashboard` is notebook 00's interactive calculator; `seed` audits the article the course grew
from. Submodules import matplotlib and ipywidgets only when used.
"""


def write_figures(figures: dict, dpi: int = 100):
    """What a viz module's `python -m` does: save each figure {stem: Figure} as PNG in the
    folder named by the first argument (default artifacts/); returns the folder."""
    import sys
    from pathlib import Path

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "artifacts")
    out.mkdir(parents=True, exist_ok=True)
    for stem, fig in figures.items():
        fig.savefig(out / f"{stem}.png", dpi=dpi)
    print(f"wrote {', '.join(f'{stem}.png' for stem in figures)} to {out}")
    return out
