"""bench/harness.py's target table: a ratio is read only within one sitting."""

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _harness():
    spec = importlib.util.spec_from_file_location("bench_harness", ROOT / "bench" / "harness.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(lines, ours):
    return next(line for line in lines if f"| {ours:,.0f} |" in line)


def test_a_target_whose_sides_come_from_different_sittings_is_flagged():
    harness = _harness()
    label, ours, ref, need = next(t for t in harness.TARGETS if t[2] == "raw_insert_unnest")
    same = {ours: {"rate_median": 90_000, "measured_at": "2026-12-01T12:30:00+00:00", "sitting": "a-1"},
            ref: {"rate_median": 120_000, "measured_at": "2026-12-01T12:31:00+00:00", "sitting": "a-1"}}
    assert "sittings" not in _row(harness.render_targets(same), 90_000)
    # Minutes apart, but another sitting (another run_all, maybe another machine).
    other = {ours: dict(same[ours], sitting="b-2"), ref: same[ref]}
    assert "(sides from different sittings)" in _row(harness.render_targets(other), 90_000)
    # One side from before sittings were recorded: not comparable either.
    older = {ours: {k: v for k, v in same[ours].items() if k != "sitting"}, ref: same[ref]}
    assert "(sides from different sittings)" in _row(harness.render_targets(older), 90_000)
    # The invocation's own id names the boot and the start time.
    assert re.search(r".-20\d{6}T\d{6}$", harness.SITTING)


def test_an_interleaved_sitting_runs_one_of_each_per_round_and_summarises_as_runs(monkeypatch):
    """run_all.py --interleave: round r runs every benchmark once, so a host whose speed
    drifts during the sitting weighs on each alike; the summaries are those of --runs."""
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("bench_run_all", ROOT / "bench" / "run_all.py")
        run_all = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(run_all)
    finally:
        sys.path.remove(str(ROOT / "bench"))
    calls = []

    def run_once(key, fn, i, runs, **kw):
        calls.append((key, i, run_all.harness.STARTUP))
        return {"rate": 100.0 * (len(calls)), "unit": "jobs/s", "n": 10}

    monkeypatch.setattr(run_all.harness, "run_once", run_once)
    jobs = [("a@outside", "gd_drain_c1_p2_pf500", "outside"), ("b", "gd_insert_all_100k", "inside")]
    summaries, failed = run_all._interleaved(jobs, 3, "label", save=False)
    assert calls == [("a@outside", 0, "outside"), ("b", 0, "inside"), ("a@outside", 1, "outside"),
                     ("b", 1, "inside"), ("a@outside", 2, "outside"), ("b", 2, "inside")]
    assert failed == [] and [s["name"] for s in summaries] == ["a@outside", "b"]
    assert [s["rate_median"] for s in summaries] == [300.0, 400.0] and summaries[0]["runs"] == 3


def test_the_drain_clock_looks_finely_near_the_end():
    """bench/harness.py's poll schedule: coarse (50 ms) while the end is far, fine (10 ms)
    once 90 % is done or the recent rate puts the rest within 1.5 coarse intervals — so
    the clock stops within about 10 ms of the last completion instead of up to 50 ms."""
    nxt = _harness().next_poll
    coarse, fine = 0.05, 0.01
    # Far from the end: 1,000 done in the last 50 ms, 10,000 to go.
    assert nxt(5_000, 15_000, (0.0, 4_000), 0.05, coarse, fine, 0.9) == coarse
    # 90 % done: fine, whatever the rate.
    assert nxt(9_000, 10_000, (0.0, 9_000), 0.05, coarse, fine, 0.9) == fine
    # 75 % done; at 1,000 per 50 ms the last 2,000 are 100 ms away: coarse still.
    assert nxt(6_000, 8_000, (0.0, 5_000), 0.05, coarse, fine, 0.9) == coarse
    # ... and the last 1,000 within 50 ms: fine (completions that come in bursts, as an
    # inline chain's do, are not jumped over by one coarse sleep).
    assert nxt(7_000, 8_000, (0.0, 6_000), 0.05, coarse, fine, 0.9) == fine
    # Nothing done since the last look: no rate to go by.
    assert nxt(100, 8_000, (0.0, 100), 0.05, coarse, fine, 0.9) == coarse


def test_a_quarter_is_read_against_the_hosts_speed_in_it():
    """harness.speed_factors: the median probe time in each window over the first's."""
    factors = _harness().speed_factors
    samples = [(1.0, 0.010), (1.5, 0.012), (2.0, 0.011),   # first window: median 0.011
               (3.0, 0.022), (3.5, 0.021), (4.0, 0.023)]   # a host twice as slow
    assert factors(samples, [(0.9, 2.1), (2.9, 4.1)]) == [1.0, 0.022 / 0.011]
    assert factors(samples, [(0.9, 2.1), (5.0, 6.0)]) == [1.0, None]  # no sample: no factor
    assert factors(None, [(0.9, 2.1)]) == [None]
