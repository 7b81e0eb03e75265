"""Approximate parallel sampling: methods that trade exactness for communication.

    cpcourse generate --prompt circle-right --nproc 2 --approx displaced --warmup 1 --compare

Every CP method before this chapter is exact. These are not: each lets a rank compute with
activations that are missing or one denoising step old, so less is sent, or it is sent off the
critical path. One module per method, each a `ctx.attend` hook or a wrapper the unchanged
sampler (`cpcourse.tinydit.sampling.sample`) drives:

    patches     what the patch methods share: a rank's frames, other ranks' K/V as it gets them
    naive       other ranks' K/V never arrive (after the warm-up): attend to your own frames
    displaced   DistriFusion: other ranks' K/V from the previous step, gathered asynchronously
    pipefusion  PipeFusion: layer stages over the ranks, M frame patches, a stale K/V buffer
    asyncdiff   AsyncDiff: block components over the ranks, each on last step's input
    fbcache     first-block cache: skip a step whose first block barely changed (all ranks agree)
    rank        what each rank of `cpcourse generate --approx` runs
    costs       the bytes each rank sends per step, per method; quality: PSNR vs the exact clip
    projection  the same traffic on a real model and GPU link: what each method leaves exposed,
                and the memory per rank it holds (weights, stale buffers, activations)
    papers      what the methods' papers published, with sources

The first `warmup` steps of every method are exact (synchronous); with warmup >= steps every
method gives the exact clip.
"""

METHODS = ("naive", "displaced", "pipefusion", "asyncdiff")
CACHES = ("fbcache",)
