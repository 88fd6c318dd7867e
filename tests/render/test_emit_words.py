"""``trainfit emit``'s messages (render/emit.py): the library versions the names are of, and
"tuned" / "fits" said only of what tune measured."""

from __future__ import annotations

from trainfit.job import JobSpec
from trainfit.job.emit import emit
from trainfit.render.emit import emit_messages


def test_a_trl_payload_names_the_trl_its_sftconfig_fields_are_from():
    """An audit: emit --to trl said "names of transformers" only; SFTConfig's own fields are
    TRL's."""
    import importlib.metadata

    job = JobSpec(model="gpt2", micro_batch=2, grad_accum=2, precision="fp32", grad_ckpt="off")
    e = emit(job, "trl", device="cpu")
    first = emit_messages(e, "job.yaml", {}, searched=False)[0]
    assert f"and TRL {importlib.metadata.version('trl')}" in first
    assert "TRL" not in emit_messages(emit(job, "hf", device="cpu"), "job.yaml", {},
                                      searched=False)[0]


def test_emit_says_tuned_and_fits_only_of_what_tune_measured():
    """An audit: a hand-written 64 × 4096 full fine-tune with memory_limit 1GiB and no measured
    block read "tuned on cpu, memory limit 1.00 GiB (the knobs fit in it as tuned …)"; a measured
    peak of 4.66 GiB beside a 1.20 GiB limit read the same; a CPU-tuned file emitted for cuda
    said only "tuned on cpu"."""
    job = JobSpec(model="llama-tiny-58m", seq_len=4096, micro_batch=64, grad_accum=1,
                  effective_batch=64, precision="fp32", grad_ckpt="off")
    e = emit(job, "hf", device="cpu")
    untuned = emit_messages(e, "untuned.yaml", {"device": "cpu", "memory_limit": 2**30},
                            searched=False)[1]
    assert "not tuned: untuned.yaml has no measured block" in untuned
    assert "tuned on" not in untuned and "fit in it" not in untuned
    over = emit_messages(e, "c6.yaml", {"device": "cpu", "memory_limit": int(1.2 * 2**30),
                                        "measured": {"peak_allocated_bytes": 5_000_000_000}},
                         searched=False)[1]
    assert "the measured peak below is above it" in over and "fit in it as tuned" not in over
    assert "peak allocated 4.66 GiB (measured)" in over
    within = emit_messages(e, "t.yaml", {"device": "cpu", "memory_limit": 2 * 2**30,
                                         "measured": {"peak_allocated_bytes": 2**30}},
                           searched=False)[1]
    assert "the knobs fit in it as tuned" in within and "emitted for" not in within
    for_cuda = emit_messages(emit(job, "hf", device="cuda"), "t.yaml",
                             {"device": "cpu", "measured": {"peak_allocated_bytes": 2**30}},
                             searched=False)[1]
    assert "tuned on cpu, emitted for cuda" in for_cuda and "tune there" in for_cuda
