"""The verdicts of ``report.py`` on made-up runs (CI runs this with the perf smoke test,
once pyperf is installed): a speed-up target passes only when its whole interval clears it."""

from __future__ import annotations

import random
import statistics

import pytest
import report


def runs(
    center: float, spread: float, processes: int = 10, seed: int = 1
) -> list[tuple[float, ...]]:
    """``processes`` worker processes of two values each, every process offset by up to
    ``spread`` (relative), as memory layout offsets a whole process."""
    rng = random.Random(seed)
    out = []
    for _ in range(processes):
        base = center * (1 + rng.uniform(-spread, spread))
        out.append((base, base * 1.001))
    return out


def verdict(fast: list[tuple[float, ...]], slow: list[tuple[float, ...]]) -> report.Row:
    samples: report.Samples = {"commit_typical": {"pure": fast, "spec": slow}}
    medians: report.Medians = {
        case: {impl: statistics.median(v for run in r for v in run) for impl, r in by.items()}
        for case, by in samples.items()
    }
    return pure_vs_spec(report.targets(medians, samples))


def pure_vs_spec(rows: list[report.Row]) -> report.Row:
    return next(r for r in rows if r.target.startswith("pure vs spec, `commit_typical`"))


def test_a_clear_margin_passes() -> None:
    row = verdict(runs(2.0e-6, 0.02), runs(2.6e-6, 0.02, seed=2))
    assert row.status == "PASS"


def test_a_ratio_at_the_target_within_the_spread_is_not_a_pass() -> None:
    row = verdict(runs(2.5e-6, 0.08), runs(2.5e-6, 0.08, seed=2))
    assert row.status == "WITHIN NOISE"
    low, high = report.interval(
        {"c": {"pure": runs(2.5e-6, 0.08), "spec": runs(2.5e-6, 0.08, seed=2)}}, "c", "pure", "spec"
    ) or (0.0, 0.0)
    assert low < 1.0 < high


def test_a_clear_shortfall_fails() -> None:
    row = verdict(runs(3.0e-6, 0.02), runs(2.0e-6, 0.02, seed=2))
    assert row.status == "FAIL"


def test_the_interval_is_reproducible_and_holds_the_ratio() -> None:
    samples: report.Samples = {"c": {"a": runs(1.0, 0.05), "b": runs(1.5, 0.05, seed=3)}}
    first = report.interval(samples, "c", "a", "b")
    assert first == report.interval(samples, "c", "a", "b")
    assert first is not None and first[0] < 1.5 < first[1]


def test_one_process_gives_the_ratio_itself() -> None:
    samples: report.Samples = {"c": {"a": [(1.0,)], "b": [(2.0,)]}}
    assert report.interval(samples, "c", "a", "b") == (2.0, 2.0)
    medians: report.Medians = {"commit_typical": {"pure": 1.0, "spec": 2.0}}
    row = pure_vs_spec(
        report.targets(medians, {"commit_typical": {"pure": [(1.0,)], "spec": [(2.0,)]}})
    )
    assert (row.measured, row.status) == ("2.00×", "PASS")


@pytest.mark.parametrize("missing", ["pure", "spec"])
def test_a_missing_implementation_is_missing(missing: str) -> None:
    medians: report.Medians = {"commit_typical": {"pure": 1.0, "spec": 2.0}}
    del medians["commit_typical"][missing]
    row = pure_vs_spec(report.targets(medians, {}))
    assert row.status == "MISSING"
