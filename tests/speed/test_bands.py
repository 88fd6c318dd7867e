"""The speed error band plan prints: measured on the published throughputs, per scale of run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from trainfit.hardware.gpus import find_gpu
from trainfit.job import JobSpec
from trainfit.plan.grid import plan
from trainfit.render.words import SPEED_TRUSTED, plan_notes, speed_note
from trainfit.speed.bands import SpeedBand, speed_band_for

ROOT = Path(__file__).resolve().parents[2]


def test_band_by_scale_and_compile():
    assert speed_band_for(1, False).kind == "single"
    assert speed_band_for(2, False).kind == "few" and speed_band_for(7, False).kind == "few"
    assert speed_band_for(8, False).kind == "many" and speed_band_for(512, False).kind == "many"
    assert speed_band_for(8, True).kind == "compiled"
    for b in (speed_band_for(r, c) for r in (1, 2, 8) for c in (False, True)):
        assert b.cases > 0 and 0 <= b.median_abs_error <= b.p90_abs_error


def test_bands_file_is_what_the_committed_benchmark_results_say():
    """src/trainfit/speed/bands.json cannot drift from benchmarks/results/speed_published.json:
    it is recomputed here from the committed per-case results."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import speed_bands
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    rows = json.loads((ROOT / "benchmarks/results/speed_published.json").read_text())["results"]
    shipped = json.loads((ROOT / "src/trainfit/speed/bands.json").read_text())["bands"]
    assert shipped == json.loads(json.dumps(speed_bands.bands(rows)))
    # the headline the README states: ≥ 8 GPUs inside the target, one GPU not yet
    assert shipped["many"]["median_abs_error"] <= SPEED_TRUSTED
    assert shipped["many"]["cases"] >= 150 and shipped["single"]["cases"] >= 20


def test_note_says_when_the_ranking_is_only_a_guide():
    wide = SpeedBand("single", 26, 0.28, 0.6, 0.28)
    narrow = SpeedBand("many", 196, 0.06, 0.13, -0.03)
    assert "28%" in speed_note(wide) and "faster than measured" in speed_note(wide)
    assert "trainfit tune" in speed_note(wide)
    assert "trainfit tune" not in speed_note(narrow) and "slower than measured" in speed_note(narrow)


def test_plan_on_a_named_gpu_states_its_speed_band(tiny_llama):
    # one (precision, checkpointing) group: the band is the plan's, not a row's
    job = JobSpec(model="t", seq_len=64, effective_batch=4, precision="bf16-true", grad_ckpt="off")
    res = plan(job, tiny_llama, find_gpu("a10g"), verify=False, ladder=False)
    assert res.speed_band == speed_band_for(1, False)
    assert res.to_dict()["speed_band"]["kind"] == "single"
    assert any(n.startswith("tokens/s are predictions") for n in plan_notes(res))
    no_gpu = plan(job, tiny_llama, None, verify=False, ladder=False)
    assert no_gpu.speed_band is None
    assert not any(n.startswith("tokens/s") for n in plan_notes(no_gpu))
    # rows whose speed is unknown (activation offload's copies are not timed): no accuracy note
    # about tokens/s nobody was shown
    off = plan(job.replace(activation_offload=True), tiny_llama, find_gpu("a10g"), verify=False,
               ladder=False)
    assert off.speed_band is not None and not any(r.speed.tokens_per_s for r in off.rows)
    assert not any(n.startswith("tokens/s are predictions") for n in plan_notes(off))


def test_launch_bound_rows_are_said_to_be_an_upper_bound(tiny_llama):
    """A tiny model at 64 positions: every row is the CPU enqueueing ops (predicted), whose
    Python the model does not count — plan says so and sends the user to tune."""
    res = plan(JobSpec(model="t", seq_len=64, effective_batch=4, precision="amp-bf16",
                       grad_ckpt="off"), tiny_llama, find_gpu("h100"), verify=False, ladder=False)
    bounds = [r.speed.bound for r in res.rows if r.speed is not None]
    assert bounds and all(b == "launch-bound" for b in bounds)
    note = next(n for n in plan_notes(res) if "launch-bound" in n)
    assert note.startswith(f"{len(bounds)} of {len(res.rows)} rows are launch-bound")
    assert "upper bound" in note and "trainfit tune" in note


def test_plan_says_which_link_it_timed_the_sync_over(tiny_llama):
    """Ranks > 1: the gradient synchronisation is timed over the catalog's theoretical slot
    bandwidth unless the link is given or measured — plan names it and says which."""
    import dataclasses

    job = JobSpec(model="t", seq_len=64, effective_batch=8, precision="bf16-true",
                  grad_ckpt="off", ranks=2)
    gpu = find_gpu("a10g")
    res = plan(job, tiny_llama, gpu, verify=False, ladder=False)
    assert (res.link, res.link_gbs) == (gpu.interconnect, gpu.interconnect_gbs)
    note = next(n for n in plan_notes(res) if n.startswith("gradient sync timed"))
    assert "pcie4x16 (the GPU catalog's) at 31.5 GB/s" in note and "theoretical" in note
    assert "trainfit tune" in note
    pick = res.pick.speed
    assert pick.sync_s is not None and f"{pick.sync_s:.3g} s of communication" in note
    # a measured bus bandwidth given to --interconnect is said as given (cli/main.py's form)
    given = dataclasses.replace(gpu, interconnect="2.7 GB/s measured (given)",
                                interconnect_gbs=3.0)
    note = next(n for n in plan_notes(plan(job, tiny_llama, given, verify=False, ladder=False))
                if n.startswith("gradient sync timed"))
    assert "given: 2.7 GB/s measured" in note and "theoretical" not in note
    # a link given by name is still the slot's theoretical figure
    named = dataclasses.replace(gpu, interconnect="pcie4 (given)")
    note = next(n for n in plan_notes(plan(job, tiny_llama, named, verify=False, ladder=False))
                if n.startswith("gradient sync timed"))
    assert "pcie4 (named)" in note and "theoretical" in note
    one = plan(job.replace(ranks=1), tiny_llama, gpu, verify=False, ladder=False)
    assert one.link is None and not any(n.startswith("gradient sync") for n in plan_notes(one))
    # GeForce: no peer-to-peer, the sync is not timed (the rows say why their speed is unknown)
    geforce = plan(job, tiny_llama, find_gpu("rtx-4090"), verify=False, ladder=False)
    assert geforce.link is None and not any(n.startswith("gradient sync")
                                            for n in plan_notes(geforce))
    # an offload plan times nothing (its speed is unknown): no link is said to have timed it
    off = plan(job.replace(sharding="fsdp", offload="all"), tiny_llama, gpu, verify=False,
               ladder=False)
    assert off.link is not None and not any(r.speed and r.speed.tokens_per_s for r in off.rows)
    assert not any(n.startswith("gradient sync") for n in plan_notes(off))
