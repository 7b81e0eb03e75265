"""Every test under tests/gpu is a `gpu` test and needs CUDA: marked and skipped here, once.

    python -m pytest -m gpu tests/gpu -q        # on a CUDA machine (skipped elsewhere)

A file here adds only what else it needs (the Triton kernel's file: Triton itself).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before `-m gpu` selects: the mark must be on the items by then
def pytest_collection_modifyitems(config, items):
    skip = None if torch.cuda.is_available() else pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.gpu)
            if skip is not None:
                item.add_marker(skip)
