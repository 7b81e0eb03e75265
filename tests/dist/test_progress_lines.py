"""`cpcourse generate --json` on 2 processes: one JSON object on stdout; on stderr "starting 2
ranks", rank 0's step counter and the time it took (`cpcourse.cli.progress`)."""

from __future__ import annotations

import json

import pytest

from cpcourse.cli import main

pytestmark = pytest.mark.timeout(240)


def test_generate_says_its_ranks_and_steps_on_stderr(capsys):
    assert main(["generate", "--prompt", "circle-right", "--nproc", "2", "--steps", "2",
                 "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["nproc"] == 2
    assert err.splitlines()[0] == "starting 2 ranks: circle-right, 2 denoising steps"
    assert "[rank 0] step 1/2" in err and "[rank 0] step 2/2" in err, err
    assert err.splitlines()[-1].startswith("2 ranks done in ")
