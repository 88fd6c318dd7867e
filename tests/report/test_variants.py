"""A probe fed or compiled otherwise than tune's pick is its own report row (report/variants.py)."""

from __future__ import annotations

import json

import pytest
from report_paths import FIXTURES

from trainfit.report import build_report, load_inputs
from trainfit.report.variants import VARIANT_KEYS, variant, variant_words


def test_words_name_only_what_both_state_and_differ():
    ref = variant({"prefetch_factor": 2}, compile=False, num_workers=4, pin_memory=True)
    assert variant_words(variant({}, compile=True, num_workers=0, pin_memory=True), ref) == \
        "compile on, num_workers 0"
    assert variant_words(variant({"prefetch_factor": 4}, num_workers=4), ref) == "prefetch_factor 4"
    assert variant_words(variant({}), ref) == ""  # states nothing: the reference's row
    # no workers: the prefetch depth does nothing, and is no difference
    assert variant_words(variant({"prefetch_factor": 4}, num_workers=0), ref) == "num_workers 0"
    assert "persistent_workers" not in VARIANT_KEYS  # set on the pick by rule, never measured


def test_the_baseline_row_is_its_own_probes_not_the_picks_loader(tmp_path):
    """The user's current configuration ran 0 loader workers at 1 × 32 (14,800 tokens/s); tune
    also timed 1 × 32 with the pick's 4 workers (20,000): two rows, and the speed-up reference is
    the baseline's own row."""
    tune = json.loads((FIXTURES / "tune.json").read_text())
    tune["probes"][0]["stage"] = "baseline"
    fed = {**tune["probes"][0], "index": 6, "stage": "knobs", "num_workers": 4,
           "measured": {**tune["probes"][0]["measured"], "tokens_per_s": 20_000.0}}
    tune["probes"].append(fed)
    f = tmp_path / "tune.json"
    f.write_text(json.dumps(tune))
    (s,) = build_report(load_inputs([str(f)])).sections
    ones = {r.setting: r.tokens_per_s_measured for r in s.table.rows if r.micro_batch == 1}
    assert ones == {"amp-bf16, checkpointing off": 20_000.0,
                    "amp-bf16, checkpointing off, num_workers 0": 14_800.0}
    assert "14,800 tokens/s measured" in s.table.reference  # not the 4 workers' 20,000
    pick = next(r for r in s.table.rows if r.pick == "tune")
    assert pick.speed_up_measured == pytest.approx(34_500 / 14_800)


def _with_plan(tmp_path, tune):
    f = tmp_path / "tune.json"
    f.write_text(json.dumps(tune))
    return build_report(load_inputs([str(FIXTURES / "plan_seed002.json"), str(f)]))


def test_a_baseline_fed_otherwise_keeps_the_plans_prediction_of_its_step(tmp_path):
    """The user's 16 × 2 with 0 loader workers, tune's pick the same step with 4: the baseline's
    row is its own (0 workers), and the plan's prediction of the step is on it — every predicted
    speed-up was lost when it was not (a review)."""
    tune = json.loads((FIXTURES / "tune.json").read_text())
    tune["probes"][2]["stage"] = "baseline"
    tune["baseline"] = {**tune["baseline"], "micro_batch": 16, "grad_accum": 2}
    (s,) = _with_plan(tmp_path, tune).sections
    base = next(r for r in s.table.rows if r.setting.endswith("num_workers 0")
                and r.micro_batch == 16)
    main = next(r for r in s.table.rows if r.pick == "plan + tune" or r.pick == "tune")
    assert base.tokens_per_s_predicted == main.tokens_per_s_predicted is not None
    assert base.speed_up_predicted == pytest.approx(1.0) and base.speed_up_measured == 1.0
    assert all(r.speed_up_predicted is not None for r in s.table.rows
               if r.tokens_per_s_predicted is not None)
    assert "33,000 tokens/s measured" in s.table.reference


def test_the_baseline_row_is_in_the_baselines_setting_not_the_picks(tmp_path):
    """The pick changed checkpointing: the baseline (checkpointing off, 1 × 32) was looked up in
    the pick's setting, and its own row read 1.06× against itself (a review)."""
    tune = json.loads((FIXTURES / "tune.json").read_text())
    tune["probes"][0]["stage"] = "baseline"
    tune["pick"] = {**tune["pick"], "grad_ckpt": "full"}
    (s,) = _with_plan(tmp_path, tune).sections
    (base,) = [r for r in s.table.rows if r.setting == "amp-bf16, checkpointing off"
               and r.micro_batch == 1]
    assert base.speed_up_measured == 1.0 and base.speed_up_predicted == pytest.approx(1.0)
