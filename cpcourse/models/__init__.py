"""Context parallelism on real diffusers video transformers: Wan, HunyuanVideo, CogVideoX.

    python -m cpcourse.cli models --arch wan --nproc 2 --method ring --compare

    model = cpcourse.models.build("wan")                  # tiny, random weights, no download
    cpcourse.models.parallelize(model, method="ulysses")  # on every rank, in place
    out = model(**cpcourse.models.example_inputs("wan")).sample   # the full output everywhere

`parallel` (the hooks: where the sequence is split and gathered), `processors` (each model's
attention under CP), `attention` (the softmax over every rank's keys, text counted once),
`text_ring` (two placements of joined text in a ring, simulated, with their bytes),
`rotary` (a shard's rotary rows at its global frame offset), `tiny` (configs and inputs),
`sampler` (the model's own scheduler with CFG around it), `shards` (frame shards in and out),
`compare` (what the CLI runs), `pretrained` (real weights, a local folder checked first).
"""

from cpcourse.models.build import ARCHS, build, example_inputs, latent_shape
from cpcourse.models.parallel import METHODS, parallelize, unparallelize
from cpcourse.models.pretrained import from_pretrained
from cpcourse.models.shards import gather_latents, shard_latents

__all__ = ["ARCHS", "METHODS", "build", "example_inputs", "from_pretrained", "gather_latents",
           "latent_shape", "parallelize", "shard_latents", "unparallelize"]
