"""The search's last stage: the knobs tried one at a time from the best micro-batch (which
candidates each knob gives, the ones its prediction prunes, and each measured against the
current best). A mixin of :class:`trainfit.tune.search.Searcher`, whose probing, budget and
comparisons (``run``, ``over_budget``, ``largest_fitting``, ``better``) it calls. Pure Python,
as the search."""

from __future__ import annotations

from collections.abc import Callable

from trainfit.job import JobSpec, step_precisions
from trainfit.tune.result import SearchNote
from trainfit.tune.trial import Predicted, SearchOptions, Trial, changed_fields


class KnobStage:
    """Stage 3 of :class:`~trainfit.tune.search.Searcher` (its only subclass), which gives the
    state below and the methods these call: ``run``, ``over_budget``, ``largest_fitting``,
    ``better`` and ``_latest_of``."""

    o: SearchOptions
    notes: list[SearchNote]
    cut_candidates: list[str]
    """The changes (``field value, …``) of each candidate the budget cut inside a knob (said in
    the budget note)."""
    predict: Callable[[JobSpec], Predicted | None]
    agree: Callable[[bool], bool]
    run: Callable[..., Trial]
    over_budget: Callable[..., bool]
    largest_fitting: Callable[[JobSpec, list[int]], int | None]
    better: Callable[[Trial, Trial], bool]
    _latest_of: Callable[[JobSpec], Trial]

    def _pruned(self, cand: JobSpec, best: Trial) -> bool:
        pc, pb = self.predict(cand), best.predicted
        known = pc is not None and pb is not None and pc.tokens_per_s and pb.tokens_per_s
        ratio = pc.tokens_per_s / pb.tokens_per_s if known else None  # type: ignore[union-attr]
        # a busy host's kernel times make a prediction slow by an unknown factor (an audit: 68
        # then 311 tokens/s for one configuration): such a rank votes to probe, and says so
        busy = bool(known and (pc.from_busy_timings or pb.from_busy_timings))  # type: ignore[union-attr]
        slow = ratio is not None and ratio < self.o.prune_below
        # the speed model reads kernel rates each rank measured itself (or found cached): near the
        # threshold, or with a rate unknown on one rank only, ranks could decide apart (and then
        # probe apart), so every rank takes part in the decision, whatever it predicted
        if not self.agree(slow and not busy):
            if slow and busy:  # said only where it was probed (another rank may prune it)
                self.notes.append(SearchNote("not_pruned_busy", {
                    "changes": changed_fields(cand, best.job), "ratio": ratio,
                    "prune_below": self.o.prune_below}))
            return False
        self.notes.append(SearchNote("pruned", {"changes": changed_fields(cand, best.job), "ratio": ratio,
                                                "prune_below": self.o.prune_below}))
        return True

    def _eight_bit(self, job: JobSpec, options: list[int]) -> list[JobSpec]:
        """AdamW with 8-bit states (bitsandbytes: 2 B per weight instead of 8): at the same
        micro-batch (faster where the optimizer step is memory-bound), and at the largest larger
        micro-batch the freed memory lets fit (memory probes, as for checkpointing)."""
        if job.sharding in ("zero2", "zero3") and job.offload != "none":
            # accelerate swaps any optimizer for DeepSpeed's CPU Adam under ZeRO-Offload
            self.notes.append(SearchNote("no_8bit_zero_offload"))
            return []
        if job.optimizer != "adamw":
            if not job.optimizer.endswith("8bit"):
                self.notes.append(SearchNote("no_8bit_other_optimizer", {"optimizer": job.optimizer}))
            return []
        if not self.o.bitsandbytes:
            self.notes.append(SearchNote("no_bitsandbytes"))
            return []
        eight = job.replace(optimizer="adamw-8bit")
        bigger = [m for m in options if m > (job.micro_batch or 1)]
        i = self.largest_fitting(eight, bigger) if bigger else None
        return [eight] + ([eight.replace(micro_batch=bigger[i])] if i is not None else [])

    def _loading_is_negligible(self, best: Trial) -> bool:
        """Loader workers move batch loading off the training process: the most they can gain is
        the time that process waited for data. When the best, without workers, waited less than
        the noise floor of its step, a worker probe could only measure noise (and a lucky one
        would pick workers that cost host RAM for nothing), so none is run."""
        m = best.result.measured
        if best.job.num_workers or m is None or m.data_wait_fraction is None:
            return False
        if m.data_wait_fraction >= self.o.noise_floor:
            return False
        self.notes.append(SearchNote("workers_not_probed", {"data_wait_fraction": m.data_wait_fraction,
                                                              "noise_floor": self.o.noise_floor}))
        return True

    def _try_knob(self, knob: str, best: Trial, options: list[int]) -> Trial:
        job = best.job
        if knob == "grad_ckpt":
            if job.grad_ckpt == "full" or job.micro_batch == options[-1]:
                self.notes.append(SearchNote("ckpt_not_needed" if job.grad_ckpt != "full" else "ckpt_kept"))
                return best
            ck = job.replace(grad_ckpt="full")
            bigger = [m for m in options if m > job.micro_batch]
            i = self.largest_fitting(ck, bigger)
            if i is None:
                self.notes.append(SearchNote("ckpt_no_larger"))
                return best
            cands = [ck.replace(micro_batch=bigger[i])]
        elif knob == "precision":
            cands = [job.replace(precision=p) for p in step_precisions(job, self.o.precisions)
                     if p != job.precision]
        elif knob == "attention":
            cands = [job.replace(attention=a) for a in ("sdpa", "eager") if a != job.attention]
        elif knob == "optimizer_impl":
            if job.optimizer not in ("adamw", "sgd"):
                return best
            cands = [job.replace(optimizer_impl=i) for i in ("fused", "foreach")
                     if i != job.optimizer_impl]
        elif knob == "optimizer_8bit":
            cands = self._eight_bit(job, options)
        elif knob == "num_workers":
            if self._loading_is_negligible(best):
                return best
            cands = [job.replace(num_workers=w) for w in self.o.worker_counts if w != job.num_workers]
        elif knob == "loader":
            # only meaningful with loader processes; prefetch deeper, and on a GPU pinned memory
            # (asynchronous host→device copies). persistent_workers is not probed: its gain is the
            # worker restart at an epoch boundary, which short probes never reach (tune sets it
            # on by rule when workers are used and the run has more than one epoch).
            if job.num_workers == 0:
                return best
            deeper = {"prefetch_factor": 4} if job.prefetch_factor < 4 else {}
            pinned = {"pin_memory": True} if self.o.cuda and not job.pin_memory else {}
            tried = (job.replace(**c) for c in (deeper, pinned, {**deeper, **pinned}) if c)
            cands = list({(c.prefetch_factor, c.pin_memory): c for c in tried}.values())
        elif knob == "compile":
            cands = [] if job.compile else [job.replace(compile=True)]
        else:
            raise ValueError(knob)
        for k, c in enumerate(cands):
            if self.over_budget():
                # the candidates the budget cut, named beside the knobs never started (a review:
                # a knob cut after its first candidate was in neither list)
                self.cut_candidates += [", ".join(f"{f} {v}" for f, v in
                                                  changed_fields(cut, job)) for cut in cands[k:]]
                break
            if self._pruned(c, best):
                continue
            t = self.run(c, "knobs", 3)
            if self.better(t, best):
                best = self._latest_of(c)
        return best
