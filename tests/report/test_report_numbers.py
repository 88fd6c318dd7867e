"""Numbers as the report writes them, and the ranges it reads them in."""

from __future__ import annotations

import pytest

from trainfit.report.json_fields import JsonObj
from trainfit.report.load import ReportInputError
from trainfit.report.tables import fmt_pct, fmt_sig


def test_small_measured_times_and_shares_keep_their_digits():
    """An audit: a 40 µs data wait read "0.0000" s beside its 4 % share, doctor's 0.05 %
    overhead "0.0 %"."""
    assert fmt_sig(4.0e-5) == "0.0000400"
    assert fmt_sig(0.000919) == "0.000919"
    assert fmt_sig(12.345) == "12.3" and fmt_sig(0.0) == "0" and fmt_sig(None) == "unknown"
    assert fmt_pct(0.00048) == "0.048" and fmt_pct(0.5) == "50.0" and fmt_pct(0.0) == "0.0"


@pytest.mark.parametrize("key, value", [("data_wait_fraction", 1.7), ("mfu", 1.2),
                                        ("peak_device_bytes", -5), ("step_time_s", -1.0)])
def test_values_no_command_writes_are_refused(key, value):
    with pytest.raises(ReportInputError, match="is outside"):
        JsonObj("x.json", "", {key: value}, "hint").num(key)
    JsonObj("x.json", "", {"headroom_bytes": -5, "predicted_gain_fraction": 4.8},
            "hint").num("headroom_bytes")  # may be negative / above 1: not refused


def test_a_plan_without_a_gpu_and_a_cpu_tune_are_shown_apart(tmp_path):
    """An audit: a plan with no --gpu paired with a CPU tune — its CUDA device peak (1.09 GiB)
    beside the CPU's live tensor bytes (1.00 GiB) in one column, a 9 % over-prediction that
    compared two different quantities."""
    import json

    from report_paths import FIXTURES, SEED002

    from trainfit.report.build import build_report
    from trainfit.report.load import load_inputs

    plan = json.loads(SEED002.read_text())
    plan["gpu"], plan["gpu_memory_bytes"] = None, None
    tune = json.loads((FIXTURES / "tune.json").read_text())
    tune["device"], tune["device_name"] = "cpu", "CPU (2 cores), live tensor bytes"
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "tune.json").write_text(json.dumps(tune))
    r = build_report(load_inputs([str(tmp_path / "plan.json"), str(tmp_path / "tune.json")]))
    assert len(r.sections) == 2
    assert any("predicts a GPU step, no card named: shown apart" in w for w in r.warnings)
    # its device peak is unknown, said as the plan says it (an audit: the footnote read
    # "reserved + CUDA context" for it; this older plan file still holds the reserve there)
    from trainfit.report.tables import seed_text

    planned = seed_text(r.sections[0].table)
    assert any("the plan named no GPU: its predicted device peak is unknown" in n
               for n in planned.notes)
    assert not any("named no GPU" in n for n in seed_text(r.sections[1].table).notes)


def test_a_plan_without_a_gpu_keeps_its_predicted_reserve_on_the_page(tmp_path):
    """An audit: with no GPU named the report's pick and micro-batch tables said only "peak
    device, predicted: unknown" — no predicted memory anywhere — and the memory chart's caption
    called its bars the device peak. The predicted reserve is shown beside, said as such."""
    import json

    from report_paths import SEED002

    from trainfit.report.build import build_report
    from trainfit.report.figures import render_figures
    from trainfit.report.load import load_inputs
    from trainfit.report.tables import picks_text, seed_text

    plan = json.loads(SEED002.read_text())
    plan["gpu"], plan["gpu_memory_bytes"] = None, None
    for c in plan["configs"]:
        c["peak_device_bytes"] = c["peak_device_upper_bytes"] = c["fits"] = None
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (sec,) = build_report(load_inputs([str(tmp_path / "plan.json")])).sections
    table = seed_text(sec.table)
    assert table.group_of()[5] == "peak reserved (GiB)" and table.columns[5] == "predicted"
    want = {f"{c['peak_reserved_bytes'] / 2**30:.2f}" for c in plan["configs"]}
    assert all(row[3] == "unknown" for row in table.rows)
    assert {row[5] for row in table.rows} <= want and len({row[5] for row in table.rows}) > 3
    picks = picks_text(sec.picks)
    assert "peak reserved (GiB)" in picks.group_of() and picks.rows[0][5] != "unknown"
    (mem,) = [f for f in render_figures(build_report(load_inputs([str(tmp_path / "plan.json")])))
              if f.name.endswith("-memory")]
    assert "predicted reserved peak split into its parts" in mem.caption


def test_a_change_tune_could_not_decide_is_marked_not_read_as_faster(tmp_path):
    """An audit: the micro-batch table showed the undecided eager variant at 1.66× beside the
    pick's 1.63×, unmarked — read as the better choice. Its row now says so."""
    import dataclasses
    import json

    from report_paths import FIXTURES

    from trainfit.job import JobSpec
    from trainfit.report.build import build_report
    from trainfit.report.load import load_inputs
    from trainfit.report.tables import seed_text

    tune = json.loads((FIXTURES / "tune.json").read_text())
    fields = {f.name for f in dataclasses.fields(JobSpec)}
    pick = tune["pick"]
    one_off = [(p, [k for k in fields if k in pick and k in p and p[k] != pick[k]])
               for p in tune["probes"]]
    probe, (key,) = next((p, d) for p, d in one_off if len(d) == 1)
    tune["search_notes"] = [{"kind": "undecided", "changes": [[key, probe[key]]],
                             "ratios": [1.1, 0.9], "noise": 0.2, "rounds": 4}]
    (tmp_path / "t.json").write_text(json.dumps(tune))
    table = seed_text(build_report(load_inputs([str(tmp_path / "t.json")])).sections[0].table)
    marked = [r for r in table.rows if r[-1] == "undecided (tune)"]
    assert len(marked) == 1 and any("could not decide" in n for n in table.notes)
    assert str(probe["micro_batch"]) == marked[0][1]
    # without the note no row is marked
    plain = seed_text(build_report(load_inputs([str(FIXTURES / "tune.json")])).sections[0].table)
    assert not any(r[-1] == "undecided (tune)" for r in plain.rows)


