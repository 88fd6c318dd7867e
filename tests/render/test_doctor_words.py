"""doctor's terminal words: each measured figure with its unit."""

from trainfit.doctor.observation import Finding
from trainfit.render.doctor import evidence_text


def test_a_peak_rate_in_the_evidence_says_its_unit():
    """An audit: "peak_flops 94,307,725,595" carried no unit."""
    f = Finding(bottleneck="compute-bound", detail="", fix="", gain_fraction=None,
                evidence={"step_time_s": 2.5, "mfu": 0.024, "peak_flop_per_s": 94307725595.0})
    assert evidence_text(f) == "step_time_s 2.500 s, mfu 2.4%, peak_flop_per_s 94.3 GFLOP/s"
