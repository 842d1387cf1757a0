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


def medians_of(samples: report.Samples) -> report.Medians:
    return {
        case: {impl: statistics.median(v for run in r for v in run) for impl, r in by.items()}
        for case, by in samples.items()
    }


def replay_row(rows: list[report.Row], impl: str) -> report.Row:
    return next(r for r in rows if r.target.startswith(f"{impl}, `commit_replayed`"))


@pytest.mark.parametrize(
    ("replayed", "status"),
    [(1.5e-6, "PASS"), (2.0e-6, "WITHIN NOISE"), (2.6e-6, "FAIL")],
)
def test_a_replay_is_judged_against_the_typical_commit_of_its_own_store(
    replayed: float, status: str
) -> None:
    """Two cases of one implementation, judged on the interval as two implementations
    of one case are: a replay must not cost more than a normal commit."""
    samples: report.Samples = {
        "commit_typical": {"pure": runs(2.0e-6, 0.04)},
        "commit_replayed": {"pure": runs(replayed, 0.04, seed=5)},
    }
    rows = report.targets(medians_of(samples), samples)
    row = replay_row(rows, "pure")
    assert row.status == status
    medians = medians_of(samples)
    ratio = medians["commit_typical"]["pure"] / medians["commit_replayed"]["pure"]
    assert row.measured.startswith(f"{ratio:.2f}×")
    assert replay_row(rows, "compiled").status == "MISSING"


def test_the_compiled_store_must_be_2_8_times_the_spec_port() -> None:
    samples: report.Samples = {
        "commit_typical": {"compiled": runs(1.0e-6, 0.01), "spec": runs(2.5e-6, 0.01, seed=2)}
    }
    rows = report.targets(medians_of(samples), samples)
    row = next(r for r in rows if r.target.startswith("compiled vs spec, `commit_typical`"))
    assert "2.8×" in row.target
    assert row.status == "FAIL"  # 2.5x cleared the old 2.2x target


@pytest.mark.parametrize(("large", "status"), [(1.2e-6, "PASS"), (1.4e-6, "FAIL")])
def test_claim_ack_per_entry_stays_flat(large: float, status: str) -> None:
    medians: report.Medians = {
        "claim_ack_10k": {"compiled": 1.0e-6},
        "claim_ack_100k": {"compiled": large},
    }
    rows = report.targets(medians, {})
    row = next(r for r in rows if r.target.startswith("compiled, `claim_ack_100k`"))
    assert row.status == status
    missing = next(r for r in rows if r.target.startswith("pure, `claim_ack`"))
    assert missing.status == "MISSING"


def test_the_protocol_cases_are_required_of_the_stores_not_of_the_spec_port() -> None:
    every = [
        "load_hit",
        "save_same_execution",
        "save_same_user_object",
        "commit_minimal",
        "commit_typical",
        "trace_append_full",
        *(f"drain_{order}_{n}k" for order in ("fifo", "reverse", "shuffled") for n in (1, 4)),
        "due_timers_5k",
        "async_commit_typical",
        "demo_orders_50",
    ]
    protocol = ["commit_typical_id_epoch", "commit_replayed", "claim_ack_1k", "claim_ack_4k"]
    medians: report.Medians = {case: {"pure": 1.0, "spec": 1.0} for case in every}
    medians.update({case: {"pure": 1.0} for case in protocol})
    assert report.missing(medians, ("pure", "spec")) == []
    del medians["claim_ack_4k"]
    del medians["commit_replayed"]
    assert report.missing(medians, ("pure", "spec")) == ["pure:commit_replayed", "pure:claim_ack_*"]
    assert report.missing(medians, ("spec",)) == []
