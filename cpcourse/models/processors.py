"""Attention processors that run a diffusers model's self-attention under CP.

    python -m cpcourse.cli models --arch wan --nproc 2 --method ring --compare

diffusers lets a model's attention be swapped per module (`attn.set_processor`). Each processor
here does what the model's own processor does, token by token (projections, q/k norms, rotary
on the video tokens), then calls `cp_attention` instead of one local softmax. Everything before
that call works per token, so on a shard it runs unchanged; only the softmax needs the other
ranks' keys.

    Wan          attn1 (video self-attention) only; attn2, the text cross-attention, keeps
                 diffusers' processor: its keys are the replicated text, all on every rank
    HunyuanVideo every dual-stream block (text projected by its own added q/k/v) and every
                 single-stream block (text concatenated behind the video): text joined, once
    CogVideoX    every block: text concatenated in front of the video, joined, once
"""

from __future__ import annotations

import torch

from cpcourse.models.attention import cp_attention
from cpcourse.support.errors import InputError


class _CPProcessor:
    def __init__(self, cp, original):
        self.cp = cp
        self.original = original  # put back by unparallelize


def _wan_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Wan's rotary on `[B, L, H, D]`: channel pairs (2i, 2i+1) turned by the pair's angle."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[..., 0::2], sin[..., 1::2]  # each angle is stored twice, once per channel
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * c - x2 * s
    out[..., 1::2] = x1 * s + x2 * c
    return out.type_as(x)


class WanCPProcessor(_CPProcessor):
    """Wan's video self-attention (attn1) over the whole video, from this rank's frame shard."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 rotary_emb=None):
        if encoder_hidden_states is not None or attention_mask is not None:
            raise InputError("WanCPProcessor is for Wan's self-attention (attn1) without a mask")
        if attn.fused_projections:  # hidden_states [B, L_r, C] -> q, k, v [B, L_r, H*D]
            q, k, v = attn.to_qkv(hidden_states).chunk(3, dim=-1)
        else:
            q, k, v = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        q, k = attn.norm_q(q), attn.norm_k(k)  # across heads: per token, so fine on a shard
        q, k, v = (t.unflatten(2, (attn.heads, -1)) for t in (q, k, v))  # [B, L_r, H, D]
        if rotary_emb is not None:  # the shard's own rows (cpcourse.models.rotary)
            q, k = _wan_rotate(q, *rotary_emb), _wan_rotate(k, *rotary_emb)
        out, _ = cp_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), self.cp)
        out = out.transpose(1, 2).flatten(2, 3).type_as(q)  # [B, H, L_r, D] -> [B, L_r, H*D]
        return attn.to_out[1](attn.to_out[0](out))


def text_keep_lengths(attention_mask, n_text: int) -> list[int] | None:
    """Leading real text tokens per sample from HunyuanVideo's key mask `[B, 1, 1, L + N]`."""
    if attention_mask is None:
        return None
    m = attention_mask.reshape(attention_mask.shape[0], -1)[:, -n_text:].bool()  # [B, N]
    keep = m.sum(dim=1)
    lead = torch.arange(n_text, device=m.device)[None] < keep[:, None]
    if not torch.equal(m, lead) or bool(
            (~attention_mask.reshape(m.shape[0], -1)[:, :-n_text].bool()).any()):
        raise InputError("under CP the attention mask may only pad the END of the text tokens "
                         "(HunyuanVideo's own mask does); this one masks other tokens")
    return keep.tolist()


