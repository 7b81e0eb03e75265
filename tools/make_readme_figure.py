"""Draw the README's picture: notebook 07's clip at P = 1, 2, 4 and the difference, as a strip.

    python tools/make_readme_figure.py      # writes book/images/same_clip_p1_p2_p4.png

The trained shapes model draws `circle-right` in this process (P = 1) and on 2 and 4 processes
under context parallelism (`run_generate`, the ring); the last row is |P=4 - P=1| x 10^4, black
when CP is exact. Everything drawn is computed here, as notebook 07 section 4 computes it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cpcourse.runs.generate import run_generate
from cpcourse.tinydit.training import generate_clip, load_weights, shipped_path
from cpcourse.viz.clips import strip_figure

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "book" / "images" / "same_clip_p1_p2_p4.png"
PROMPT = "circle-right"


def main(out: Path = OUT) -> Path:
    model, _ = load_weights(shipped_path())
    clips = {1: generate_clip(model, PROMPT, seed=0)}
    for p in (2, 4):
        clips[p] = run_generate(p, seed=0, prompt=PROMPT, timeout=180)["clip"]
    diff = float((clips[4] - clips[1]).abs().max())
    rows = {f"P = {p}": c for p, c in clips.items()}
    rows["|P=4 − P=1| × 10⁴"] = ((clips[4] - clips[1]).abs() * 1e4).clamp(0, 1)
    fig = strip_figure(rows, f"'{PROMPT}' drawn on 1, 2 and 4 processes "
                             f"(largest difference {diff:.1e})")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=96)
    print(f"wrote {out.relative_to(ROOT)} ({out.stat().st_size / 1e3:.0f} kB)", file=sys.stderr)
    return out


if __name__ == "__main__":
    main()
