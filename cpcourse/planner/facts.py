"""The facts sheet: the one reader of `cpcourse/data/*.json`, each file a sourced table.

    python -c "from cpcourse.planner.facts import facts; print(sorted(facts()))"

    video_models_and_hardware.json  models, GPUs, links, calculator defaults, the article's claims
    published_runs.json             published multi-GPU generation times (the validation set)
    published_runs_holdout.json     runs found later, kept out of the validation set
    published_runs_settings.json    how each published run was made (FSDP, offloading, ...)
    published_runs_provenance.json  per table: source_id, what its time includes, its kernel,
                                    whether it is truly held out
    published_runs_added.json       runs found for issue 44 from other sources (TensorRT-LLM's
                                    Wan 2.2 A14B on B200 and GB200 NVL72), with the same fields
    vae_decode_flops.json           FLOPs per latent pixel of each decoder (tools/derive_vae_flops)
    vae_decode_measured.json        measured VAE decode times, for the decode's share of peak
    vae_decode_memory.json          the decoders' working memory (tools/derive_vae_memory)
    vae_decode_halo.json            what a decode split by height sends (tools/derive_vae_halo)
    dit_derived_costs.json          each DiT's matmul FLOPs and element-wise bytes per token
                                    (tools/derive_dit_costs)
    gpu_measured_*.json             what `cpcourse bench gpu` measured on a GPU, with provenance

Each loader is cached: the files ship with the package and do not change while it runs. Callers
read, never write, what they get back.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from cpcourse.support.errors import require


def read(name: str) -> dict:
    """`cpcourse/data/<name>`, parsed."""
    return json.loads(resources.files("cpcourse").joinpath(f"data/{name}").read_text())


@lru_cache(maxsize=1)
def facts() -> dict:
    """The sourced facts sheet shipped with the package (models, GPUs, links, blog claims)."""
    return read("video_models_and_hardware.json")


@lru_cache(maxsize=1)
def published_runs() -> dict:
    """Published multi-GPU generation times for planner validation ("about" and "runs"), shipped
    with the package: an unchanged copy of the facts sheet's published_runs.json. Each run names
    its GPU by an id `cpcourse.planner.hardware.get_gpu` accepts (h100, h20, h800, a800, l20,
    rtx4090)."""
    return read("published_runs.json")


def holdout_runs() -> dict:
    """Published runs in `published_runs`' format that the course found later and keeps apart
    from the validation set (xDiT's HunyuanVideo 960x960 table); each notes which code ran it and
    where a time repeats another table's. Not held out in the strict sense: same page, GPUs and
    token count as a validation table, and read before the planner last changed
    (`run_provenance`)."""
    return read("published_runs_holdout.json")


def added_runs() -> dict:
    """Published runs added from sources the planner was not built on ("about", "sources",
    "runs"): `published_runs`' fields plus source_id, includes, kernel (with kernel_source),
    held_out, and seconds_denoise where the source gives it."""
    return read("published_runs_added.json")


@lru_cache(maxsize=1)
def run_provenance() -> dict:
    """Per published table (`published_runs` and `holdout_runs` alike): its `source_id` (one
    independent source, for leave-one-source-out validation), `includes` (which parts of a
    generation its time covers: text_encode, denoise, vae_decode, first_call_warmup,
    model_load; True, False or None where not stated), its attention `kernel` ("unknown" where
    the source does not name it) with `kernel_source`, and `held_out`. Key "sources" describes
    each source_id, key "tables" maps each table to its row."""
    return read("published_runs_provenance.json")


@lru_cache(maxsize=1)
def published_runs_settings() -> list[dict]:
    """The rules saying how each published run was made, each with its source."""
    rules = read("published_runs_settings.json")["rules"]
    for rule in rules:
        require(rule["gpus"] in ("1", "2+"), f"published_runs_settings.json: a rule's gpus is "
                f"'1' or '2+', not {rule['gpus']!r}")
    return rules


@lru_cache(maxsize=1)
def vae_flops_table() -> dict:
    """FLOPs per latent pixel of each VAE family's decoder."""
    return read("vae_decode_flops.json")["families"]


@lru_cache(maxsize=1)
def vae_measurements() -> list[dict]:
    """Measured VAE decode times, one row per family and GPU."""
    return read("vae_decode_measured.json")["measurements"]


@lru_cache(maxsize=1)
def vae_memory_table() -> dict:
    """Each VAE family's decoder: parameters and working memory."""
    return read("vae_decode_memory.json")["families"]


@lru_cache(maxsize=1)
def vae_halo_table() -> dict:
    """Each splittable VAE family's decoder: halo elements per boundary, exchanges and the
    mid-block's gathered elements, as lines in the latent's frames and width."""
    return read("vae_decode_halo.json")["families"]


@lru_cache(maxsize=1)
def dit_derived_costs() -> dict:
    """Per preset id: matmul FLOPs and element-wise bytes of one forward as lines in the tokens
    (`*_per_token`, `*_fixed`), derived from diffusers' classes on the meta device."""
    return read("dit_derived_costs.json")["models"]


GPU_MEASURED = ("gpu_measured_h200.json",)


@lru_cache(maxsize=1)
def gpu_measured() -> dict:
    """Per GPU id: the results `cpcourse bench gpu` wrote on that GPU (provenance, tests,
    kernels, models), as committed."""
    runs = [read(name) for name in GPU_MEASURED]
    return {run["provenance"]["gpu_id"]: run for run in runs}
