"""Hostile input on the command line: exit 0 with one strict JSON object, or exit 2 with one line.

    python -m pytest tests/unit/test_cli_fuzz.py -q
    CPCOURSE_FUZZ_EXAMPLES=5000 python -m pytest tests/unit/test_cli_fuzz.py -q   # look harder

Hypothesis draws arguments for every calculator subcommand (tokens, memory, comm, plan) from
valid, boundary and hostile values (0, -1, 2**63, nan, inf, 1e308, 1e-320, "", words, unknown ids)
and calls the command in-process. Whatever it draws, the command either succeeds with one JSON
object that strict parsers accept (no NaN, no Infinity) or fails with status 2 and exactly one
line on stderr; no exception escapes and no call runs for long. The commands that start
processes (demo, generate in each mode, models, vae, bench
ring|models|launch|windows|mesh|vae|approx) get hostile values only: they must refuse before
any process starts. Derandomized, so CI sees the same examples every run.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
from unittest import mock

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cpcourse.cli import main

EXAMPLES = int(os.environ.get("CPCOURSE_FUZZ_EXAMPLES", "300"))
SECONDS_PER_CALL = 20  # a bound for hangs, not a speed test: a healthy call takes milliseconds

HOSTILE = ["", " ", "abc", "nan", "NaN", "inf", "-inf", "-1", "0", "-0", "1e308", "1e-320",
           "99999999999999999999", str(2**63), "0x10", "1_000", "3.5", "--json", "١٢"]
INTS = st.one_of(st.sampled_from(["1", "2", "3", "7", "8", "16", "64", "120", "1280", "4096",
                                  "432000", "1000000000", str(2**31)]),
                 st.integers(-5, 10**7).map(str), st.sampled_from(HOSTILE))
FLOATS = st.one_of(st.sampled_from(["0.5", "1", "5", "16", "24", "450", "1e-3", "1e6", "0.001"]),
                   st.floats(allow_nan=True, allow_infinity=True).map(repr),
                   st.sampled_from(HOSTILE))
MODELS = st.sampled_from(["wan2.1-t2v-14b", "hunyuanvideo-13b", "cosmos-1.0-diffusion-7b",
                          "mochi-1", "nope", "", "WAN2.1-T2V-14B"])
WORDS = {"--dtype": ["fp32", "bf16", "fp16", "fp8", "", "float32"],
         "--link": ["nvlink4", "ib-ndr", "pcie5", "nope", ""],
         "--gpu": ["h100", "h200", "a100", "tpu", ""],
         "--patch": ["1,2,2", "0,2,2", "1,2", "a,b,c", "", "1,-2,2", "1,2,2,2"]}

FLAGS = {
    "tokens": {"--height": INTS, "--width": INTS, "--frames": INTS, "--fps": FLOATS,
               "--seconds": FLOATS, "--model": MODELS, "--vae-temporal": INTS,
               "--vae-spatial": INTS, "--patch": st.sampled_from(WORDS["--patch"])},
    "memory": {"--tokens": INTS, "--hidden": INTS, "--heads": INTS, "--cp": INTS,
               "--dtype": st.sampled_from(WORDS["--dtype"]), "--ffn": INTS,
               "--params-b": FLOATS, "--model": MODELS},
    "comm": {"--tokens": INTS, "--cp": INTS, "--heads": INTS, "--head-dim": INTS,
             "--dtype": st.sampled_from(WORDS["--dtype"]),
             "--link": st.sampled_from(WORDS["--link"]), "--bandwidth": FLOATS,
             "--link-efficiency": FLOATS, "--attn-efficiency": FLOATS, "--layers": INTS,
             "--gpu": st.sampled_from(WORDS["--gpu"])},
    "plan": {"--model": MODELS, "--gpus": INTS, "--nodes": INTS, "--height": INTS,
             "--width": INTS, "--frames": INTS, "--gpu": st.sampled_from(WORDS["--gpu"]),
             "--steps": INTS, "--kernel": st.sampled_from(["auto", "fa2", "fa3", "sdpa", "x"]),
             "--layout": st.sampled_from(["cfg=2,ulysses=4", "ring=8", "tp=3", "ring=0", "x=2",
                                          "", "ulysses=2,ring=2,tp=2",
                                          "cfg=2,attn2d=2x2", "attn2d=3x"]),
             "--objective": st.sampled_from(["latency", "throughput", "x", ""]),
             "--max-seconds": FLOATS,
             "--text-encoder": st.sampled_from(["resident", "freed", "cpu", "own-gpu", "x"]),
             **{f: st.none() for f in ("--validate", "--released", "--offload", "--fsdp",
                                       "--text-encoder-cpu", "--parallel-vae")}},
}
# Commands that start processes: only values every check refuses, so nothing is launched.
REFUSED = ["0", "-1", "nan", "inf", "1e308", "abc", "", str(2**63)]
ANY_NUMBER_REFUSED = ["nan", "inf", "-inf", "1e308", "abc", ""]  # for flags that take 0 or < 0
SEEDS_REFUSED = ["-1", str(2**64), "nan", "abc", ""]


BAD_OUTPUTS = [".", "newdir/", "/dev/null", "/dev/stdout", "nodir/x.pt", "/proc/x"]
CAUSAL_WEIGHTS = "cpcourse/data/shapes_causal_dit.safetensors"  # refused without --causal
PLAIN_WEIGHTS = "cpcourse/data/shapes_dit.safetensors"          # refused with it


def _refused(*flags: str) -> dict[str, list[str]]:
    return {f: REFUSED for f in flags}


# Each command (with the flags that choose its mode) and the flags to poison in that mode.
LAUNCHING = {"demo": _refused("--nproc", "--seq-len", "--heads", "--head-dim", "--timeout"),
             "generate": {**_refused("--nproc", "--frames", "--steps", "--timeout"),
                          "--cfg": ANY_NUMBER_REFUSED, "--seed": SEEDS_REFUSED},
             "generate --window 4": {**_refused("--nproc", "--frames", "--stride", "--steps",
                                                "--timeout", "--height"),
                                     "--cfg": ANY_NUMBER_REFUSED, "--seed": SEEDS_REFUSED},
             "generate --causal": {**_refused("--nproc", "--steps", "--timeout"),
                                   "--chunk": [*REFUSED, "8", "4", "3"],   # trained with 2
                                   "--weights": [PLAIN_WEIGHTS, "nofile", "/dev/null"],
                                   "--cfg": ANY_NUMBER_REFUSED, "--seed": SEEDS_REFUSED},
             "generate --approx displaced": {**_refused("--nproc", "--steps", "--timeout"),
                                             "--warmup": ["-1", "nan", "abc", "", "1000",
                                                          "99999999999999999999"]},
             # outputs: folders, a trailing slash, devices, links, missing folders
             "generate --force": {"--save": BAD_OUTPUTS, "--gif": BAD_OUTPUTS},
             "generate --steps 1": {"--weights": [CAUSAL_WEIGHTS, "nofile", "/dev/null"],
                                    "--compare-to": ["nofile", "/dev/null", "."]},
             "train --steps 1": {"--out": BAD_OUTPUTS},
             "vae --arch wan --force": {"--save": BAD_OUTPUTS},
             "generate --approx pipefusion": _refused("--patches"),
             "generate --cache fbcache": {"--cache-threshold": ["-1", "nan", "inf", "abc", ""]},
             "generate --layout cfg=2": {**_refused("--frames", "--steps", "--timeout"),
                                         "--seed": SEEDS_REFUSED},
             "models --arch wan": {**_refused("--nproc", "--frames", "--height", "--width",
                                              "--batch", "--sample-steps", "--timeout"),
                                   "--seed": SEEDS_REFUSED},
             "models --arch wan --method usp": _refused("--ulysses"),
             "models --arch wan --sample-steps 2": {"--cfg-scale": [*ANY_NUMBER_REFUSED, "1e4"]},
             "vae --arch wan": {**_refused("--nproc", "--frames", "--height", "--width",
                                           "--timeout"), "--seed": SEEDS_REFUSED},
             "bench vae": _refused("--frames", "--size"),
             "bench ring": _refused("--nproc", "--seq-len", "--heads", "--repeats"),
             "bench models": _refused("--nproc", "--frames", "--size", "--timeout"),
             "bench launch": _refused("--nproc", "--repeats"),
             "bench approx": {**_refused("--seeds", "--steps", "--nproc"),
                              "--warmups": ["-1", "abc", "", "1,x", "99999999999999999999"],
                              "--thresholds": ["-1", "nan", "abc", ""]},
             "bench tiling": {**_refused("--tokens", "--heads", "--head-dim"),
                              "--seed": SEEDS_REFUSED, "--grids": ["0x4", "2x", "abc", "", "9x9"]},
             "bench windows": _refused("--window", "--stride", "--seeds", "--steps"),
             "bench mesh": _refused("--frames", "--size", "--hidden", "--depth", "--steps",
                                    "--repeats")}


def _strict(text: str):
    def refuse(name):
        raise ValueError(f"not strict JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def _call(argv: list[str]) -> tuple[int, str, str, float]:
    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue(), time.perf_counter() - start


def _check(argv: list[str], code: int, out: str, err: str, seconds: float) -> None:
    assert seconds < SECONDS_PER_CALL, f"{argv} took {seconds:.1f} s"
    if code == 0:
        value = _strict(out)
        assert isinstance(value, dict), f"{argv}: --json printed {type(value).__name__}"
    else:
        assert code == 2, f"{argv}: exit {code}\n{err}"
        assert out == "", f"{argv}: printed on stdout before failing: {out[:200]}"
        assert err.count("\n") == 1 and err.startswith("cpcourse: error: "), f"{argv}: {err!r}"
        assert "Traceback" not in err


# A valid call of each calculator: mutating a few of its flags reaches the success paths and
# their boundaries, which arguments drawn from scratch almost never do.
VALID = {"tokens": {"--height": "720", "--width": "1280", "--frames": "121",
                    "--vae-temporal": "4"},
         "memory": {"--tokens": "432000", "--hidden": "4096", "--heads": "32", "--cp": "8"},
         "comm": {"--tokens": "432000", "--cp": "8", "--heads": "32", "--head-dim": "128",
                  "--link": "nvlink4"},
         "plan": {"--model": "wan2.1-t2v-14b", "--gpus": "8"}}


@st.composite
def calculator_argv(draw):
    command = draw(st.sampled_from(sorted(FLAGS)))
    args = dict(VALID[command]) if draw(st.booleans()) else {}
    changes = draw(st.lists(st.sampled_from(sorted(FLAGS[command])), unique=True,
                            max_size=3 if args else 7))
    for flag in changes:
        args[flag] = draw(FLAGS[command][flag])
    # a switch (drawn as None) takes no value
    return [command, *(x for kv in args.items() for x in kv if x is not None), "--json"]


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(argv=calculator_argv())
def test_calculators_succeed_with_strict_json_or_fail_in_one_line(argv):
    code, out, err, seconds = _call(argv)
    event(f"{argv[0]} exit {code}")  # --hypothesis-show-statistics: both outcomes are reached
    _check(argv, code, out, err, seconds)


@settings(max_examples=max(60, EXAMPLES // 3), derandomize=True, deadline=None)
@given(command=st.sampled_from(sorted(LAUNCHING)), data=st.data())
def test_launching_commands_refuse_bad_numbers_before_starting(command, data):
    flag = data.draw(st.sampled_from(sorted(LAUNCHING[command])))
    argv = [*command.split(), flag, data.draw(st.sampled_from(LAUNCHING[command][flag])), "--json"]
    def no_launch(*args, **kwargs):
        raise AssertionError(f"{argv}: started processes before refusing")

    # launch() validates its own arguments first (a refusal there is fine); spawning is not
    with mock.patch("cpcourse.launch.launcher.subprocess.Popen", no_launch):
        code, out, err, seconds = _call(argv)
    assert code == 2, f"{argv}: exit {code} (it should refuse before launching)\n{out}{err}"
    _check(argv, code, out, err, seconds)
