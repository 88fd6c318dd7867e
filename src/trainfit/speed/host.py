"""The host side of a GPU step, measured: the step's own code run at a tiny width on this CPU.

Why.  The roofline charges each recorded aten op a fixed CPU cost (``roofline.EAGER_*``,
measured on loops of single ops).  A training step pays more than its ops: the model's own Python
between them (transformers' attention interface, mask building and output decorators, PEFT's
loop over adapters and its dropout modules, checkpointing's saved-tensor hooks and the
recomputation they trigger in the backward).  Launch-bound steps measured on an H100 took
1.5-3.0× the op-level cost (benchmarks/results/gpu_validate.md: 13 rows, +45 % … +200 %
throughput over-predicted), and the CPU's own small-batch steps 13-30 % more
(benchmarks/results/speed_cpu.md).

How.  That Python does not depend on tensor sizes, only on the code path, so it is measured where
it runs: the job's model with the same classes, depth, LoRA, checkpointing and head, built with
tiny widths (heads of 8 dimensions, a 128-token vocabulary; :func:`shrunk_config`), one
micro-step of :func:`trainfit.engine.step.train_step` timed on this CPU (forward + backward: the
thread's CPU time, the fastest of ``REPEATS``), its kernels counted as the simulation counts
them.  At such widths a kernel's CPU
arithmetic is ~1 µs, so the time is the host's.  On a GPU each kernel also pays its launch
(``LAUNCH_S``), and ops the tiny fp32 run does not have (autocast's casts, 4-bit dequantization)
pay the roofline's per-op cost (:meth:`HostStep.host_s`).  The prediction takes the larger of
that and the op-level count, so measuring can only add host time the op count misses.

Assumed and stated: the machine that plans is as fast per Python op as the one that trains (true
when ``plan`` runs on the training machine; this CPU's op loops measured within 5 % of the H100
host's, ``benchmarks/gpu_launch_overhead.py``).  Measured alone: beside a simulation on the
other core a step's CPU time came out 2-4× its own, so ``plan`` measures its groups one after
the other in one worker; repeats spread over ``NOISY`` are timed again.  On this VM the fastest
repeat still moved by ±20 % between runs.

A busy machine.  Another process on this 2-core VM (one matmul loop on the other core) made the
same tiny BERT-large step 1.6-3.7× slower in CPU time (47 ms quiet, 77-176 ms beside it), and a
reference loop of single ops timed around each repeat slowed only 1.5×, so no ratio cancels it:
the step's larger working set loses more to a neighbour than a loop of tiny ops does.  So the
measurement states the machine's load instead: the CPU time other processes (and a hypervisor's
steal) used while the repeats ran (``busy_cores``, from ``psutil.cpu_times``).  Above
``BUSY_CORES`` the repeats are timed again, up to ``BUSY_ROUNDS`` rounds; a measurement still
busy is kept but marked, measured again by the next ``plan`` (the faster of the two kept), and
``plan`` says so beside its launch-bound rows.  A cached quiet measurement is final.

Not measured (the op-level count stands): ``torch.compile`` (no eager Python per op), models
built by a user's factory (no config to shrink), state-space layers and mixtures of experts
(their CPU paths are arithmetic, not the CUDA kernels' Python), a shrunk model whose module
classes differ from the original's.  Measured without: activation offloading's saved-tensor
hooks, bitsandbytes' own Python (a QLoRA job runs as its LoRA twin; the dequantization kernels
pay the op-level cost), FSDP's and DDP's hooks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import psutil
import torch

from trainfit.cache import cache_path, read_json, write_json
from trainfit.job import JobSpec
from trainfit.speed.cpu import cpu_model_name
from trainfit.speed.ops import KernelCounter

LAUNCH_S = 6.0e-6
"""What a kernel's launch adds to its op's host cost on a GPU machine: the same elementwise op,
no autograd, costs 10.7 µs per call on the H100's host and 4.7 µs on this CPU, whose views
(no kernel, dispatcher only) cost the same as there (2.5 vs 2.6 µs) — benchmarks/
gpu_launch_overhead.py, results/gpu_launch.json and its ``--device cpu`` run."""
HEAD_DIM = 8
"""Head width of the tiny model: even (rotary embeddings rotate pairs); wider where a partial
rotary factor needs it (:func:`head_dim_for`)."""
VOCAB = 128
TOKENS = 16
"""Tokens of the timed micro-batch (one sequence).  MoE models get enough for every expert."""
REPEATS = 9
WARMUP = 2
NOISY = 1.5
"""Repeats spread wider than this (slowest / fastest) are timed once more."""
BUSY_CORES = 0.25
"""Other processes' CPU use during the repeats (cores) above which the measurement is busy: a
quarter of a core is 25 ms of every 100 ms, about the step time a neighbour takes from it."""
BUSY_ROUNDS = 3
"""Rounds of ``REPEATS`` timed while the machine stays busy (the fastest repeat of all kept)."""
CACHE_VERSION = 3
"""3: measurements carry ``busy_cores`` (older ones are measured again)."""

_HIDDEN = ("hidden_size", "n_embd", "d_model", "dim")
_HEADS = ("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
          "decoder_attention_heads", "num_decoder_heads")
_KV = ("num_key_value_heads", "num_kv_heads", "n_head_kv")
_INTER = ("intermediate_size", "n_inner", "ffn_dim", "d_ff", "encoder_ffn_dim",
          "decoder_ffn_dim", "moe_intermediate_size", "shared_expert_intermediate_size")
_HEAD_DIM = ("head_dim", "d_kv", "kv_channels")
_EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts")


@dataclass(frozen=True, kw_only=True)
class HostStep:
    """One micro-step's forward + backward of the job's code, run at a tiny width on this CPU."""

    fb_s: float
    """CPU seconds of the thread, the fastest of ``REPEATS`` (measured): the code path's own
    cost; a busy machine only adds to it (cache misses, a descheduled intra-op thread)."""
    spread_s: float
    """Slowest − fastest of the timed repeats (measured noise)."""
    kernels: int
    """Kernels (aten ops with an output in new storage) of that micro-step."""
    layers: int
    cpu: str
    busy_cores: float = 0.0
    """CPU time other processes used while the fastest round ran, per second of it (measured,
    cores; a VM's steal time included): above ``BUSY_CORES`` the time is a busy machine's."""

    @property
    def busy(self) -> bool:
        """Measured while other processes kept this CPU busy (the time may be too slow)."""
        return self.busy_cores > BUSY_CORES

    def host_s(self, sim_kernels: float, op_overhead_s: float, gpu: bool) -> float:
        """Predicted host seconds of the same micro-step on the target: the measured time, on a
        GPU a launch per kernel, and the roofline's op cost for each kernel the simulation
        recorded beyond the tiny run's (autocast's casts, dequantization)."""
        return self.fb_s + (self.kernels * LAUNCH_S if gpu else 0.0) + \
            max(0.0, sim_kernels - self.kernels) * op_overhead_s


def _first_int(cfg: Any, names: tuple[str, ...]) -> tuple[str | None, int]:
    for n in names:
        v = getattr(cfg, n, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return n, v
    return None, 0


def _rotary_fraction(d: dict[str, Any]) -> float:
    """The fraction of a head that rotary embeddings rotate (phi: 0.4-0.5, gpt_neox: 0.25)."""
    for where in (d, d.get("rope_parameters") or {}, d.get("rope_scaling") or {}):
        for k in ("partial_rotary_factor", "rotary_pct"):
            v = where.get(k) if isinstance(where, dict) else None
            if isinstance(v, (int, float)) and 0 < v <= 1:
                return float(v)
    return 1.0


def head_dim_for(d: dict[str, Any]) -> int:
    """The narrowest head (≥ ``HEAD_DIM``) whose rotated part is a whole, even number of
    dimensions, as the model's own is (phi-2 rotates 0.4 of a head: 10 → 4, where 8 gave 3.2)."""
    f = _rotary_fraction(d)
    for hd in range(HEAD_DIM, 257, 2):
        rot = hd * f
        if abs(rot - round(rot)) < 1e-9 and round(rot) % 2 == 0:
            return hd
    return HEAD_DIM


