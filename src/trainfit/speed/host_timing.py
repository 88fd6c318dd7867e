"""Timing a step's CPU cost on a machine whose speed drifts and that other processes share.

:mod:`trainfit.speed.host` runs one micro-step of the job's code at a tiny width and takes its
CPU time as the host side of the step on a GPU.  Two things move that time on a shared machine
that the step's own code does not, both measured on this 2-core VM
(``benchmarks/host_busy.py``, benchmarks/results/host_busy.md):

* **The machine's own speed.**  With nothing else running, the fastest repeat of the same tiny
  BERT-large step was 51 ms at one moment and 90 ms 20 s later, while the reference loop
  (:func:`reference_op_s`: single autograd-recorded ops) went from 10.3 to 18.9 µs an op — a
  VM's host or its clock, which no load reading shows.  So the step is measured in reference ops
  (the median over repeats of the step's time over the mean of the reference loops timed just
  before and after it: 4,741-5,188 over those runs of 2026-11-28, ±5 % where the seconds moved
  ±28 %; 5,150-6,348 on 2026-11-29, with the VM 1.5-2× slower, and 5,196-6,443 and 5,225-6,334
  timed on one thread later that day: the ratio holds in part) and
  turned into seconds at the machine's reference (:func:`machine_reference_op_s`: the lowest
  median reference of a quiet measurement, cached per CPU, torch and Python) — one conversion
  for every measurement, whenever it was taken.
* **Other processes on the same CPUs.**  One process multiplying matrices on the other core
  raised the step's cost in reference ops 1.9-2.4× (medians) while torch's intra-op pool had 2
  threads, and the reference loop not at all.  Some of the tiny step's ops open an OpenMP
  parallel region, and the load read beside the neighbour (0.64-0.75 cores with the pool, a whole
  core without) is consistent with their joins waiting for the pool's thread on the core the
  neighbour holds; the reference loop's 64-float ops are below the size at which torch's kernels
  parallelise.  The step is now timed on one thread (:func:`trainfit.speed.host.one_thread`: a
  GPU step's ops use no CPU pool either), and the same neighbour left its cost at 0.89-0.97×
  the quiet one (medians; single pairs 0.82-1.14×; benchmarks/results/host_busy.md, two runs
  of 4 pairs per case on 2026-11-29).  A neighbour can still slow a step in ways a ratio does
  not cancel (a shared core's caches, an SMT sibling: not measured here), so the load is still
  read: the CPU time other processes (and a hypervisor's steal) used on the CPUs this process
  may run on while the repeats ran (``psutil.cpu_times``), over at least ``LOAD_WINDOW_S`` (the
  kernel counts in 10 ms ticks): 0.99-1.01 cores beside that neighbour at one thread, 0.00-0.03
  without, so all 8 measurements beside it and none of the 8 without were marked busy in each
  run, at either pool size.  Above ``BUSY_SHARE`` of those CPUs the round is timed again, up to
  ``BUSY_ROUNDS`` rounds; the quiet rounds give the result, and where none was quiet it is
  marked busy (the caller measures it again later and keeps the lower cost: a busy machine only
  adds), and it never sets the machine's reference.
"""

from __future__ import annotations

import hashlib
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

# torch is imported in the functions that use it: doctor's watcher (doctor/watch.py) imports
# this module, and a usage error of doctor or of plan's script front door is said before torch
# loads (~2.5 s)
from trainfit.cache import cache_path, read_json, write_json

