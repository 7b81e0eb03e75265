"""Graded tests: hypothesis without deadlines (a learner's first version may be slow).

    python -m pytest tests/graded --impl solutions

Options `--impl`, `--expect-stubs`, `--ex` and the `impl` fixture live in tests/conftest.py.
"""

from hypothesis import HealthCheck, settings

settings.register_profile("cpcourse-graded", deadline=None, max_examples=50,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("cpcourse-graded")
