"""The report's train and doctor sections: a train.json's run summarised (how it ended, where its
micro-batch went), a doctor's before/after rows. Pure computation, as build.py."""

from __future__ import annotations

from typing import Any

from trainfit.report.inputs import DoctorInput, TrainInput
from trainfit.report.model import DoctorRow, DoctorSection, TrainSummary
from trainfit.report.settings import setting_label


def build_train(t: TrainInput, slug: str = "train") -> TrainSummary:
    tps = (t.tokens_seen / t.wall_time_s if t.tokens_seen is not None and t.wall_time_s else None)
    mb, ga = t.job.get("micro_batch"), t.job.get("grad_accum")
    return TrainSummary(path=t.path, setting=setting_label(t.job),
                        micro_batch=mb if isinstance(mb, int) else None,
                        grad_accum=ga if isinstance(ga, int) else None, steps=t.steps,
                        samples_seen=t.samples_seen, tokens_seen=t.tokens_seen,
                        wall_time_s=t.wall_time_s, tokens_per_s_measured=tps,
                        final_loss=t.final_loss, oom_events=t.oom_events,
                        checkpoints=t.checkpoints, resumed_from=t.resumed_from,
                        ran_at=_ran_at(t, mb, ga), ended=_ended(t), segments=t.segments,
                        losses=t.losses, evals=t.evals, segment_rows=t.segment_rows, slug=slug,
                        unrecorded_steps=t.unrecorded_steps,
                        ranks=rk if isinstance(rk := t.job.get("ranks"), int) and rk > 1 else 1)


def _ended(t: TrainInput) -> str:
    """train.json's ``stopped`` in words."""
    if t.stopped is None:
        return "not recorded"
    if t.stopped == "interrupted":
        return (f"interrupted ({t.signal or 'a signal'}) after step {t.steps}: resume with "
                "--resume on its directory")
    if t.stopped == "running":
        # written at a checkpoint while the run went on; a run killed outright (SIGKILL, a
        # crash, the power) never rewrites it (an audit read a dead run as "running")
        return (f"running when last written (after step {t.steps}): either the run is still "
                "going, or it was killed before it could record its end (SIGKILL, a crash) — "
                "its last checkpoint resumes it")
    if t.stopped == "failed" and t.failure:
        return f"failed: {t.failure}"
    return t.stopped


def _ran_at(t: TrainInput, mb: Any, ga: Any) -> list[str]:
    """Where the run's micro-batch went after the job's: each OOM split (at its step) and each
    segment's last step, in step order, repeats dropped; empty when it never left the job's."""
    # (step, order, micro, accum): an OOM's step counts the steps done before it, so a split in
    # a resumed segment's first step has the previous segment's end step: the end comes first
    moves: list[tuple[int, int, int, int | None]] = [
        (e.step, 1, e.micro_batch_after, e.grad_accum_after) for e in t.oom_events
        if e.phase != "eval" and e.step is not None and e.micro_batch_after is not None]
    moves += [(s, 0, m, a) for s, m, a in t.segment_ends]
    seq: list[tuple[int, int | None]] = [(mb, ga)]
    for _, _, m, a in sorted(moves, key=lambda x: x[:2]):
        if (m, a) != seq[-1] and not (a is None and m == seq[-1][0]):
            seq.append((m, a))
    return [f"{m} × {'?' if a is None else a}" for m, a in seq[1:]]


DOCTOR_METRICS = (("step time", "s", "step_time_s", 1.0), ("throughput", "tokens/s", "tokens_per_s", 1.0),
                  ("data wait + host→device copy", "% of step", "data_wait_fraction", 100.0),
                  ("GPU utilisation", "%", "gpu_util_percent", 1.0))


def build_doctor(d: DoctorInput, slug: str) -> DoctorSection:
    rows = []
    for metric, unit, key, scale in DOCTOR_METRICS:
        before = d.before.get(key)
        after = d.after.get(key) if d.after else None
        change = None if not before or after is None else after / before - 1
        rows.append(DoctorRow(metric, unit, None if before is None else before * scale,
                              None if after is None else after * scale, change))
    split = [(k.removesuffix("_s").replace("_", " "), v) for k, v in d.split.items() if k != "step_time_s"]
    return DoctorSection(slug=slug, path=d.path, target=d.target, steps_measured=d.steps_measured,
                         split_s=split, step_time_s=d.split.get("step_time_s"), findings=d.findings,
                         rows=rows, applied=d.applied, overhead_fraction=d.overhead_fraction,
                         verdict=d.verdict, verdict_ratios=d.verdict_ratios,
                         verdict_noise=d.verdict_noise, device=d.device,
                         parts_scale=d.parts_scale, notes=list(d.notes),
                         round_bottlenecks=list(d.round_bottlenecks), form=d.form,
                         command_runs=d.command_runs)
