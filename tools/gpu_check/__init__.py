"""The prepared GPU check, a one-off measurement kept beside the course, not inside the package.

    python -m tools.gpu_check --dry-run --json   # from the repository root (make gpu DRY=1)

`check` runs the parts and writes one JSON file (its docstring lists them); `attention`,
`kernels`, `models`, `pipeline`, `serial` and `second` are the parts. `cpcourse bench gpu`
runs this from the checkout the installed cpcourse sits in.
"""
