"""Ground truth on this machine: run the same step for real on the CPU and find its peak.

``torch.profiler(profile_memory=True)`` records every alloc/free of the CPU allocator; replaying
them in time order from the bytes alive before the step (weights, buffers, the batch) gives the
exact peak of live bytes, the CPU equivalent of ``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import torch

from trainfit.engine.step import repeat_batches, train_step
from trainfit.job import JobSpec
from trainfit.model.batch import make_batch
from trainfit.model.init import init_weights
from trainfit.model.runtime import check_offload_on, scaler_for
from trainfit.model.source import ModelSource
from trainfit.model.workload import build_model_on_meta, cpu_autocast, make_optimizer


@dataclass
class CpuMeasurement:
    peak_allocated_bytes: int
    """Measured peak of live CPU-allocator bytes over the steps (bytes)."""
    base_bytes: int
    """Bytes alive before the first step: weights, buffers, the batch."""
    loss: float


def materialize_on_cpu(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Real CPU storage for a model built on ``meta`` (values: N(0, 0.02), as GPT-2/Llama init)."""

    return init_weights(model, "cpu", seed, zero_lora_b=False)


def _storage_bytes(tensors: list[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def measure_cpu_step(job: JobSpec, source: ModelSource, steps: int = 2, seed: int = 0
                     ) -> CpuMeasurement:
    from torch.profiler import ProfilerActivity, profile

    check_offload_on(job, torch.device("cpu"))
    torch.manual_seed(seed)
    model, _ = build_model_on_meta(job, source)
    materialize_on_cpu(model, seed)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(job, trainable, simulate=False)
    batch = make_batch(source, job.micro_batch or 1, job.seq_len,
                       generator=torch.Generator().manual_seed(seed), packed=job.packs_rows,
                       padded=job.padded)
    micro = min(job.grad_accum or 1, 2)
    autocast = cpu_autocast(job)
    scaler = scaler_for(job, torch.device("cpu"))  # amp-fp16's, as tune and train run it

    base = _storage_bytes([*model.parameters(), *model.buffers(), *batch.values()])
    loss = 0.0
    gc.collect()  # garbage of earlier work freed now, not counted as this step's frees
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(steps):
            res = train_step(model, optimizer, repeat_batches(batch, micro), grad_accum=micro,
                             autocast=autocast, max_grad_norm=job.max_grad_norm, scaler=scaler,
                             grads_to_none=job.grads_to_none,
                             keep_output=job.output_in_backward)
            loss = float(res.loss) if res.loss is not None else 0.0
    events = [e for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
    cur = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        cur += e.nbytes()
        peak = max(peak, cur)
    return CpuMeasurement(base + peak, base, loss)