REPEATS = 9
"""Timed repeats of a round at least (more until the round has lasted ``LOAD_WINDOW_S``)."""
BUSY_SHARE = 0.125
"""Other processes' CPU use during a round, as a share of the CPUs this process may run on,
above which the round is busy: a quarter of a core on a 2-core machine, where a neighbour
slowed the step 1.9-2.4× while it was timed with torch's pool at 2 threads and not at one
(benchmarks/results/host_busy.md) — kept as a safeguard for what one thread does not remove; on
a larger machine the same share (8 cores of 64) is assumed, not measured."""
LOAD_WINDOW_S = 0.5
"""Shortest wall time a round's load is read over: ``/proc/stat`` counts in 10 ms ticks, so a
stray tick at each end of 0.5 s is 0.04 of a CPU."""
MAX_REPEATS = 400
"""Most repeats a round times to fill ``LOAD_WINDOW_S`` (a step of a few milliseconds)."""
BUSY_ROUNDS = 3
"""Rounds timed while the machine stays busy."""
REFERENCE_OPS = 200
"""Ops of the reference chain timed between repeats (~2-4 ms here)."""
HOST_ENV = "TRAINFIT_HOST_REFERENCE_OP_S"
"""Environment: the training host's reference op in seconds, where ``plan`` runs on another
machine (the benchmarks set :data:`H100_HOST_REFERENCE_OP_S`); unset: this machine's."""
H100_HOST_REFERENCE_OP_S = 18.3e-6
"""The reference op on the H100 host of benchmarks/results/gpu_launch.json (a 2.1 GHz Xeon, torch
2.11, Python 3.12), derived, not measured there: its view op (a dispatcher call, no kernel) took
2.50 µs, and on this CPU the reference loop cost 7.3× a view op (p10-p90 7.0-7.9 over 200
interleaved pairs, benchmarks/results/host_busy.md as of 22d4457) — 18.3 µs; the 2026-11-29
runs' 7.9 and 8.2 (host_busy.md at 1a4e2ff^ and 1a4e2ff) would give 19.8 and 20.5. This VM's own
reference ran at 9-23 µs over one afternoon. The benchmarks read every measured step at this
host's speed, so their numbers depend less on the state this VM was in — not at all only if a
step's cost in reference ops were the same in every state, which it is not: on 2026-11-29
(host_busy.md at 1a4e2ff^) the VM ran the loop at 18.6-38.3 µs and the BERT-large checkpointed
fp16 step at 5,150-6,348 reference ops, where the 2026-11-28 run gave 4,741-5,188
(docs/notes/gpu-measurements.md). On 2026-11-30 another VM (an AMD EPYC, reference loop 6.0-7.1
µs) costed the same step, checkpointed reentrantly as those rows now map, at 3,952 reference ops:
the ratio of a Python-heavy step to the reference loop differs between CPUs by ~25 %, and the
launch-bound V100 rows moved from −25 … −28 % to −8 … −13 % with it
(benchmarks/results/speed_published.md). ``benchmarks/gpu_launch_overhead.py`` now times the
reference loop itself, for the next GPU session."""


@dataclass(frozen=True, kw_only=True)
class Timing:
    """A step timed in rounds (all measured)."""

    step_ops: float
    """The step's CPU cost in reference ops: median over the quiet rounds' repeats (all rounds'
    where none was quiet) of its time over the reference loops' around it."""
    fastest_s: float
    """Fastest repeat, CPU seconds of the thread, as timed (at the machine's speed then)."""
    spread_s: float
    """Slowest − fastest repeat (CPU seconds)."""
    reference_op_s: float
    """Median reference loop of the rounds the cost is taken from, CPU seconds per op."""
    busy_cores: float
    """Other processes' CPU use during the quietest round (cores; 0 where unreadable)."""
    cpus: int


def reference_op_s(n: int = REFERENCE_OPS) -> float:
    """CPU seconds per op of a chain of ``n`` autograd-recorded multiplications of 64 floats and
    its backward: what a Python op costs this thread now (the dispatcher and autograd, no
    arithmetic to speak of — the same loop ``benchmarks/gpu_launch_overhead.py`` times on a GPU
    host as ``backward_per_node``)."""
    import torch

    x = torch.ones(64, requires_grad=True)  # no draw: the caller's random stream is left alone
    t0 = time.thread_time()
    y = x
    for _ in range(n):
        y = y * 1.0001
    y.sum().backward()
    return (time.thread_time() - t0) / n


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on (all of them where the platform has no affinity)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(psutil.cpu_count() or 1))


