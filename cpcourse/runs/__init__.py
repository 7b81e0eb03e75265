"""Runners: what runs one experiment on P ranks and reports it.

    cpcourse generate --nproc 2 --compare --json

Each runner checks a request (what to run), launches its rank function on P processes
(`cpcourse.launch`), compares with one process when asked, and returns a report: `generate`
samples the tiny video model (`cpcourse generate`), `long_video` samples a video longer than its
window (`cpcourse generate --window`), `models` runs a real diffusers transformer under CP
(`cpcourse models`), `approx`, `stream` and `comm_generate` the other modes of `generate`, `demo`
the ring (`cpcourse demo`). Each request is a frozen `...Request` whose fields are the command's
flags (`cpcourse.support.request.flag`); the rank function reads its fields. The command line
and the notebooks call them; `cpcourse.bench` measures with them and only measures.
"""
