"""Rules: a measured step split (+ what the profile and the sampler saw) → named bottlenecks.

Each finding carries the numbers that show it (all measured, or derived from measured numbers by
the formula its fix text states), the fix, and the predicted gain in throughput as a fraction
(0.5 = 1.5× the tokens/s), or None where no honest number exists. Findings are ordered by predicted
gain: the first one is *the* bottleneck.

Predicted gains (each assumes the named cost disappears and nothing else changes):
* input-bound: the data wait is hidden or removed → gain = 1 / (1 − wait fraction) − 1;
* sync-bound: sync + logging done once per logging interval instead of every micro-step →
  gain = 1 / (1 − their fraction) − 1 (on a GPU each sync also drains the kernel queue: more);
* logging-bound: print / log / save without syncs done once per interval → gain =
  1 / (1 − their fraction) − 1;
* launch-bound: a k× larger micro-batch (same effective batch) dispatches k× fewer ops per token →
  gain = step / (step − overhead · (1 − 1/k)) − 1, overhead = ops × measured cost of one op;
* needless-recompute: the recomputed forward disappears → gain = 1 / (1 − recompute fraction) − 1;
* loop-code: the time outside every named part (the loop's own code) disappears → gain =
  1 / (1 − its fraction) − 1, an upper bound (some of it is needed work).
"""

from __future__ import annotations

import math

from trainfit.doctor.memory_findings import offload_finding, recompute_finding, swap_finding
from trainfit.doctor.observation import Finding, Observation, gain_from_removing, rounded
from trainfit.speed.predict import MATMUL_BOUND_FRACTION

BOTTLENECKS = ("input-bound", "launch-bound", "bandwidth-bound", "compute-bound", "slow-matmuls",
               "compute-and-bandwidth", "needless-recompute",
               "sync-bound", "logging-bound", "cpu-offload", "host-swapping", "loop-code",
               "slow-optimizer")

INPUT_BOUND_FRACTION = 0.20
"""Data wait (+ host→device copy) at or above this share of the step: input-bound (the issue's
threshold). Between MINOR and this it is still reported, as a smaller finding."""
MINOR_FRACTION = 0.05
SYNC_BOUND_FRACTION = 0.05
"""Sync points + per-step logging at or above this share of the step, with at least one sync per
micro-step in the loop: sync-bound."""
LOGGING_BOUND_FRACTION = 0.10
"""Printing / logging / saving without a sync at or above this share of the step: logging-bound
(a gain under 10 % is no bottleneck: the findings' own line, as for every other rule)."""
LAUNCH_BOUND_FRACTION = 0.30
"""Dispatch overhead (ops × cost of one op) at or above this share of the compute phases."""
MICRO_BATCH_SCALE = 4
"""The k of the launch-bound prediction when the job does not say how far the micro-batch can grow."""
MATMUL_COMPUTE_FRACTION = MATMUL_BOUND_FRACTION
"""Matmul share of op time at or above which a step with no other bottleneck is compute-bound
(plan's line for a predicted step: one step, one name)."""
MATMUL_BAND = 0.1
"""Within ± this of MATMUL_COMPUTE_FRACTION the step is named compute-and-bandwidth: the measured
share moves by a few points between repeats of the same job (op timings on a busy host), and a hard
line there made the same job compute-bound in one run and bandwidth-bound in the next."""
LOW_MFU = 0.05
"""Below this share of the device's peak FLOP/s a step whose time is in its matrix multiplies is
not 'good: the step computes': they run far from the peak (a QA run on a busy 2-core host: MFU
0.1-0.2 % called compute-bound and good, where one thread made the same job launch-bound), and
it is named slow-matmuls, not compute-bound (a review: "compute-bound" over "MFU 0.2 %" read as
a contradiction)."""


