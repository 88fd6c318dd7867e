"""A probe fed or compiled otherwise than tune's pick is its own report row (report/variants.py)."""

from __future__ import annotations

import json

from report_paths import FIXTURES

from trainfit.report import build_report, load_inputs
from trainfit.report.variants import VARIANT_KEYS, variant, variant_words


def test_words_name_only_what_both_state_and_differ():
    ref = variant({"prefetch_factor": 2}, compile=False, num_workers=4, pin_memory=True)
    assert variant_words(variant({}, compile=True, num_workers=0, pin_memory=True), ref) == \
        "compile on, num_workers 0"
    assert variant_words(variant({"prefetch_factor": 4}, num_workers=4), ref) == "prefetch_factor 4"
    assert variant_words(variant({}), ref) == ""  # states nothing: the reference's row
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
    assert pick.speed_up_measured == 34_500 / 14_800