class HunyuanCPProcessor(_CPProcessor):
    """HunyuanVideo's joint video+text attention (dual- and single-stream blocks) under CP."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 image_rotary_emb=None):
        from diffusers.models.embeddings import apply_rotary_emb

        if encoder_hidden_states is None:
            raise InputError("HunyuanCPProcessor expects the text tokens beside the video")
        n_text = encoder_hidden_states.shape[1]
        single = attn.add_q_proj is None  # single-stream: text rides behind the video
        # single: [B, L_r + N, C] (video, then text); dual: the video [B, L_r, C]
        x = torch.cat([hidden_states, encoder_hidden_states], dim=1) if single else hidden_states
        # [B, L_r (+ N), H, D]
        q, k, v = (f(x).unflatten(2, (attn.heads, -1)) for f in (attn.to_q, attn.to_k, attn.to_v))
        if attn.norm_q is not None:
            q = attn.norm_q(q)
        if attn.norm_k is not None:
            k = attn.norm_k(k)
        if single:  # video [B, L_r, H, D], text [B, N, H, D]
            (q, tq), (k, tk), (v, tv) = ((t[:, :-n_text], t[:, -n_text:]) for t in (q, k, v))
        else:  # the text's own projections: [B, N, C] -> [B, N, H, D]
            tq, tk, tv = (f(encoder_hidden_states).unflatten(2, (attn.heads, -1))
                          for f in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj))
            if attn.norm_added_q is not None:
                tq = attn.norm_added_q(tq)
            if attn.norm_added_k is not None:
                tk = attn.norm_added_k(tk)
        if image_rotary_emb is not None:  # video tokens only, at their global positions
            q = apply_rotary_emb(q, image_rotary_emb, sequence_dim=1)
            k = apply_rotary_emb(k, image_rotary_emb, sequence_dim=1)
        bhld = lambda t: t.transpose(1, 2)  # noqa: E731  [B, L, H, D] -> [B, H, L, D]
        out, text_out = cp_attention(bhld(q), bhld(k), bhld(v), self.cp,
                                     text=(bhld(tq), bhld(tk), bhld(tv)),
                                     text_keep=text_keep_lengths(attention_mask, n_text))
        out = out.transpose(1, 2).flatten(2, 3).to(q.dtype)  # [B, H, L_r, D] -> [B, L_r, H*D]
        text_out = text_out.transpose(1, 2).flatten(2, 3).to(q.dtype)  # -> [B, N, H*D]
        if getattr(attn, "to_out", None) is not None:
            out = attn.to_out[1](attn.to_out[0](out))
        if getattr(attn, "to_add_out", None) is not None:
            text_out = attn.to_add_out(text_out)
        return out, text_out


class CogVideoXCPProcessor(_CPProcessor):
    """CogVideoX's attention over [text; video] under CP: text in front, joined, once."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 image_rotary_emb=None):
        from diffusers.models.embeddings import apply_rotary_emb

        if attention_mask is not None or encoder_hidden_states is None:
            raise InputError("CogVideoXCPProcessor expects text tokens and no attention mask")
        n_text = encoder_hidden_states.shape[1]
        x = torch.cat([encoder_hidden_states, hidden_states], dim=1)  # [B, N + L_r, C]
        b = x.shape[0]
        q, k, v = (f(x).view(b, x.shape[1], attn.heads, -1).transpose(1, 2)
                   for f in (attn.to_q, attn.to_k, attn.to_v))  # [B, H, N + L_r, D]
        if attn.norm_q is not None:
            q = attn.norm_q(q)
        if attn.norm_k is not None:
            k = attn.norm_k(k)
        # text [B, H, N, D] and video [B, H, L_r, D]
        (tq, q), (tk, k), (tv, v) = ((t[:, :, :n_text], t[:, :, n_text:]) for t in (q, k, v))
        if image_rotary_emb is not None:
            q = apply_rotary_emb(q, image_rotary_emb)
            k = apply_rotary_emb(k, image_rotary_emb)
        out, text_out = cp_attention(q, k, v, self.cp, text=(tq, tk, tv))
        # [B, H, N + L_r, D] -> [B, N + L_r, C]
        joined = torch.cat([text_out, out], dim=2).transpose(1, 2).reshape(b, -1, x.shape[-1])
        joined = attn.to_out[1](attn.to_out[0](joined))
        # text [B, N, C], video [B, L_r, C]
        text_out, out = joined.split([n_text, joined.shape[1] - n_text], dim=1)
        return out, text_out


PROCESSORS = {"WanTransformer3DModel": WanCPProcessor,
              "HunyuanVideoTransformer3DModel": HunyuanCPProcessor,
              "CogVideoXTransformer3DModel": CogVideoXCPProcessor}


def cp_attention_modules(model) -> list:
    """The attention modules whose softmax runs over the video sequence (what CP replaces)."""
    name = type(model).__name__
    if name == "WanTransformer3DModel":
        return [blk.attn1 for blk in model.blocks]
    if name == "HunyuanVideoTransformer3DModel":
        return [blk.attn for blk in (*model.transformer_blocks, *model.single_transformer_blocks)]
    if name == "CogVideoXTransformer3DModel":
        return [blk.attn1 for blk in model.transformer_blocks]
    raise InputError(f"no CP attention processor for {name}")