def shrunk_config(cfg: Any) -> Any | None:
    """``cfg`` with tiny widths and the same structure (None: no width fields this knows)."""
    d = cfg.to_dict()
    if any(k.startswith(("mamba", "ssm", "conv_kernel")) for k in d) or any(
            "mamba" in str(t) for t in d.get("layer_types") or ()):
        return None
    hidden_name, _ = _first_int(cfg, _HIDDEN)
    _, heads = _first_int(cfg, _HEADS)
    if hidden_name is None or not heads:
        return None
    _, kv = _first_int(cfg, _KV)
    kv = kv or heads
    if kv < heads and heads % kv == 0:
        new_heads, new_kv = heads // kv, 1  # GQA / MQA: the same repeat factor
    else:
        new_heads, new_kv = 2, 2
    head_dim = head_dim_for(d)
    hidden = new_heads * head_dim
    ch: dict[str, Any] = {hidden_name: hidden, "vocab_size": VOCAB}
    for n in _HEADS:
        if isinstance(d.get(n), int):
            ch[n] = new_heads
    for n in _KV:
        if isinstance(d.get(n), int):
            ch[n] = new_kv
    for n in _INTER:
        if isinstance(d.get(n), int):
            ch[n] = 2 * hidden
    for n in _HEAD_DIM:
        if isinstance(d.get(n), int):
            ch[n] = head_dim
    for k, v in d.items():
        # no dropout: on a CPU it is four ops (bernoulli_, div_, mul and a buffer; aten's fused
        # native_dropout is CUDA's only) and it sends SDPA to its math path (CPU flash attention
        # takes no dropout), where a GPU runs one kernel each; the simulation's dropout kernels
        # are then charged the op-level cost (HostStep.host_s)
        if ("dropout" in k or "pdrop" in k) and isinstance(v, float) and not isinstance(v, bool):
            ch[k] = 0.0
        # token ids past the tiny vocabulary (an embedding's padding_idx)
        if k.endswith("token_id") and isinstance(v, int) and v >= VOCAB:
            ch[k] = 1
        elif k.endswith("token_id") and isinstance(v, list):
            ch[k] = [t if t < VOCAB else 1 for t in v if isinstance(t, int)] or None
    try:
        return type(cfg).from_dict({**d, **ch})
    except (TypeError, ValueError, AttributeError):
        return None


