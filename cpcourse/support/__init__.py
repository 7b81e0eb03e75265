"""What every other module stands on: errors a caller can act on, and counting the bytes sent.

    python -c "from cpcourse.planner.tokens import video_tokens; video_tokens(-1, 1280, 81)"

`errors`: `InputError` (a one-line message that says what to change; the command line prints it
and exits 2), the checks that raise it, and the argument parser every command shares.
`bytecount`: the bytes each rank sends, measured at the torch.distributed calls themselves.
`agreement`: how a ring learns every rank's K/V length (and remembers it; the ring, tiling and
the tiny DiT's costs use it); `out_files`: output
files checked writable before the work and written through a temporary file after it.
This package imports nothing else from cpcourse, so any module may import it.
"""