def find(obs: Observation) -> list[Finding]:
    out: list[Finding] = []
    for rule in (_input, _sync, _logging, _launch, recompute_finding, offload_finding,
                 swap_finding, _loop_code, _optimizer):
        f = rule(obs)
        if f is not None:
            out.append(f)
    big = [f for f in out if (f.gain_fraction or 0.0) >= 0.10 and not _minor(f)]
    if not big and not any(f.bottleneck in ("cpu-offload", "host-swapping") for f in out):
        out.append(_compute_or_bandwidth(obs))
    # the first finding is called the bottleneck: a minor one (a data wait under the input-bound
    # line) goes after the others, whatever its gain (a QA run named "input-bound … 6 % — minor"
    # the bottleneck of a step 94 % in compute)
    # a loop of per-value syncs (hundreds per micro-step: .item() per token) spends its loop
    # code around those syncs: the sync finding names it and its fix; loop code goes after it,
    # whatever the share the host's load gave either run to run (a fresh-clone run named
    # loop-code where three others named sync-bound, on the same script)
    sync_loop = any(f.bottleneck == "sync-bound"
                    and (f.evidence.get("sync_calls_per_step") or 0)
                    >= SYNC_LOOP_CALLS * (f.evidence.get("micro_steps_per_step") or 1)
                    for f in out)
    out.sort(key=lambda f: (_minor(f) or (sync_loop and f.bottleneck == "loop-code"),
                            -(f.gain_fraction
                              if f.gain_fraction is not None else 0.05)))
    return out


SYNC_LOOP_CALLS = 100
"""Sync points per micro-step from which the loop code is taken as the syncs' own loop: a
training step syncs a handful of times (a loss logged, a clip norm), a per-token loop thousands."""


def _minor(f: Finding) -> bool:
    """Listed after the others, whatever its gain: a data wait under the input-bound line, loop
    code under half the step."""
    frac = f.evidence.get("data_wait_fraction")
    other = f.evidence.get("other_fraction")
    return (f.bottleneck == "input-bound" and frac is not None and frac < INPUT_BOUND_FRACTION) \
        or (f.bottleneck == "loop-code" and other is not None
            and other < LOOP_CODE_BOTTLENECK_FRACTION)


def _input(o: Observation) -> Finding | None:
    s = o.split
    wait = s.data_wait_s + s.h2d_copy_s
    frac = wait / s.step_time_s if s.step_time_s > 0 else 0.0
    if frac < MINOR_FRACTION:
        return None
    compute = s.forward_s + s.backward_s + s.optimizer_s
    ev: dict[str, float | None] = {
        "data_wait_s": rounded(s.data_wait_s), "h2d_copy_s": rounded(s.h2d_copy_s),
        "step_time_s": rounded(s.step_time_s), "data_wait_fraction": rounded(frac, 4),
        "compute_s": rounded(compute), "num_workers": o.num_workers,
        "step_time_spread_s": rounded(s.step_time_spread_s)}
    fixes = []
    # what a script's loader waits on is not seen (a sleeping collate read "pre-tokenize")
    first = ("find what the loader waits on (the dataset's __getitem__, the collate function, "
             "reading files); if it is tokenizing, " if o.trainfit_job is False else "")
    if o.lazy_tokenization or o.trainfit_job is False:
        fixes.append(first + "pre-tokenize once into a memory-mapped token file keyed by a hash "
                     "of tokenizer + data "
                     "+ seq_len and reused across runs, packing documents into full sequences (EOS between "
                     "them; attention then crosses document boundaries inside a sequence — the usual "
                     "pre-training trade-off)")
    fixes.append(_workers_fix(o, wait, compute))
    if o.device == "cuda" and s.h2d_copy_s > 0.02 * s.step_time_s:
        fixes.append("copy with .to(device, non_blocking=True) from pinned memory")
    return Finding("input-bound", ev, "; ".join(fixes), rounded(gain_from_removing(frac), 4),
                   f"waiting for data {frac:.0%} of the step (measured)"
                   + ("" if frac >= INPUT_BOUND_FRACTION else " — minor")
                   + "; the gain if the wait all went is an upper bound", gain_upper_bound=True)


