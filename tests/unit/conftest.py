"""Unit tests: hypothesis without wall-clock deadlines (shared, noisy 2-core machines)."""

from hypothesis import HealthCheck, settings

settings.register_profile("cpcourse", deadline=None, max_examples=60,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("cpcourse")