def test_undecided_micro_batch_changes_are_marked_and_bad_notes_refused(tmp_path):
    """A review: a micro-batch change never matched (the accumulation follows it, so the probe
    differs from the pick in two fields); a note naming its probe marks that probe; a note with
    malformed changes raised a traceback, not an error naming the file's field."""
    import json

    import pytest
    from report_paths import FIXTURES

    from trainfit.report.build import build_report
    from trainfit.report.json_fields import ReportInputError
    from trainfit.report.load import load_inputs
    from trainfit.report.tables import seed_text

    tune = json.loads((FIXTURES / "tune.json").read_text())

    def marked(notes: list[dict]) -> list[str]:
        tune["search_notes"] = notes
        (tmp_path / "t.json").write_text(json.dumps(tune))
        table = seed_text(build_report(load_inputs([str(tmp_path / "t.json")])).sections[0].table)
        return [r[1] for r in table.rows if r[-1] == "undecided (tune)"]

    # the pick is 16 × 2 with 4 workers; probe 1 is 4 × 8 (with 4 workers here: an older file,
    # no probe index, is matched as the pick with the change made)
    tune["probes"][1]["num_workers"] = tune["pick"]["num_workers"]
    assert marked([{"kind": "undecided", "changes": [["micro_batch", 4]]}]) == ["4"]
    # named by its probe: that row alone, whatever the changes say
    assert marked([{"kind": "not_compared", "changes": [["micro_batch", 99]], "probe": 0}]) == ["1"]
    # a note of a probe that is the pick's configuration marks nothing (the pick is decided)
    assert marked([{"kind": "undecided", "changes": [["micro_batch", 16]], "probe": 4}]) == []
    # an older file: a probe of another effective batch is not the micro-batch change
    tune["probes"][1]["grad_accum"] = 4
    assert marked([{"kind": "undecided", "changes": [["micro_batch", 4]]}]) == []
    tune["probes"][1]["grad_accum"] = 8
    for bad in ([["micro_batch"]], [[["x"], 1]], "micro_batch", [{"micro_batch": 4}]):
        with pytest.raises(ReportInputError, match=r"search_notes\[0\]\.changes"):
            marked([{"kind": "undecided", "changes": bad}])


def test_the_searchs_unconfirmed_best_is_marked_and_the_pick_reads_as_tune_said(tmp_path):
    """An audit: the search's best that the rounds against the current configuration did not
    confirm (tune kept the current one) read as a measured 1.80× speed-up, unmarked; and the
    pick's tokens/s was the mean of its two middle probes (2,668) where tune said 2,431, the
    lower one."""
    import json

    from report_paths import FIXTURES

    from trainfit.report.build import build_report
    from trainfit.report.load import load_inputs
    from trainfit.report.tables import seed_text

    tune = json.loads((FIXTURES / "tune.json").read_text())
    tune["search_notes"] = []
    tune["unconfirmed"] = dict(tune["probes"][1])  # 4 × 8: its row alone is marked
    # the pick (probe 4, 34,500 tokens/s) re-measured in a round at 30,000
    again = json.loads(json.dumps(tune["probes"][4]))
    again.update(index=6, stage="confirm")
    again["measured"]["tokens_per_s"] = 30000.0
    tune["probes"].append(again)
    (tmp_path / "t.json").write_text(json.dumps(tune))
    section = build_report(load_inputs([str(tmp_path / "t.json")])).sections[0]
    table = seed_text(section.table)
    assert [r[1] for r in table.rows if r[-1] == "undecided (tune)"] == ["4"]
    assert any("did not confirm it against the current configuration" in n for n in table.notes)
    # the pick's row states tune's own figure (the mean of its two probes read 32,250)
    row = next(r for r in section.table.rows if r.pick)
    assert row.tokens_per_s_measured == tune["pick"]["measured"]["tokens_per_s"] != 32250.0
    # another row of several probes: the lower middle, as tune takes a pick's
    tune["pick"]["measured"] = None
    (tmp_path / "t.json").write_text(json.dumps(tune))
    section = build_report(load_inputs([str(tmp_path / "t.json")])).sections[0]
    row = next(r for r in section.table.rows if r.pick)
    assert row.tokens_per_s_measured == 30000.0


def test_a_cpu_tunes_tables_head_their_memory_as_live_tensors(tmp_path):
    """An audit: "peak device (GiB)" headed a CPU tune's live tensor bytes (a footnote alone
    said what they were)."""
    import json

    from report_paths import FIXTURES

    from trainfit.report.output import make_report

    tune = json.loads((FIXTURES / "tune.json").read_text())
    tune["device"], tune["device_name"] = "cpu", "CPU (2 cores), live tensor bytes"
    (tmp_path / "t.json").write_text(json.dumps(tune))
    make_report([str(tmp_path / "t.json")], tmp_path / "r.html", markdown=True)
    md = (tmp_path / "r.md").read_text()
    assert "peak live tensors (GiB; CPU)" in md and "peak device (GiB)" not in md
