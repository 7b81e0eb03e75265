"""What grading returns: one test's outcome, one exercise's grade (`check` and `cpcourse grade`).

    cpcourse grade --impl solutions --json      # one `ExerciseResult.as_dict()` per exercise

`cpcourse.course.grading` runs the tests and builds these; `cpcourse.course.panels` shows them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cpcourse.course.stubs import Exercise


@dataclass
class TestOutcome:
    nodeid: str
    exercise: str
    outcome: str = "not run"    # passed, failed, error, skipped, not run
    message: str = ""           # the failure, as the learner should read it
    not_implemented: str | None = None   # the exercise id of the stub it ran into, if any
    seconds: float = 0.0

    @property
    def name(self) -> str:
        return self.nodeid.split("::", 1)[-1]


@dataclass
class ExerciseResult:
    """One exercise's grade. `passed` is True only when every one of its tests passed."""

    exercise: Exercise
    impl: str
    status: str                  # passed, failed, not implemented, timed out, no tests, error
    tests: list[TestOutcome] = field(default_factory=list)
    detail: str = ""             # for timed out / error: what happened
    seconds: float = 0.0
    hints_used: int = 0          # highest hint level seen (`cpcourse.hint`)
    untouched: bool = False      # the function is still the generated stub: no test was run
    recorded_at: float | None = None  # passed earlier with this same code: answered from the record

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def failures(self) -> list[TestOutcome]:
        return [t for t in self.tests if t.outcome in ("failed", "error")]

    @property
    def first_failure(self) -> str:
        if self.detail:
            return self.detail
        if self.untouched:
            return "the stub is untouched (its raise is still there): tests not run"
        first = next(iter(self.failures), None)
        return f"{first.name}: {first.message}" if first else ""

    def as_dict(self) -> dict:
        ex = self.exercise
        return {"id": ex.id, "title": ex.title, "module": ex.module, "function": ex.function,
                "status": self.status, "passed": self.passed,
                "tests": len(self.tests), "tests_passed": sum(t.outcome == "passed"
                                                              for t in self.tests),
                "first_failure": self.first_failure, "seconds": round(self.seconds, 3),
                "hints_used": self.hints_used, "hint_levels": len(ex.hints),
                "recorded": self.recorded_at is not None}

    def __repr__(self) -> str:
        return f"<check {self.exercise.id}: {self.status}>"