def _workers_fix(o: Observation, wait: float, compute: float) -> str:
    """The loader's worker count that would hide the wait, never the count it has (an audit:
    "num_workers=1" to a loader with 1 worker), with what it would leave.  ``w`` workers that
    leave a wait of W per step behind a compute of C each take w·(C + W) per batch (none: the
    main process takes W), so ⌈w·(C + W) / C⌉ hide it; on a host whose cores also run the
    compute a worker only helps with a core to itself."""
    w = o.num_workers or 0
    per_batch = w * (compute + wait) if w else wait
    spare = max(o.cpu_count - 1, 1)
    need = max(w + 1, math.ceil(per_batch / max(compute, 1e-9) - 1e-6))  # 1.2 / 0.4 = 3.0000…04
    n = min(need, spare)
    if o.trainfit_job:
        return (f"then DataLoader(num_workers={max(n, w + 1)}, persistent_workers=True, "
                "prefetch_factor=2" + (", pin_memory=True" if o.device == "cuda" else "")
                + ") if a wait remains (trainfit doctor --apply chooses the count by measurement "
                "within the host RAM budget)")
    if n <= w:
        return (f"more DataLoader workers would not help here: its {w} already use the "
                f"{spare} spare core{'s' if spare > 1 else ''} — make each batch cheaper")
    left = max(0.0, per_batch / n - compute)
    now = f" (it has {w})" if o.num_workers is not None else ""
    return (f"then DataLoader(num_workers={n}{now}, persistent_workers=True, prefetch_factor=2"
            + (", pin_memory=True" if o.device == "cuda" else "") + "): predicted wait "
            f"{wait * 1e3:.0f} → {left * 1e3:.0f} ms per step"
            + (f" (the {spare} spare core{'s' if spare > 1 else ''} cap it; {need} would hide "
               "it)" if n < need else ""))


LOOP_CODE_FRACTION = 0.25
"""The step's time outside every named part (``other_s``: step − forward, backward, optimizer,
data, sync, logging …) at or above this share is named: an audit saw 42 % of a step there go
unnamed under a 50 % line."""
LOOP_CODE_BOTTLENECK_FRACTION = 0.5
"""... and at or above this share it may be the bottleneck; below, it is listed after the others.
A per-token ``.item()`` loop puts 25-37 % of its step in the Python around the syncs (other_s)
and 19-33 % in the syncs, run to run: ranked by gain alone the named bottleneck flipped between
repeats, though the fix (drop the per-token loop) is the same."""
OPTIMIZER_FRACTION = 0.20
"""The optimizer step's share of the step at or above which an unfused optimizer is named: tune's
``optimizer_impl`` knob measured fused AdamW faster where the step is this optimizer-heavy."""


def _loop_code(o: Observation) -> Finding | None:
    """Most of the step outside the model's work and the data: a QA loop with a 5 ms sleep was
    called bandwidth-bound (its multiplies 25 % of op time) while 83 % of its step was that
    sleep; no fix to the model's step could gain more than 17 %."""
    s = o.split
    frac = s.other_s / s.step_time_s if s.step_time_s > 0 else 0.0
    if frac < LOOP_CODE_FRACTION:
        return None
    ev = {"other_s": rounded(s.other_s), "step_time_s": rounded(s.step_time_s),
          "other_fraction": rounded(frac, 4)}
    return Finding("loop-code", ev, "profile the loop's own Python between the steps (py-spy "
                   "top --pid, or cProfile): what doctor's hooks do not time — metrics computed "
                   "on the host, sleeps or waits, writes other than print/logging/torch.save, "
                   "third-party loggers; do it every N steps, or on the device",
                   rounded(gain_from_removing(frac), 4),
                   f"{frac:.0%} of the step is outside every part doctor times (data wait, "
                   "host→device copy, forward, backward, optimizer, sync, logging and checkpoint "
                   "I/O; measured: the step less those parts); the gain if it all went is an "
                   "upper bound", gain_upper_bound=True)


