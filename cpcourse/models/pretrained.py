"""`from_pretrained(arch, path_or_id)`: real weights, through the same class `build` uses.

    python -c "from cpcourse.models import from_pretrained; from_pretrained('wan', '/no/such')"

A hub id ("Wan-AI/Wan2.1-T2V-1.3B-Diffusers") is downloaded by diffusers. Anything that looks
like a local path is checked here first, because diffusers reads a missing folder as a hub id:
it tries the network (seconds offline) and then fails six frames deep with a message about
huggingface.co. A local path must be a folder holding `<subfolder>/config.json` for the arch's
class; every other case is an InputError that names `path_or_id` and what to change.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re

import torch

from cpcourse.models.build import arch_info, model_class
from cpcourse.support.errors import InputError, require

# A hub id is "name" or "org/name" of word characters, "-" and "." (huggingface_hub's rule).
_HUB_ID = re.compile(r"[\w.-]+(/[\w.-]+)?")


def looks_local(path: str) -> bool:
    """Whether `path` can only mean a local folder: it exists, is absolute or starts with "." or
    "~", has more than one separator, is no hub id, or its first part is a local folder."""
    if os.path.exists(path) or path.startswith((os.sep, ".", "~")):
        return True
    parts = path.split("/")
    return (not _HUB_ID.fullmatch(path) or ".." in path or len(parts) > 2
            or (os.altsep is not None and os.altsep in path) or os.path.isdir(parts[0]))


def has_accelerate() -> bool:
    return importlib.util.find_spec("accelerate") is not None


def check_local(arch: str, path: str, subfolder: str | None) -> None:
    """InputError unless `path` is a folder whose `subfolder` holds a config.json for `arch`."""
    cls = arch_info(arch).cls
    where = os.path.join(subfolder, "config.json") if subfolder else "config.json"
    hint = f"give the folder that holds {where} (a diffusers pipeline folder)"
    require(os.path.exists(path), f"path_or_id {path!r}: no such file or folder: {hint}, or a "
            f"hub id such as {arch_info(arch).real!r}")
    require(os.path.isdir(path), f"path_or_id {path!r} is a file, not a folder: {hint}")
    config = os.path.join(path, where)
    require(os.path.isfile(config), f"path_or_id {path!r} has no {where}: {hint}, or pass "
            "subfolder= (None when the config is at the top)")
    try:
        with open(config, encoding="utf-8") as f:
            entries = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"path_or_id {path!r}: {where} is not readable JSON ({exc}): "
                         "download the model again") from None
    require(isinstance(entries, dict), f"path_or_id {path!r}: {where} is not a JSON object")
    found = entries.get("_class_name", cls)
    require(found == cls, f"path_or_id {path!r}: {where} is for a {found}, and arch {arch!r} "
            f"loads a {cls}: choose the arch that matches the weights")


def from_pretrained(arch: str, path_or_id, dtype=torch.bfloat16, subfolder="transformer"):
    """Real weights: `<Class>.from_pretrained(path_or_id, subfolder=..., torch_dtype=dtype)`.

    The same class as `build`, so `parallelize` treats it the same way. Downloads when given a
    hub id (never called so by the tests); a local folder is checked first (`check_local`) and
    loaded without the network.
    """
    info = arch_info(arch)
    require(isinstance(path_or_id, str | os.PathLike),
            f"path_or_id must be a folder or a hub id (a string), got {path_or_id!r}")
    path = os.fspath(path_or_id)
    require(path.strip() != "", f"path_or_id is empty: give a folder or a hub id such as "
            f"{info.real!r}")
    cls = model_class(arch)
    # diffusers keeps these modules in float32 only through accelerate's loader, and without
    # it refuses after the download (28 GB for Wan 14B) with a message about low_cpu_mem_usage
    require(not getattr(cls, "_keep_in_fp32_modules", None) or has_accelerate(),
            f"diffusers loads {info.cls} (some of its modules stay float32) only with "
            "accelerate installed: pip install accelerate")
    if not looks_local(path):
        return cls.from_pretrained(path, subfolder=subfolder, torch_dtype=dtype).eval()
    check_local(arch, path, subfolder)
    try:
        model = cls.from_pretrained(path, subfolder=subfolder, torch_dtype=dtype,
                                    local_files_only=True)
    except InputError:
        raise
    except (OSError, ValueError, TypeError, KeyError) as exc:  # missing weights, bad entries
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"path_or_id {path!r}: diffusers could not load {info.cls} from it "
                         f"({first})") from None
    return model.eval()
