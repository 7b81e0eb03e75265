"""Block-causal (streaming) video attention under CP: who computes what, and the KV cache.

    python -m cpcourse.causal.chunks       # work imbalance and wasted ring traffic, P = 4
    python -m pytest tests/unit/test_causal.py tests/dist/test_causal_cp.py -q

Autoregressive video models (MAGI-1, CausVid, Self-Forcing) make a clip chunk after chunk; each
chunk attends to itself and the chunks before it. Two questions CP must answer for them:
    chunks        the mask, and how dealing chunks out to ranks (contiguous, zigzag, striped,
                  greedy, balanced) balances the work and the tokens and wastes ring traffic
    attention_cp  the attention itself, on a skipping ring or an all-to-all that sends each
                  K/V chunk only where it is needed
    kvcache       streaming: where the cache lives (head-sharded under Ulysses, or by sequence
                  with the queries or the cache travelling) and what each costs per new chunk
"""

from cpcourse.causal.attention_cp import METHODS, block_causal_attention_cp
from cpcourse.causal.chunks import (
    SCHEMES,
    assign_chunks,
    block_causal_mask,
    chunk_of_frames,
    chunk_sizes,
    chunk_work,
    imbalance,
    rank_tokens,
    rank_work,
    ring_traffic,
    wasted_fraction,
)
from cpcourse.causal.kvcache import DESIGNS, KVCacheCP, check_design

__all__ = ["DESIGNS", "METHODS", "SCHEMES", "KVCacheCP", "assign_chunks",
           "block_causal_attention_cp", "block_causal_mask", "check_design", "chunk_of_frames",
           "chunk_sizes", "chunk_work", "imbalance", "rank_tokens", "rank_work", "ring_traffic",
           "wasted_fraction"]