def _optimizer(o: Observation) -> Finding | None:
    """An unfused AdamW/SGD whose step is a large share of the training step: the fix tune's
    ``optimizer_impl`` knob tries (an audit: doctor had no optimizer finding of its own)."""
    s = o.split
    frac = s.optimizer_s / s.step_time_s if s.step_time_s > 0 else 0.0
    if o.optimizer_fused is not False or frac < OPTIMIZER_FRACTION:
        return None
    ev = {"optimizer_s": rounded(s.optimizer_s), "step_time_s": rounded(s.step_time_s),
          "optimizer_fraction": rounded(frac, 4)}
    name = o.optimizer_name or "AdamW"
    fix = ("a fused optimizer: optimizer_impl: fused in the job (trainfit doctor --apply measures "
           "it)" if o.trainfit_job else f"a fused optimizer: torch.optim.{name}(..., fused=True)"
           + (" (HF Trainer: optim=\"adamw_torch_fused\")" if name == "AdamW" else "")) + \
        ": one kernel over all parameters instead of a group of ops per step"
    return Finding("slow-optimizer", ev, fix, rounded(gain_from_removing(frac), 4),
                   f"the optimizer step is {frac:.0%} of the step (measured), unfused; the gain if "
                   "it all went is an upper bound — a fused step still reads and writes every "
                   "weight and state", gain_upper_bound=True)


def _sync(o: Observation) -> Finding | None:
    s = o.split
    micro = o.micro_steps_per_step or 1.0
    cost = s.sync_s + s.logging_io_s
    frac = cost / s.step_time_s if s.step_time_s > 0 else 0.0
    if o.sync_calls_per_step < micro or frac < SYNC_BOUND_FRACTION:
        return None
    ev = {"sync_calls_per_step": rounded(o.sync_calls_per_step, 2), "micro_steps_per_step": rounded(micro, 2),
          "sync_s": rounded(s.sync_s), "logging_io_s": rounded(s.logging_io_s),
          "log_calls_per_step": rounded(o.log_calls_per_step, 2), "sync_fraction": rounded(frac, 4),
          "step_time_s": rounded(s.step_time_s)}
    fix = ("keep running values on the device (running_loss += loss.detach()) and call .item() / "
           "print / log once every N optimizer steps (e.g. 50), not every micro-step; reduce per-sample "
           "metrics on the device before one transfer")
    where = ("on a GPU each sync also empties the kernel queue, so the gain there is larger"
             if o.device == "cpu" else "each one empties the kernel queue")
    return Finding("sync-bound", ev, fix, rounded(gain_from_removing(frac), 4),
                   f"{o.sync_calls_per_step:.0f} sync points per step ({o.sync_calls_per_step / micro:.1f} "
                   f"per micro-step) cost {frac:.0%} of the step (measured); {where}")


def _logging(o: Observation) -> Finding | None:
    """Printing and logging that cost the step without a sync (text built from host values):
    judged only beside syncs before, so 1,500 log calls a step went unnamed and the step was
    called compute-bound, "good" (an audit)."""
    s = o.split
    frac = s.logging_io_s / s.step_time_s if s.step_time_s > 0 else 0.0
    # with a sync per micro-step the sync rule judges the logging with it (its cost counts both)
    if o.sync_calls_per_step >= (o.micro_steps_per_step or 1.0) or frac < LOGGING_BOUND_FRACTION:
        return None
    ev = {"logging_io_s": rounded(s.logging_io_s), "log_calls_per_step": rounded(o.log_calls_per_step, 2),
          "logging_fraction": rounded(frac, 4), "step_time_s": rounded(s.step_time_s)}
    return Finding("logging-bound", ev, "print / log once every N optimizer steps (e.g. 50), "
                   "not every step; keep per-step values in a list and write them together",
                   rounded(gain_from_removing(frac), 4),
                   f"{o.log_calls_per_step:.0f} print/log/save calls per step cost {frac:.0%} of "
                   "the step (measured)")


