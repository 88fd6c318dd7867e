"""The probes table judges a CPU probe by the bytes its pick was judged by."""

from trainfit.report.inputs import Measured, Predicted, Probe
from trainfit.report.tables import probes_text

GIB = 2**30


def test_a_cpu_probes_peak_is_its_live_tensor_bytes_as_in_the_pick_table():
    """On CPU there is no device peak: the probes table said unknown/unknown where the pick
    table gave the same probe's live tensor bytes (what --memory-limit caps)."""
    probe = Probe(index=0, stage="batch", job={"precision": "fp32", "grad_ckpt": "off"},
                  micro_batch=8, grad_accum=1, num_workers=0, compile=False, status="ok",
                  measured=Measured(peak_allocated_bytes=1.35 * GIB, tokens_per_s=600.0),
                  predicted=Predicted(peak_allocated_bytes=1.34 * GIB, tokens_per_s=650.0),
                  probe_time_s=2.0)
    table = probes_text([probe], on_cpu=True)
    row = table.rows[0]
    assert row[8:10] == ["1.34", "1.35"]
    gpu = Probe(**{**probe.__dict__, "measured": Measured(peak_allocated_bytes=1.0 * GIB,
                                                          peak_device_bytes=2.0 * GIB)})
    assert probes_text([gpu], on_cpu=False).rows[0][9] == "2.00"
    # on a GPU a probe without a device peak (a card the catalog does not know: no predicted
    # CUDA context) is unknown there, not its allocated bytes under "peak device" (a review)
    table = probes_text([gpu], on_cpu=False)
    assert table.rows[0][8] == "unknown" and "not in trainfit's catalog" in table.notes[0]
    assert probes_text([probe], on_cpu=True).notes == []
