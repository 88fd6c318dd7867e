"""Four small simulations predict the full-depth step exactly (homogeneous stacks)."""

from trainfit.job import JobSpec
from trainfit.memory.extrapolate import fit_group, homogeneous
from trainfit.memory.simulate import SimTarget, simulate_step


def test_bilinear_extrapolation_is_exact(tiny_llama):
    import copy

    src = copy.copy(tiny_llama)
    src.config = copy.deepcopy(tiny_llama.config)
    src.config.num_hidden_layers = 6
    assert homogeneous(src)
    base = JobSpec(model="t", seq_len=64, micro_batch=2, grad_accum=2, precision="amp-bf16",
                   method="lora", lora_targets="q,v")
    target = SimTarget(device="cuda")
    model = fit_group(base, src, target, batches=(2, 3))
    assert model.layer_extrapolated
    for b in (4, 6):
        full = simulate_step(base.replace(micro_batch=b, grad_accum=2), src, target)
        pred = model.predict(b, accumulating=True)
        assert abs(pred["total_params"] - full.total_params) == 0
        # tensor peak: exact up to 512-byte block rounding of per-sample tensors
        tensor_peak = max(v for k, v in full.phase_peaks.items() if k != "setup")
        fitted = pred["peak_allocated_bytes"]
        assert abs(fitted - tensor_peak) <= 0.002 * tensor_peak
