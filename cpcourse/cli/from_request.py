"""A subcommand's flags built from its experiment's Request (`cpcourse.support.request_flags`).

    cpcourse vae --help    # every flag comes from `cpcourse.runs.vae.VaeRequest`

The builder lives in `cpcourse.support.request_flags`, where the benchmarks can use it too; the
subcommands import it from here or from there.
"""

from __future__ import annotations

from cpcourse.support.request_flags import (
    add_request_flags,
    build_parser,
    flag_name,
    mode_table,
    options,
    options_of,
    request_conditions,
    request_from_args,
    request_values,
)

__all__ = ["add_request_flags", "build_parser", "flag_name", "mode_table", "options",
           "options_of", "request_conditions", "request_from_args", "request_values"]
