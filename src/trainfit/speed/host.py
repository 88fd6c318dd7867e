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
thread's CPU time, in units of a reference op and turned into seconds at this machine's
reference or a given host's: :mod:`trainfit.speed.host_timing`), its kernels counted as the
simulation counts them.  At such widths a kernel's CPU
arithmetic is ~1 µs, so the time is the host's.  On a GPU each kernel also pays its launch
(``LAUNCH_S``), and ops the tiny fp32 run does not have (autocast's casts, 4-bit dequantization)
pay the roofline's per-op cost (:meth:`HostStep.host_s`).  The prediction takes the larger of
that and the op-level count, so measuring can only add host time the op count misses.

Assumed and stated: the machine that plans is as fast per Python op as the one that trains (true
when ``plan`` runs on the training machine; otherwise ``TRAINFIT_HOST_REFERENCE_OP_S`` gives the
training host's reference op — this VM's view op ran at 2.6 µs one day and 1.4 µs another, the
H100 host's at 2.5, ``benchmarks/gpu_launch_overhead.py``). Timed on one intra-op thread
(:func:`one_thread`): with torch's pool at 2 threads, a simulation or another process on the
other core raised a step's CPU time 2-4× (the figures at one thread:
:mod:`trainfit.speed.host_timing`); a step that runs on this CPU (tune's CPU target) is timed
with the pool, which its ops do use. ``plan`` still measures its groups one after the other in
one worker. The machine's drifting speed and other processes on its CPUs are
:mod:`trainfit.speed.host_timing`'s: a measurement whose every round was busy is kept but marked
(:attr:`HostStep.busy`), measured again by the next ``plan``'s host phase (the lower cost kept: a
busy machine only adds), and ``plan`` says so beside its launch-bound rows.

Not measured (the op-level count stands): ``torch.compile`` (no eager Python per op), models
built by a user's factory (no config to shrink), state-space layers and mixtures of experts
(their CPU paths are arithmetic, not the CUDA kernels' Python), a shrunk model whose module
classes differ from the original's.  Measured without: activation offloading's saved-tensor
hooks, bitsandbytes' own Python (a QLoRA job runs as its LoRA twin; the dequantization kernels
pay the op-level cost), FSDP's and DDP's hooks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import platform
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from trainfit.cache import cache_path, read_json, write_json
from trainfit.job import JobSpec
from trainfit.job.choices import SGD_MOMENTUM
from trainfit.speed.cpu import cpu_model_name
from trainfit.speed.host_timing import BUSY_SHARE, machine_reference_op_s, time_step
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
WARMUP = 2
CACHE_VERSION = 7
"""5: measurements are in reference ops (with the median reference of their quiet rounds) and
carry the load they were timed under (:mod:`trainfit.speed.host_timing`); 6: timed on one
intra-op thread (:func:`one_thread`); 7: the empty-family ops launch no kernel
(:data:`trainfit.speed.ops.ALLOCATING_ONLY`), so the kernel counts changed; older ones are
measured again."""

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
    """CPU seconds of the thread for one micro-step at this machine's unhindered speed
    (``step_ops`` × :func:`~trainfit.speed.host_timing.machine_reference_op_s`; measured): the
    code path's own cost."""
    spread_s: float
    """Slowest − fastest of the timed repeats (measured noise, CPU seconds as timed)."""
    kernels: int
    """Kernels (aten ops with an output in new storage) of that micro-step."""
    layers: int
    cpu: str
    step_ops: float = 0.0
    """The micro-step's cost in reference ops (measured; 0: not measured so, ``fb_s`` as given)."""
    fastest_s: float = 0.0
    """The fastest repeat as timed (CPU seconds, at the machine's speed then)."""
    reference_op_s: float = 0.0
    """The median reference op of the measurement's quiet rounds (CPU seconds)."""
    busy_cores: float = 0.0
    """CPU time other processes (and a hypervisor's steal) used on this process's CPUs while
    the quietest round ran, per second of it (measured, cores)."""
    cpus: int = 1
    """CPUs this process may run on (its affinity)."""

    @property
    def busy(self) -> bool:
        """Every round was timed while other processes took more than ``BUSY_SHARE`` of the
        CPUs: the cost may be a busy machine's (too high)."""
        return self.busy_cores > BUSY_SHARE * self.cpus

    def at_machine_speed(self) -> HostStep:
        """``fb_s`` at this machine's reference op (:func:`~trainfit.speed.host_timing.
        machine_reference_op_s`, which a quiet measurement may lower), so measurements taken
        while the machine ran at different speeds are read alike."""
        if self.step_ops <= 0 or self.reference_op_s <= 0:
            return self
        ref = machine_reference_op_s(None if self.busy else self.reference_op_s)
        return dataclasses.replace(self, fb_s=self.step_ops * (ref or self.reference_op_s))

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
    as at the job's length (its Python loops once per chunk); flash-attention-2 as ``sdpa``
    (the model it builds on this CPU, and what the cache key says: an fp32 flash-attention-2
    job is refused, which left every such plan without its host measurement, a review); a
    padded job's one row with its mask (``always``: the mask-building and k/v-repeating code the
    job's rows run; a review), as a packed row is timed with its own."""
    chunk = max(1, -(-tokens // head_chunks(job))) if job.lm_head_chunk else None
    lora = {"method": "lora", "lora_dropout": 0.0} if job.method in ("lora", "qlora") else {}
    return dataclasses.replace(
        job, precision="fp32", **lora, quant=None, micro_batch=1, grad_accum=1,
        effective_batch=None, seq_len=tokens, ranks=1, sharding="none", offload="none",
        zero_reduce_bucket=None, zero_prefetch_bucket=None,
        compile=False, activation_offload=False, fsdp_frozen_grads=False, fsdp_no_sync=False,
        lm_head_chunk=chunk, data=None, optimizer="adamw", optimizer_impl="foreach",
        # SGD's momentum goes with SGD (JobSpec refuses it on AdamW: an HF optim="sgd" job's 0
        # had lost its host measurement, a review)
        sgd_momentum=SGD_MOMENTUM,
        kbit_prepared=False,
        attention="sdpa" if job.attention == "flash-attention-2" else job.attention,
        padded="always" if job.padded != "none" else "none")


_JOB_KEYS = ("method", "lora_dropout", "lora_targets", "grad_ckpt", "optimizer_in_backward",
             "hold_outputs", "output_in_backward", "fp32_outputs", "lm_head_chunk",
             "trl_logprob_head", "seq_len", "padded",
             "trust_remote_code")
"""The tiny job's fields that change the step's Python (its rank does not: the ladder's rank-8
rung reads the same measurement; SDPA's kernel choices all build as ``sdpa``).  A packed row
(``JobSpec.packs_rows``) is keyed apart: it builds a mask and expands k and v."""


def _key(job: JobSpec, cfg: Any, task: str, threads: int = 1) -> str:
    import peft
    import transformers

    parts = {"v": CACHE_VERSION, "cpu": cpu_model_name(), "torch": torch.__version__,
             "python": platform.python_version(),
             "transformers": transformers.__version__, "peft": peft.__version__, "task": task,
             "config": cfg.to_json_string(use_diff=False),
             "attention": "eager" if job.attention == "eager" else "sdpa", "threads": threads,
             "job": {k: getattr(job, k) for k in _JOB_KEYS}}
    if job.masks_packing:  # only then: the other keys kept
        parts["packed"] = True
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


_MEMO: dict[str, HostStep | None] = {}
SWITCH = "TRAINFIT_HOST_MEASURE"
"""``0`` in the environment: no measurement, the op-level count alone (the test suite's
default: its speed numbers then do not depend on this machine's timing)."""


def host_step(job: JobSpec, source: Any, again: bool = False,
              pool: bool = False) -> HostStep | None:
    """The measured host time of one micro-step of ``job`` (None where it is not measured: see
    the module docstring).  Measured once per code path and kept in the cache directory;
    ``again``: a cached busy machine's measurement is measured once more — only by a caller that
    measures alone (plan's host phase), not beside its simulations.  ``pool``: timed with torch's
    intra-op pool as the caller has it, for a step that runs on this CPU (its ops do open the
    pool's parallel regions); otherwise on one thread, as a GPU step's host side
    (:func:`one_thread`).  Never raises: a path it cannot measure keeps the op-level count."""
    if os.environ.get(SWITCH) == "0" or job.compile or source.task == "custom-lm":
        return None
    try:
        return _host_step(job, source, again, pool)
    except Exception:  # an unforeseen config or job: the op-level count stands, plan goes on
        return None


def _host_step(job: JobSpec, source: Any, again: bool, pool: bool = False) -> HostStep | None:
    if getattr(source, "composite", None) is not None:
        # a multimodal model's text step runs its language model alone (the towers take no
        # part): timed as the language model, without building a tower on this CPU
        source = dataclasses.replace(source, composite=None)
    cfg = shrunk_config(source.config)
    if cfg is None or _first_int(cfg, _EXPERTS)[1]:
        # mixture of experts: on a CPU the experts' grouped matmuls fall back to a loop of
        # matmuls and the routed tokens are real arithmetic (a 128-expert tiny run: 1.7 s of
        # compute for 0.09 s of ops), so the time would not be the host's
        return None
    tj = tiny_job(job, max(TOKENS, head_chunks(job)))
    threads = torch.get_num_threads() if pool else 1
    key = _key(tj, cfg, source.task, threads)
    if key in _MEMO:  # the measurement as taken; read at the machine's reference now
        return None if _MEMO[key] is None else _MEMO[key].at_machine_speed()
    path = cache_path(f"host_step/{key[:32]}.json")
    cached = read_json(path)
    hs: HostStep | None
    if isinstance(cached, dict) and cached.get("key") == key:
        hs = None if cached.get("none") else HostStep(**cached["step"])
        if hs is not None and hs.busy and again:  # a busy machine's: once more, the lower kept
            hs = merged(hs, _measure(tj, source, cfg, pool))
            _write(path, key, hs)
    else:
        hs = _measure(tj, source, cfg, pool)
        _write(path, key, hs)
    _MEMO[key] = hs
    return None if hs is None else hs.at_machine_speed()


def merged(old: HostStep, new: HostStep | None) -> HostStep:
    """Two measurements of one code path: the lower cost (a busy machine only adds to it), and
    the load of the quieter one (busy only if both were)."""
    if new is None:
        return old
    low = new if new.step_ops < old.step_ops else old
    quiet = min((old, new), key=lambda h: h.busy_cores / max(h.cpus, 1))
    return dataclasses.replace(low, busy_cores=quiet.busy_cores, cpus=quiet.cpus)


def _write(path: Any, key: str, hs: HostStep | None) -> None:
    write_json(path, {"key": key, "none": hs is None,
                      "step": None if hs is None else dataclasses.asdict(hs)})


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch's intra-op pool at one thread while the tiny step is timed; the caller's thread
    count restored afterwards, also on an exception.

    Why: on a GPU the step's ops are CUDA kernels, and no CPU thread pool takes part in them.  On
    the CPU some of the tiny step's ops still open an OpenMP parallel region (fork, then a join
    that waits for every thread of the pool), and beside another process the pool's join made
    the step cost ~2× (measured: :mod:`trainfit.speed.host_timing`, "Other processes on the same
    CPUs"; benchmarks/results/host_busy.md; quiet, the two pool sizes differed by no more than
    the noise there).  Not for a step that runs on this CPU: its ops do use the pool
    (``host_step(..., pool=True)``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _measure(tj: JobSpec, source: Any, cfg: Any, pool: bool = False) -> HostStep | None:
    # build_real seeds torch's generator: the caller's random stream is left as it was
    with torch.random.fork_rng(devices=[]), \
            contextlib.nullcontext() if pool else one_thread():
        return _run_tiny(tj, source, cfg)


def _run_tiny(tj: JobSpec, source: Any, cfg: Any) -> HostStep | None:
    from trainfit.engine.step import repeat_batches, train_step
    from trainfit.model.batch import make_batch
    from trainfit.model.runtime import build_real
    from trainfit.model.source import layer_count
    from trainfit.model.workload import build_model_on_meta

    tiny = dataclasses.replace(source, config=cfg, composite=None)
    try:
        want = _structure(build_model_on_meta(tj, source)[0])
        wl = build_real(tj, tiny, torch.device("cpu"), init="random")
    except Exception:  # a config the tiny build cannot take: the op-level count stands
        return None
    if _structure(wl.model) != want:
        return None
    # a packed row is timed with its mask (two documents in the one sample: the mask-building
    # and k/v-expanding code of the rows that have one; a review)
    batch = make_batch(tiny, 1, tj.seq_len, generator=torch.Generator().manual_seed(0),
                       packed=tj.masks_packing, padded=tj.padded)
    carry: dict[str, Any] | None = {} if tj.hold_outputs else None
    counter = KernelCounter(active=False)  # the clock turns it on for forward + backward

    def step(clock: _Clock) -> float:
        train_step(wl.step_model, wl.optimizer, repeat_batches(batch, 1), grad_accum=1,
                   autocast=wl.autocast, max_grad_norm=None, observer=clock, carry=carry,
                   keep_output=tj.output_in_backward)
        return clock.t1 - clock.t0

    def timed() -> float:
        return step(_Clock())

    try:
        for _ in range(WARMUP):
            timed()
        t = time_step(timed)
        with counter:
            step(_Clock(counter))
    except Exception:  # the tiny step failed where the real one may not: do not guess
        return None
    if t.step_ops <= 0 or t.reference_op_s <= 0:  # a clock too coarse to time the reference
        return None
    _, layers = layer_count(tiny)
    return HostStep(fb_s=t.step_ops * t.reference_op_s, spread_s=t.spread_s,
                    kernels=counter.kernels, layers=layers, cpu=cpu_model_name(),
                    step_ops=t.step_ops, fastest_s=t.fastest_s, reference_op_s=t.reference_op_s,
                    busy_cores=t.busy_cores, cpus=t.cpus)