def others_cpu_s(cpus: list[int]) -> tuple[float, float]:
    """(CPU seconds the CPUs ``cpus`` have been busy or stolen, of which this process's own):
    their difference over an interval is what other processes took.  Linux already counts guest
    time inside user time, and iowait is idle.  Where the per-CPU list does not reach an id in
    ``cpus`` (a container's renumbered ``/proc/stat``), every CPU listed is read."""
    per_cpu = psutil.cpu_times(percpu=True)
    rows = [per_cpu[i] for i in cpus] if cpus and max(cpus) < len(per_cpu) else per_cpu
    busy = sum(getattr(t, f) for t in rows for f in t._fields
               if f not in ("idle", "iowait", "guest", "guest_nice"))
    own = psutil.Process().cpu_times()
    return busy, own.user + own.system


def tree_cpu_s(pid: int) -> float:
    """CPU seconds process ``pid`` and its children used: the live ones', and those of the
    children it has waited for (psutil raises when ``pid`` is gone)."""
    root = psutil.Process(pid)
    t = root.cpu_times()
    own = t.user + t.system + t.children_user + t.children_system
    for child in root.children(recursive=True):
        try:
            c = child.cpu_times()
            own += c.user + c.system
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            pass
    return own


def _load(cpus: list[int], tree_of: int | None = None) -> tuple[float, float] | None:
    try:
        if tree_of is None:
            return others_cpu_s(cpus)
        return others_cpu_s(cpus)[0], tree_cpu_s(tree_of)
    except Exception:  # the load cannot be read: the round counts as quiet (stated: unknown)
        return None


def threads_for_load(window_s: float = 0.5) -> tuple[int, int, float, int] | None:
    """(threads set, threads before, other processes' cores, CPUs) when other processes took
    more than ``BUSY_SHARE`` of this process's CPUs over ``window_s`` (measured) and torch's
    intra-op pool had more threads than the cores left free: the pool is then lowered to those.
    None, and nothing changed, on a quiet host or where ``OMP_NUM_THREADS`` says the user's own
    choice.  Why: a pool of 2 threads on 2 cores beside busy neighbours waits for both at every
    parallel region — a CPU tune of the README's job ran past 15 min under a load of 5-6 (a QA
    run; 94 s quiet), and a neighbour slowed a step 1.9-2.4× at 2 threads, not at one
    (benchmarks/results/host_busy.md)."""
    import torch

    if "OMP_NUM_THREADS" in os.environ:
        return None
    cpus = allowed_cpus()
    meter = LoadMeter(cpus)
    time.sleep(window_s)
    others = meter.cores()
    before = torch.get_num_threads()
    free = max(1, int(len(cpus) - others + 0.5))
    if others <= BUSY_SHARE * len(cpus) or before <= free:
        return None
    torch.set_num_threads(free)
    return free, before, others, len(cpus)


class LoadMeter:
    """The cores other processes used on ``cpus`` from its making to :meth:`cores` (0.0 where
    the load cannot be read): around a timed round here, around a kernel's replay in
    :mod:`trainfit.speed.cpu_kernels`, around a doctor round (doctor/watch.py).  ``tree_of``: the
    process whose tree is not "other" (default: this process alone)."""

    def __init__(self, cpus: list[int], tree_of: int | None = None) -> None:
        self.cpus = cpus
        self.tree_of = tree_of
        self.start = _load(cpus, tree_of)
        self.wall0 = time.perf_counter()
        self.last: tuple[tuple[float, float], float] | None = None

    def sample(self) -> None:
        """Keep a reading now: :meth:`measured` falls back to the last one where the load cannot
        be read at the end — a command's tree is gone by then (an audit: ``doctor -- CMD``
        beside two busy loops measured None and said nothing of them)."""
        got = _load(self.cpus, self.tree_of)
        if got is not None:
            self.last = (got, time.perf_counter())

    def measured(self) -> float | None:
        """As :meth:`cores`, None where the load could not be read (at the start, and now or at
        the last :meth:`sample`)."""
        end, t = _load(self.cpus, self.tree_of), time.perf_counter()
        if end is None and self.last is not None:
            end, t = self.last
        wall = max(t - self.wall0, 1e-9)
        if self.start is None or end is None:
            return None
        # at most the CPUs watched: the counters are read a moment apart from the wall clock,
        # and "2.1 of 2 CPU cores" was printed as measured (an audit)
        return min(max(0.0, (end[0] - self.start[0]) - (end[1] - self.start[1])) / wall,
                   float(len(self.cpus)))

    def cores(self) -> float:
        return self.measured() or 0.0