def _slow_matmuls(o: Observation, ev: dict[str, float | None], measured: tuple[int, float],
                  share: float, gain: float | None, no_accum: bool) -> Finding:
    """The micro-batch probe measured a gain that op dispatch (``share`` of the compute) is too
    small to explain: the matrix multiplies run faster with more rows each."""
    # the fix in the multiplies' words, at the micro-batch measured: no dispatch advice
    # (fused optimizer, CUDA graphs) beside "dispatch is only 1 %" (a review)
    to = measured[0]
    grow = max(to // o.micro_batch, 1) if o.micro_batch else None
    mm_fix = ((f"micro-batch {o.micro_batch} → {to}" if o.micro_batch else
               f"micro-batch {to}")
              + (f" with grad_accum divided by {grow} (same effective batch, same "
                 "learning)" if grow and grow > 1 and not no_accum else "")
              + f": each matrix multiply gets {grow or 'more'}× the rows (dispatch is only "
              f"{share:.0%} of the compute, measured: the measured gain is the multiplies' "
              "own)")
    if no_accum:
        mm_fix += ("; this loop has no gradient accumulation to divide, so the effective "
                   "batch grows too (it changes the learning: scale the learning rate, or "
                   "accept it)")
    return Finding("slow-matmuls", ev, mm_fix, rounded(gain, 4),
                   f"micro-batch {measured[0]} measured {measured[1]:+.0%} tokens/s, while op "
                   f"dispatch is {share:.0%} of the compute time ({o.ops_per_step:.0f} ops × "
                   f"{o.op_overhead_s * 1e6:.1f} µs, measured), under the "
                   f"{LAUNCH_BOUND_FRACTION:.0%} that would make it launch-bound: the matrix "
                   "multiplies are too small to run fast")


def _launch(o: Observation) -> Finding | None:
    s = o.split
    compute = s.forward_s + s.backward_s + s.optimizer_s
    if compute <= 0:
        return None
    ev: dict[str, float | None] = {"step_time_s": rounded(s.step_time_s), "compute_s": rounded(compute)}
    overhead = counted = None
    if o.ops_per_step is not None and o.op_overhead_s is not None:
        counted = o.ops_per_step * o.op_overhead_s
        overhead = min(counted, compute)  # dispatch cannot take more than the compute it is in
        ev.update(ops_per_step=o.ops_per_step, op_overhead_s=rounded(o.op_overhead_s, 9),
                  launch_overhead_fraction=rounded(overhead / compute, 4))
    if o.tokens_per_step and o.micro_steps_per_step:
        ev["tokens_per_micro_step"] = rounded(o.tokens_per_step / o.micro_steps_per_step, 1)
    idle = s.idle_s / s.step_time_s if s.idle_s is not None and s.step_time_s > 0 else None
    if idle is not None:
        ev["device_idle_fraction"] = rounded(idle, 4)
    measured = o.measured_micro_batch_gain
    by_overhead = overhead is not None and overhead / compute >= LAUNCH_BOUND_FRACTION
    by_idle = idle is not None and idle >= LAUNCH_BOUND_FRACTION
    by_probe = measured is not None and measured[1] >= 0.10
    if not (by_overhead or by_idle or by_probe):
        return None
    k = MICRO_BATCH_SCALE
    if o.micro_batch and o.max_micro_batch:
        k = max(o.max_micro_batch // o.micro_batch, 1)
    # a loop without accumulation has none to divide: a k× micro-batch is a k× effective batch
    no_accum = o.max_micro_batch is None and o.micro_steps_per_step is not None \
        and o.micro_steps_per_step <= 1
    gain = None
    if measured is not None:
        ev["probe_micro_batch"] = measured[0]
        ev["probe_measured_gain_fraction"] = rounded(measured[1], 4)
        gain = measured[1]
    elif overhead is not None and k > 1:
        gain = s.step_time_s / max(s.step_time_s - overhead * (1 - 1 / k), 1e-9) - 1
    elif idle is not None and k > 1:
        gain = gain_from_removing(idle * (1 - 1 / k))
    if k <= 1 and measured is None:
        return None  # the micro-batch cannot grow: nothing to predict from this rule
    if by_probe and not (by_overhead or by_idle) and overhead is not None:
        # the probe's gain is measured, but dispatch is too small a share to be its cause: the
        # multiplies themselves ran faster with more rows each (an audit: "launch-bound … 18 % of
        # the compute time", +221 % measured, where removing every dispatch gives +17 % at most)
        return _slow_matmuls(o, ev, measured, overhead / compute, gain, no_accum)
    mb = (f"micro-batch {o.micro_batch} → {o.micro_batch * k}" if o.micro_batch
          else f"a {k}× larger micro-batch")
    fix = (f"{mb} with grad_accum divided by {k} (same effective batch, same learning): "
           f"{k}× fewer op dispatches per token")
    if no_accum:
        fix = (f"{mb}: {k}× fewer op dispatches per token, but this loop has no gradient "
               f"accumulation to divide, so the effective batch grows {k}× too (it changes the "
               "learning: scale the learning rate, or accept it); where the run accumulates, "
               f"divide its accumulation by {k} instead")
    if o.optimizer_fused is False and s.optimizer_s > 0.15 * s.step_time_s:
        fix += "; a fused optimizer (torch.optim.AdamW(..., fused=True)) dispatches one op per step"
    if o.device == "cuda":
        fix += "; CUDA graphs / torch.compile(mode='reduce-overhead') remove the launches themselves"
    detail = (f"{o.ops_per_step:.0f} ops per step × {o.op_overhead_s * 1e6:.1f} µs each = "
              f"{overhead / compute:.0%} of the compute time (measured count × measured cost)"
              if overhead is not None else "device idle between kernels")
    if counted is not None and overhead is not None and counted > compute:
        # said, not clamped silently: 7,542 × 16.1 µs = 121 ms printed as "= 100 %" of 88.5 ms
        detail = (f"{o.ops_per_step:.0f} ops per step × {o.op_overhead_s * 1e6:.1f} µs each = "
                  f"{counted * 1e3:.1f} ms, more than the {compute * 1e3:.1f} ms of compute measured "
                  "(the per-op cost, timed on this host on its own, overstates this step's: "
                  "counted as all of the compute, so the predicted gain is an upper bound)")
    if measured is not None:
        detail += f"; micro-batch {measured[0]} measured {measured[1]:+.0%} tokens/s"
    return Finding("launch-bound", ev, fix, rounded(gain, 4), detail,
                   gain_upper_bound=counted is not None and overhead is not None
                   and counted > compute and measured is None)


def _bf16(o: Observation, why: str) -> str:
    """The bf16 advice, or where bf16 would be slower here, that said instead (an audit: doctor
    advised bf16 autocast on a CPU where bf16 steps ran 28× slower)."""
    if o.computes_in in ("bfloat16", "float16"):
        # the advice to a step already in 16 bits (an audit: given to a bf16 autocast loop)
        return f"it already computes in {o.computes_in} (measured)"
    if o.bf16_fast is False:
        return "not bf16 on this CPU (no bf16 matrix instructions: its bf16 multiplies run slower than fp32)"
    return f"bf16 autocast where the device supports it ({why})"


def _compute_or_bandwidth(o: Observation) -> Finding:
    s = o.split
    ev: dict[str, float | None] = {"step_time_s": rounded(s.step_time_s), "mfu": rounded(o.mfu, 4),
                                   "peak_flop_per_s": rounded(o.peak_flops, 0) if o.peak_flops else None,
                                   "matmul_time_fraction": rounded(o.matmul_time_fraction, 4),
                                   "tokens_per_step": o.tokens_per_step}
    if o.padding_fraction is not None:
        ev["padding_fraction"] = rounded(o.padding_fraction, 4)
    pad_fix = ""
    gain = None
    if o.padding_fraction is not None and o.padding_fraction >= 0.10:
        pad_fix = ("; length-grouped batches with padding to the batch's longest sample would skip "
                   f"{o.padding_fraction:.0%} padded positions")
        gain = rounded(gain_from_removing(o.padding_fraction), 4)
    frac = o.matmul_time_fraction
    mfu = (f"MFU {o.mfu:.1%}" if o.mfu < 0.01 else f"MFU {o.mfu:.0%}") if o.mfu is not None \
        else "MFU unknown"
    # before the band's "both matter": an MFU of 0.2 % with multiplies at 56 % of op time was
    # called compute-and-bandwidth (an audit); slow multiplies are the finding wherever they
    # are not the minor part of the op time
    if o.mfu is not None and o.mfu < LOW_MFU and (
            frac is None or frac >= MATMUL_COMPUTE_FRACTION - MATMUL_BAND):
        busy = o.host is not None and o.host.busy and o.host.others_cores is not None
        why = (f"other processes used {o.host.others_cores:.1f} of {o.host.cpus} CPU cores meanwhile "
               "(measured): the multiplies shared the cores" if busy and o.host is not None else
               "the matrices may be too small to fill the device (micro-batch × sequence), or "
               "its threads contend")
        fix = (f"not good: the matrix multiplies run at {o.mfu:.1%} of the device's peak — {why}. "
               + ("On a CPU give torch no more threads than free cores (torch.set_num_threads / "
                  "OMP_NUM_THREADS) and measure when the host is quiet; " if o.device == "cpu"
                  else "") + "a larger micro-batch gives each multiply more work" + pad_fix)
        return Finding("slow-matmuls", ev, fix, gain,
                       f"the step's time is in its matrix multiplies, at {mfu}, far below the "
                       "peak (measured time, counted FLOPs, measured peak)")
    if frac is not None and abs(frac - MATMUL_COMPUTE_FRACTION) < MATMUL_BAND:
        return Finding("compute-and-bandwidth", ev, "both matter: "
                       + _bf16(o, "faster matrix multiplies, half the bytes") + "; fused "
                       "elementwise work (torch.compile, a fused optimizer)" + pad_fix, gain,
                       f"matrix multiplies are {frac:.0%} of op time (measured), within "
                       f"{MATMUL_BAND:.0%} of the {MATMUL_COMPUTE_FRACTION:.0%} line between compute- "
                       "and bandwidth-bound: neither dominates")
    if frac is not None and frac < MATMUL_COMPUTE_FRACTION:
        return Finding("bandwidth-bound", ev, "fuse the elementwise work: torch.compile, a fused "
                       "optimizer; " + _bf16(o, "half the bytes") + pad_fix,
                       gain, f"matrix multiplies are only {o.matmul_time_fraction:.0%} of op time "
                       "(measured): the rest moves memory")
    s = o.split
    share = (s.forward_s + s.backward_s + s.optimizer_s) / s.step_time_s if s.step_time_s > 0 \
        else 1.0
    # where MFU is known it rests on a counted FLOP total and a peak; unknown (a model whose
    # FLOPs trainfit cannot count: a script's own module) it is said so, and nothing is called
    # good on it (an audit: "good", "MFU unknown (measured time, counted FLOPs, measured peak)")
    basis = f"{mfu} (measured time, counted FLOPs, measured peak)" if o.mfu is not None else \
        (f"{mfu}: the model's FLOPs were not counted; matrix multiplies are {frac:.0%} of op "
         "time (measured)" if frac is not None else f"{mfu}: the model's FLOPs were not counted")
    if share < 0.5:
        # not "good" when the compute is the smaller part of the step (an audit: 28 %, the rest
        # logging and loop code, was called good)
        ev["compute_fraction"] = rounded(share, 4)
        return Finding("compute-bound", ev, ("the multiplies run well, but " if o.mfu is not None
                                             else "") + "forward, backward and "
                       f"optimizer are only {share:.0%} of the step (measured): the rest is "
                       "outside them (see the other findings)" + pad_fix, gain, basis)
    if frac is None and o.mfu is None:
        # neither measured: "good" was said of a step nobody profiled (an audit)
        return Finding("compute-bound", ev, "unknown: how well forward, backward and optimizer "
                       "compute was not measured — no profiled step (--no-profile, or the "
                       "profiler could not run here) and no MFU; run the doctor with profiling"
                       + pad_fix, gain, f"forward, backward and optimizer are {share:.0%} of the "
                       "step (measured); MFU unknown, matmul share unknown")
    head = "good: the step computes. " if o.mfu is not None else (
        "the step's time is in its matrix multiplies (measured); how near the device's peak they "
        "run is unknown (MFU unknown: the model's FLOPs were not counted). ")
    return Finding("compute-bound", ev, head + "More throughput needs less work per "
                   "token (" + (f"a smaller model; it already computes in {o.computes_in}"
                                if o.computes_in in ("bfloat16", "float16") else
                                "a smaller model; not bf16 on this CPU: no bf16 matrix instructions"
                                if o.bf16_fast is False else "bf16/fp16 where supported, a smaller "
                                "model") + ") or a faster device" + pad_fix, gain, basis)