def _structure(model: torch.nn.Module) -> Counter[str]:
    return Counter(type(m).__name__ for m in model.modules())


class _Clock:
    """A step observer: this thread's CPU seconds from the first forward to the optimizer (CPU
    time, not wall time: another process on a busy machine takes wall time from the step, not
    CPU time; on a CPU the backward runs on the calling thread); the counter (when given)
    counts only in between."""

    def __init__(self, counter: KernelCounter | None = None) -> None:
        self.t0 = self.t1 = 0.0
        self.counter = counter

    def set_phase(self, phase: str, micro_step: int = 0) -> None:
        if phase == "forward" and micro_step == 0:
            self.t0 = time.thread_time()
        elif phase == "optimizer":
            self.t1 = time.thread_time()
        if self.counter is not None:
            self.counter.active = phase in ("forward", "backward")


def head_chunks(job: JobSpec) -> int:
    """How many chunks the job's head runs in (1 without ``lm_head_chunk``)."""
    return -(-job.seq_len // job.lm_head_chunk) if job.lm_head_chunk else 1


def tiny_job(job: JobSpec, tokens: int = TOKENS) -> JobSpec:
    """The job as the tiny CPU run takes it: fp32, one sequence of ``tokens``, one process, no
    compile, no LoRA dropout (see :func:`shrunk_config`); a chunked head cut into as many chunks
    as at the job's length (its Python loops once per chunk)."""
    chunk = max(1, -(-tokens // head_chunks(job))) if job.lm_head_chunk else None
    lora = {"method": "lora", "lora_dropout": 0.0} if job.method in ("lora", "qlora") else {}
    return dataclasses.replace(
        job, precision="fp32", **lora, quant=None, micro_batch=1, grad_accum=1,
        effective_batch=None, seq_len=tokens, ranks=1, sharding="none", offload="none",
        compile=False, activation_offload=False, fsdp_frozen_grads=False, fsdp_no_sync=False,
        lm_head_chunk=chunk, data=None, optimizer="adamw", optimizer_impl="foreach",
        kbit_prepared=False)


_JOB_KEYS = ("method", "lora_dropout", "lora_targets", "grad_ckpt", "optimizer_in_backward",
             "hold_outputs", "output_in_backward", "fp32_outputs", "lm_head_chunk", "seq_len",
             "trust_remote_code")
"""The tiny job's fields that change the step's Python (its rank does not: the ladder's rank-8
rung reads the same measurement; SDPA's kernel choices all build as ``sdpa``)."""


def _key(job: JobSpec, cfg: Any, task: str) -> str:
    import peft
    import transformers

    parts = {"v": CACHE_VERSION, "cpu": cpu_model_name(), "torch": torch.__version__,
             "transformers": transformers.__version__, "peft": peft.__version__, "task": task,
             "config": cfg.to_json_string(use_diff=False),
             "attention": "eager" if job.attention == "eager" else "sdpa",
             "job": {k: getattr(job, k) for k in _JOB_KEYS}}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


_MEMO: dict[str, HostStep | None] = {}
SWITCH = "TRAINFIT_HOST_MEASURE"
"""``0`` in the environment: no measurement, the op-level count alone (the test suite's
default: its speed numbers then do not depend on this machine's timing)."""


def host_step(job: JobSpec, source: Any) -> HostStep | None:
    """The measured host time of one micro-step of ``job`` (None where it is not measured: see
    the module docstring).  Measured once per code path and kept in the cache directory.  Never
    raises: a path it cannot measure keeps the op-level count."""
    if os.environ.get(SWITCH) == "0" or job.compile or source.task == "custom-lm":
        return None
    try:
        return _host_step(job, source)
    except Exception:  # an unforeseen config or job: the op-level count stands, plan goes on
        return None


def _host_step(job: JobSpec, source: Any) -> HostStep | None:
    cfg = shrunk_config(source.config)
    if cfg is None or _first_int(cfg, _EXPERTS)[1]:
        # mixture of experts: on a CPU the experts' grouped matmuls fall back to a loop of
        # matmuls and the routed tokens are real arithmetic (a 128-expert tiny run: 1.7 s of
        # compute for 0.09 s of ops), so the time would not be the host's
        return None
    tj = tiny_job(job, max(TOKENS, head_chunks(job)))
    key = _key(tj, cfg, source.task)
    if key in _MEMO:
        return _MEMO[key]
    path = cache_path(f"host_step/{key[:32]}.json")
    cached = read_json(path)
    hs: HostStep | None
    if isinstance(cached, dict) and cached.get("key") == key:
        hs = None if cached.get("none") else HostStep(**cached["step"])
        if hs is not None and hs.busy:  # measured on a busy machine: try again, keep the faster
            hs = quieter(hs, _measure(tj, source, cfg))
            _write(path, key, hs)
    else:
        hs = _measure(tj, source, cfg)
        _write(path, key, hs)
    _MEMO[key] = hs
    return hs


def quieter(old: HostStep, new: HostStep | None) -> HostStep:
    """Of a busy machine's measurement and a new one: a quiet one, else the faster."""
    if new is None:
        return old
    if not new.busy or new.fb_s < old.fb_s:
        return new
    return old


def _write(path: Any, key: str, hs: HostStep | None) -> None:
    write_json(path, {"key": key, "none": hs is None,
                      "step": None if hs is None else dataclasses.asdict(hs)})


def others_cpu_s() -> tuple[float, float]:
    """(CPU seconds every CPU has been busy or stolen, of which this process's own): their
    difference over an interval is what other processes took."""
    t = psutil.cpu_times()
    busy = sum(getattr(t, f, 0.0) for f in t._fields if f not in ("idle", "iowait", "guest",
                                                                   "guest_nice"))
    own = psutil.Process().cpu_times()
    return busy, own.user + own.system


def _timed_round(step: Any) -> tuple[list[float], float]:
    """``REPEATS`` timed steps (again when their spread says disturbed) and the cores other
    processes used meanwhile."""
    busy0, own0 = others_cpu_s()
    wall0 = time.perf_counter()
    times = sorted(step(_Clock()) for _ in range(REPEATS))
    if times[-1] > NOISY * times[0]:  # disturbed: time it again, keep the fastest of all
        times = sorted(times + [step(_Clock()) for _ in range(REPEATS)])
    busy1, own1 = others_cpu_s()
    wall = max(time.perf_counter() - wall0, 1e-9)
    return times, max(0.0, (busy1 - busy0) - (own1 - own0)) / wall


def _measure(tj: JobSpec, source: Any, cfg: Any) -> HostStep | None:
    # build_real seeds torch's generator: the caller's random stream is left as it was
    with torch.random.fork_rng(devices=[]):
        return _run_tiny(tj, source, cfg)


def _run_tiny(tj: JobSpec, source: Any, cfg: Any) -> HostStep | None:
    from trainfit.engine.step import repeat_batches, train_step
    from trainfit.model.runtime import build_real
    from trainfit.model.source import ModelSource, layer_count
    from trainfit.model.workload import build_model_on_meta, make_batch

    tiny = ModelSource(source.name, cfg, source.task, source.origin, source.note)
    try:
        want = _structure(build_model_on_meta(tj, source)[0])
        wl = build_real(tj, tiny, torch.device("cpu"), init="random")
    except Exception:  # a config the tiny build cannot take: the op-level count stands
        return None
    if _structure(wl.model) != want:
        return None
    batch = make_batch(tiny, 1, tj.seq_len, generator=torch.Generator().manual_seed(0))
    carry: dict[str, Any] | None = {} if tj.hold_outputs else None
    counter = KernelCounter(active=False)  # the clock turns it on for forward + backward

    def step(clock: _Clock) -> float:
        train_step(wl.step_model, wl.optimizer, repeat_batches(batch, 1), grad_accum=1,
                   autocast=wl.autocast, max_grad_norm=None, observer=clock, carry=carry,
                   keep_output=tj.output_in_backward)
        return clock.t1 - clock.t0

    try:
        for _ in range(WARMUP):
            step(_Clock())
        times, busy_cores = _timed_round(step)
        for _ in range(BUSY_ROUNDS - 1):
            if busy_cores <= BUSY_CORES:
                break
            more, more_busy = _timed_round(step)
            if more[0] < times[0]:
                busy_cores = more_busy
            times = sorted(times + more)
        with counter:
            step(_Clock(counter))
    except Exception:  # the tiny step failed where the real one may not: do not guess
        return None
    _, layers = layer_count(tiny)
    return HostStep(fb_s=times[0], spread_s=times[-1] - times[0],
                    kernels=counter.kernels, layers=layers, cpu=cpu_model_name(),
                    busy_cores=busy_cores)
