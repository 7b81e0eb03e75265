"""What the papers of the approximate methods published, with their sources: the figures
notebook 13 quotes, kept in one place so that no number in its prose is typed by hand.

    python -c "from cpcourse.approx.papers import PUBLISHED; print(PUBLISHED['asyncdiff'])"

Only what the papers' abstracts and the repositories' READMEs state; per-table figures (FID per
GPU count, LPIPS per warm-up) are left out where the course could not check them against the
paper's tables.
"""

from __future__ import annotations

PUBLISHED = {
    "distrifusion": {
        "model": "Stable Diffusion XL", "gpus": 8, "gpu": "A100", "speedup": 6.1,
        "quality": "no quality degradation", "modality": "images",
        "src": "Li et al., DistriFusion, CVPR 2024, arXiv 2402.19481, abstract",
    },
    "asyncdiff": {
        "model": "Stable Diffusion v2.1", "gpus": 4, "gpu": "A5000",
        "speedup_negligible": 2.7, "speedup": 4.0, "clip_score_drop": 0.38,
        "modality": "images and video",
        "video_models": ("Stable Video Diffusion", "AnimateDiff"),
        "src": "Chen et al., AsyncDiff, NeurIPS 2024, arXiv 2406.06911, abstract (\"can be "
               "readily applied to video diffusion models\"); czg1225/AsyncDiff README (SVD, "
               "AnimateDiff)",
    },
    "pipefusion": {
        "src": "Fang et al., PipeFusion, arXiv 2405.14430: each device runs L / N layers on "
               "all M patches per step, holding its stage's K/V",
    },
}
