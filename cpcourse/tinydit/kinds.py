"""What a tiny DiT weights file holds: the bidirectional model or the chunk-causal one.

    cpcourse generate --causal --weights my_causal.safetensors   # refused if the file is not

Read from the file's metadata only (`cpcourse.tinydit.model.save_weights` writes it), so a
command can refuse the wrong weights before it builds a model or starts a rank.
"""

from __future__ import annotations

from cpcourse.support.errors import require

KINDS = ("bidirectional", "chunk-causal")


def weights_kind(meta: dict) -> dict:
    """What a weights file holds, from its metadata: {"model": "bidirectional"} or
    {"model": "chunk-causal", "chunk": C} (frames per chunk it was trained with). Files written
    before `kind` existed (the shipped ones among them) say it by their "causal" entry, which
    `cpcourse train --causal` has always written: without it the model is bidirectional."""
    if isinstance(meta.get("kind"), dict):
        kind = meta["kind"]
        require(kind.get("model") in KINDS, f"weights: unknown kind {kind!r}")
        return kind
    if isinstance(meta.get("causal"), dict):
        return {"model": "chunk-causal", "chunk": int(meta["causal"]["chunk"])}
    return {"model": "bidirectional"}


def require_kind(path: str, meta: dict, causal: bool) -> dict:
    """`weights_kind`, or an InputError when the file is not the model the command samples
    (`causal`: the chunk-causal one, streamed; else the bidirectional one)."""
    kind = weights_kind(meta)
    if causal:
        require(kind["model"] == "chunk-causal", f"weights {path}: these weights are "
                "bidirectional, not a chunk-causal model: drop --causal, or train one with "
                "`cpcourse train --causal`")
    else:
        require(kind["model"] == "bidirectional", f"weights {path}: these weights are "
                f"chunk-causal (trained with chunk {kind.get('chunk')}): add --causal to stream "
                "them chunk by chunk")
    return kind
