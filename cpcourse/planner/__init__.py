"""The planner: tokens, GPUs and links, costs, deployment cost, fixed costs, pipeline memory, the
plan and its validation against published runs (notebooks 00, 05, 10). Arithmetic on sourced
numbers."""
