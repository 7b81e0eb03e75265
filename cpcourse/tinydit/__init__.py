"""The course's tiny video model (notebooks 07, 11): the DiT, rotary positions, the moving-shapes
data and tracker, training, sampling, its tensor parallelism and cost ledger, long-video windows."""