@dataclass
class Round:
    times: list[float]
    ratios: list[float]
    refs: list[float]
    load: float


def timed_round(step: Callable[[], float], cpus: list[int],
                reference: Callable[[], float] = reference_op_s) -> Round:
    """``REPEATS`` timed steps, more until ``LOAD_WINDOW_S`` has passed, each between two
    reference loops; the cores other processes used meanwhile."""
    meter = LoadMeter(cpus)
    r = Round([], [], [reference()], 0.0)
    while len(r.times) < REPEATS or (time.perf_counter() - meter.wall0 < LOAD_WINDOW_S
                                     and len(r.times) < MAX_REPEATS):
        t = step()
        ref = reference()
        r.times.append(t)
        r.ratios.append(t / max((r.refs[-1] + ref) / 2, 1e-12))
        r.refs.append(ref)
    r.load = meter.cores()
    return r


def time_step(step: Callable[[], float],
              reference: Callable[[], float] = reference_op_s) -> Timing:
    """Rounds of ``step`` (returning its CPU seconds) until one is quiet or ``BUSY_ROUNDS``."""
    cpus = allowed_cpus()
    limit = BUSY_SHARE * len(cpus)
    rounds = [timed_round(step, cpus, reference)]
    while rounds[-1].load > limit and len(rounds) < BUSY_ROUNDS:
        rounds.append(timed_round(step, cpus, reference))
    use = [r for r in rounds if r.load <= limit] or rounds
    times = sorted(t for r in rounds for t in r.times)
    return Timing(step_ops=statistics.median(x for r in use for x in r.ratios),
                  fastest_s=times[0], spread_s=times[-1] - times[0],
                  reference_op_s=statistics.median(x for r in use for x in r.refs),
                  busy_cores=min(r.load for r in rounds), cpus=len(cpus))


def _machine_key() -> str:
    import torch

    from trainfit.speed.cpu import cpu_model_name

    parts = f"{cpu_model_name()}|{torch.__version__}|{platform.python_version()}"
    return hashlib.sha256(parts.encode()).hexdigest()[:24]


def machine_reference_op_s(quiet_s: float | None = None) -> float | None:
    """This machine's reference op (CPU, torch and Python version): the lowest median reference
    of a quiet measurement, kept in the cache directory and lowered by ``quiet_s`` (a quiet
    measurement's; None: read only); ``HOST_ENV`` where set.  None where no quiet measurement
    has been made here.  A measurement's median, not the fastest single loop: one loop in 2,000
    ran 37 % below the median on this VM, and a lowest-ever single value would only creep
    down."""
    import torch

    from trainfit.speed.cpu import cpu_model_name

    given = os.environ.get(HOST_ENV)
    if given:
        try:
            if float(given) > 0:
                return float(given)
        except ValueError:
            pass  # not a number: this machine's, as if unset
    key = _machine_key()
    path = cache_path(f"host_step/reference-{key}.json")
    cached = read_json(path)
    best = cached.get("op_s") if isinstance(cached, dict) else None
    best = best if isinstance(best, float) and best > 0 else None
    if quiet_s is not None and quiet_s > 0 and (best is None or quiet_s < best):
        best = quiet_s
        write_json(path, {"cpu": cpu_model_name(), "torch": torch.__version__,
                          "python": platform.python_version(), "op_s": best})
    return best


def busy_host_note(threads: int, was: int, others: float, cpus: int,
                   command: str = "train") -> str:
    """What :func:`threads_for_load` did to ``command``'s torch (train's run, doctor's rounds),
    said in its notes."""
    alike = "as tune's probes did" if command == "train" else "as train's and tune's do"
    return (f"other processes used {others:.1f} of {cpus} CPU cores when {command} started "
            f"(measured): torch runs at {threads} thread{'s' if threads > 1 else ''} instead of "
            f"{was}, {alike}, so that its parallel regions do not wait on busy "
            "cores (OMP_NUM_THREADS, when you set it, is kept); steps are slower than on a quiet "
            "host")
