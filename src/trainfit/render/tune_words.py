"""A tuned job in words: the pick, the search's notes and the rounds behind each decision, and
``trainfit tune --json`` — formatted only, as render/words.py does for plan (no number here is
computed)."""

from __future__ import annotations

from typing import Any

from trainfit.tune.result import SearchNote


def optimizer_words(optimizer: str, optimizer_impl: str) -> str:
    """The optimizer as printed: its implementation (fused / foreach) exists for torch's AdamW and
    SGD only."""
    return f"{optimizer_impl} {optimizer}" if optimizer in ("adamw", "sgd") else optimizer


def job_words(j: Any) -> str:
    """A tuned configuration in one line (``j``: a JobSpec)."""
    return (f"micro-batch {j.micro_batch} × accumulation {j.grad_accum} × ranks {j.ranks} "
            f"(effective {j.effective_batch}), {j.precision}, checkpointing {j.grad_ckpt}, "
            f"{j.attention}, {optimizer_words(j.optimizer, j.optimizer_impl)}, "
            f"{j.num_workers} loader workers"
            + (f" (prefetch {j.prefetch_factor}{', pinned' if j.pin_memory else ''})"
               if j.num_workers else "")
            + (", torch.compile" if j.compile else ""))


def _changes(changes: list[tuple[str, Any]]) -> str:
    return ", ".join(f"{k} {v}" for k, v in changes)


def _proposal_words(proposal: float | None) -> str:
    """The ratio of the probes that proposed a candidate, said apart from the rounds: they ran
    at different moments of the search (tune.search.Comparison.proposal)."""
    return "" if proposal is None else f"{proposal:.2f}× when first probed (not a round), then "


def _rounds_words(c: Any) -> str:
    """The proposal, the interleaved rounds and the noise they measured — or why none ran."""
    ended = getattr(c, "ended", None)
    rounds = ", ".join(f"{r:.2f}×" for r in c.ratios)
    if ended == "no_longer_fits":
        rounds = (rounds + "; then " if rounds else "") + "a re-measure ran out of memory"
    elif not rounds:
        rounds = "no interleaved round ran"
    noise = f"; noise {c.noise:.0%}, measured" if c.ratios else ""
    why = getattr(c, "why", None)
    return _proposal_words(getattr(c, "proposal", None)) + rounds + noise + (
        f"; not decided because {why}" if why else "") + _redone_words(getattr(c, "redone", None))


def _redone_words(redone: float | None) -> str:
    """A round measured again (Comparison.redone), said where its rounds are."""
    if redone is None:
        return ""
    return (f" (one more round at {redone:.2f}× was measured again, not counted: one side ran "
            "at under half its own pace in it, the host's doing)")


def _taken_words(d: dict[str, Any]) -> str:
    """A change the interleaved rounds confirmed: its rounds and the noise they beat."""
    noise = d.get("noise")
    return (f"taken: {_changes(d['changes'])} ran "
            + ", ".join(f"{r:.2f}×" for r in d["ratios"])
            + " the tokens/s of the current best in interleaved rounds"
            + (f" (noise measured in this run by then: {noise:.0%})" if noise is not None
               else "")
            + _redone_words(d.get("redone")))


def _after_again(d: dict[str, Any], measured: bool) -> str:
    """What followed a candidate's re-measure (``outlier`` / ``second_look`` notes)."""
    if d.get("dropped"):
        return "; then dropped: no faster than the current best"
    if d.get("not_compared"):
        return ("; faster then, but --budget-s left no time for the interleaved rounds that "
                "decide: the current best was kept")
    return "; then compared in interleaved rounds" if measured else ""


_NOTE_TEXTS: dict[str, Any] = {
    "budget": lambda d: f"--budget-s {d['budget_s']:g} (the search's: its predictions and "
                      "probes; loading the model and data not counted) was spent after "
                      f"{d['spent_s']:.0f} s of search and {d['probes']} "
                      f"probe{'' if d['probes'] == 1 else 's'}: no search probe started after "
                      "that (one reckoned to end past the budget, from the last probe of as "
                      "many steps, is not started; one running finishes; the first probe — of "
                      "your current configuration where given — and the timed probe of the "
                      "largest micro-batch found always run); the best so far is kept"
                      + (f" — not tried: {', '.join(d['untried_knobs'])} (kept as the "
                         "configuration had them; a longer --budget-s, or --knobs, tries them)"
                         if d.get("untried_knobs") else "")
                      + (f" — candidates cut: {'; '.join(d['cut_candidates'])}"
                         if d.get("cut_candidates") else ""),
    "excluded_micro": lambda d: f"micro-batches {', '.join(map(str, d['micro_batches']))} "
                              "excluded: they do not divide the per-rank effective batch "
                              f"{d['per_rank_batch']} (accumulation must be exact)",
    "needs_ckpt": lambda d: "nothing fits without checkpointing: trying with it",
    "nothing_fits": lambda d: "no micro-batch fits, even 1: see `trainfit plan` for the "
                            "memory-saving ladder",
    "outlier": lambda d: (
        f"{_changes(d['changes'])}: its probe ran at {d['first_tokens_per_s']:,.0f} tokens/s, "
        + (f"{d['first_tokens_per_s'] / d['expected_tokens_per_s']:.2f}× "
           if d["expected_tokens_per_s"] else "far below ")
        + "what its prediction gives at the current best's measured pace — the host's, most "
        "likely: measured again"
        + (f" at {d['again_tokens_per_s']:,.0f} tokens/s" if d["again_tokens_per_s"]
           else " (it no longer fit)")
        + _after_again(d, bool(d["again_tokens_per_s"]))),
    "second_look": lambda d: (
        f"{_changes(d['changes'])}: its prediction gives "
        + (f"{d['predicted_ratio']:.2f}×" if d["predicted_ratio"] else "more than")
        + " the current best's tokens/s, its one probe ran "
        + (f"{d['first_ratio']:.2f}×" if d["first_ratio"] is not None else "no faster")
        + " — one probe contradicting the prediction is not enough to drop it: measured again"
        + (f" at {d['again_ratio']:.2f}×" if d["again_ratio"] is not None
           else " (it no longer fit)")
        + _after_again(d, d["again_ratio"] is not None)),
    "pruned": lambda d: f"not probed: {_changes(d['changes'])} — predicted "
                      + (f"{d['ratio']:.2f}×" if d["ratio"] is not None else
                         f"< {d['prune_below']}× (on another rank)")
                      + " the tokens/s of the current best",
    "not_pruned_busy": lambda d: f"probed although predicted at {d['ratio']:.2f}× the current "
                               f"best's tokens/s ({_changes(d['changes'])}; below "
                               f"{d['prune_below']}× it would not be): the prediction rests on "
                               "kernel times measured while other processes used the CPU",
    "no_8bit_other_optimizer": lambda d: f"8-bit AdamW: not tried — the job's optimizer is "
                                       f"{d['optimizer']} (set optimizer: adamw to let tune "
                                       "compare)",
    "no_8bit_zero_offload": lambda d: "8-bit AdamW: not tried — under ZeRO-Offload accelerate "
                                    "steps DeepSpeed's CPU Adam on the host, whatever the "
                                    "optimizer asked",
    "no_bitsandbytes": lambda d: "8-bit AdamW: not tried — bitsandbytes is not installed "
                               "(pip install bitsandbytes)",
    "workers_not_probed": lambda d: "loader workers: not probed — without them the step waited "
                                  f"for data {d['data_wait_fraction']:.2%} of its time "
                                  "(measured), the most workers could gain; below the "
                                  f"{d['noise_floor']:.0%} noise floor",
    "undecided": lambda d: f"could not decide: {_changes(d['changes'])} measured "
                         + _proposal_words(d.get("proposal"))
                         + (", ".join(f"{r:.2f}×" for r in d["ratios"]) or "no round")
                         + " the tokens/s of the current best in interleaved rounds, "
                         + (f"only {len(d['ratios'])} of the {d['rounds']} rounds ran before "
                            "--budget-s ran out (a gain needs all of them, or 2 each beyond "
                            "5× the noise measured in this run by then, "
                            if d.get("budget") and len(d["ratios"]) < d.get("rounds", 0)
                            else "noise measured in this run by then (")
                         + f"{d['noise']:.0%}, measured)"
                         + (f": {d['why']}" if d.get("why") else "")
                         + _redone_words(d.get("redone"))
                         + "; kept the simpler configuration",
    "script_precision": lambda d: f"precision: not probed on this script — its {d['method']} "
                                f"trainer's weights load in {d['dtype']}, a dtype a probe "
                                "cannot change on a loaded model (precision is probed as "
                                "autocast on full fine-tuning of float32 weights)",
    "knob_fixed": lambda d: f"{d['knob']}: not searched — the command line set it, so it "
                          "is kept as "
                          + ", ".join(f"{f} {v}" for f, v in zip(d["fields"], d["values"],
                                                                 strict=True)),
    "knob_unsupported": lambda d: f"{d['knob']}: not searched — the model does not support it "
                                + ("(transformers has no SDPA implementation of it: its eager "
                                   "attention runs)" if d["knob"] == "attention" else
                                   "(its module has no gradient_checkpointing_enable)"),
    "contradicted": lambda d: _contradicted_words(d),
    "redone": lambda d: _taken_words(d),
    "taken": lambda d: _taken_words(d),
    "not_compared": lambda d: f"not decided: {_changes(d['changes'])} ran "
                            + (f"{d['ratio']:.2f}× " if d["ratio"] else "")
                            + "the tokens/s of the current best on its one probe (not a "
                            "round); --budget-s left no time for the interleaved rounds that "
                            "decide, so the current best was kept",
    "unsteady": lambda d: "timings unsteady: one configuration's probes in this run lie "
                        f"{d['spread']:.1f}× apart (fastest ÷ slowest, measured), so a "
                        "single probe may be the host's, not the configuration's"
                        + ("; dropped on one probe no faster than the current best, so not "
                           "shown slower: " + "; ".join(f"{_changes(c)} ({r:.2f}×)"
                                                        for c, r in d["one_probe"])
                           if d["one_probe"] else "")
                        + " — rerun tune when the machine is quieter",
    "one_probe": lambda d: "dropped on one probe (not a round) no faster than the current "
                         "best: " + "; ".join(f"{_changes(c)} ({r:.2f}×)"
                                              for c, r in d["one_probe"])
                         + " — a change is taken only after every interleaved round shows it "
                         "faster, and dropped on one timed probe that is not"
                         + (" (this run's repeats of one configuration stayed within "
                            f"{d['unsteady_spread']:g}× of each other)"
                            if d.get("unsteady_spread") else
                            " (no configuration was timed twice: how steady this run was is "
                            "not known)"),
    "ckpt_not_needed": lambda d: "checkpointing: not tried — the largest micro-batch already "
                               "fits without it, and recomputation only costs time",
    "ckpt_kept": lambda d: "checkpointing: kept on (nothing fits without it)",
    "ckpt_no_larger": lambda d: "checkpointing: no larger micro-batch fits with it",
    "host_busy": lambda d: f"the host was busy while probing (load average {d['load_1min']:.1f} "
                         f"on {d['cores']} cores, measured): timings are slower and noisier "
                         "than on an idle machine; memory is not affected",
    "threads_for_load": lambda d: (
        f"other processes used {d['others']:.1f} of {d['cpus']} CPU cores when tune started "
        f"(measured): the probes ran torch at {d['threads']} thread"
        f"{'s' if d['threads'] > 1 else ''} instead of {d['was']}, so that its parallel "
        "regions do not wait on busy cores (OMP_NUM_THREADS, when you set it, is kept)"),
    "cpu_peaks": lambda d: "CPU: peak = live tensor bytes (the quantity of torch.cuda.max_memory_"
                         "allocated); reserved/device do not exist on CPU (null)",
    "persistent_workers": lambda d: "persistent_workers: on by rule (loader workers are used; "
                                  "keeping them saves their restart at every epoch boundary, "
                                  "which short probes never reach)",
}
"""Each search note's sentence, by its kind (``d``: the note's data)."""


def _contradicted_words(d: dict[str, Any]) -> str:
    """A candidate dropped in the rounds: a round that contradicted its proposal, or a re-measure
    that no longer fit (before any round: no ratio to state — a review read "then no round the
    tokens/s …")."""
    head = f"dropped: {_changes(d['changes'])} ran " + _proposal_words(d.get("proposal"))
    if not d["ratios"]:
        return head + "its re-measure no longer fit; kept the current best"
    rounds = ", ".join(f"{r:.2f}×" for r in d["ratios"])
    why = ("; a re-measure no longer fit" if d.get("ended") == "no_longer_fits" else
           ": a round contradicted the gain, so no more rounds could confirm it")
    return (head + rounds + " the tokens/s of the current best in interleaved rounds" + why
            + _redone_words(d.get("redone")) + "; kept the current best")


def note_words(n: SearchNote) -> str:
    """One thing the search decided not to do, or did by rule, and why."""
    return _NOTE_TEXTS[n.kind](n.data)


def tune_reason(pick_job: Any, pick_tokens_per_s: float | None, baseline_job: Any | None,
                vs_baseline: Any | None, notes: list[SearchNote],
                unconfirmed_job: Any | None = None) -> str:
    """The pick in words, against the user's current configuration when one was measured
    (``vs_baseline``: the interleaved re-measurement, a Comparison; ``unconfirmed_job``: the
    search's best when those rounds did not confirm it, the current configuration then kept)."""
    if pick_job is None:
        if any(n.kind == "budget" for n in notes) and \
                not any(n.kind == "nothing_fits" for n in notes):
            # the budget stopped the search before any micro-batch was measured to fit: not
            # "nothing fits"
            return "nothing measured to fit within the budget: " + \
                "; ".join(note_words(n) for n in notes)
        return "nothing fits: " + "; ".join(note_words(n) for n in notes)
    s = job_words(pick_job) + f": measured {pick_tokens_per_s or 0:,.0f} tokens/s"
    if baseline_job is None or vs_baseline is None or \
            not (vs_baseline.ratios or vs_baseline.proposal is not None):
        return s
    # the pick may change more than the micro-batch (checkpointing, attention): the ratio is
    # against the whole configuration (a QA run read "× your current micro-batch" for all three)
    current = (f"your current configuration (micro-batch {baseline_job.micro_batch} × "
               f"{baseline_job.grad_accum})")
    ratios = _rounds_words(vs_baseline)
    if unconfirmed_job is not None:
        return (f"{current} kept ({s}): the search's best, {job_words(unconfirmed_job)}, was not "
                f"confirmed faster in interleaved rounds (its tokens/s over yours: {ratios})")
    if vs_baseline.verdict == "faster":
        # the median of the rounds, each measuring both back to back: not the table's probes,
        # which ran at other moments of the search (an audit: 1.94× beside probes 1.71× apart)
        return s + (f", {vs_baseline.median:.2f}× {current} (the median of "
                    f"{len(vs_baseline.ratios)} interleaved rounds, each measuring both back to "
                    f"back: {', '.join(f'{r:.2f}×' for r in vs_baseline.ratios)}"
                    f"{_redone_words(getattr(vs_baseline, 'redone', None))}; the table's probes "
                    "ran at other moments)")
    cut = any(n.kind == "budget" for n in notes) and vs_baseline.verdict == "undecided"
    why = "; --budget-s stopped the rounds; kept as the search's best" if cut else ""
    return s + f"; against {current}: no speed-up this run could confirm ({ratios}{why})"


TUNE_NOTES = ("tokens/s counts positions computed (micro × seq_len × accumulation × ranks / step)",
              "loss is token-weighted over the effective batch (exact for any micro-batch split)")
PADDING_FREE_TUNE_NOTES = (
    "tokens/s counts micro × seq_len positions per micro-batch, the most its padding-free row "
    "can hold (it holds the samples' own tokens, unpadded) (micro × seq_len × accumulation × "
    "ranks / step)", TUNE_NOTES[1])
"""A padding-free pick's conventions: a packed row holds the samples' own tokens, no padding."""
SCRIPT_TUNE_NOTES = (
    "tokens/s counts the non-padding tokens of the script's own batches (the same samples in "
    "every probe's timed steps), measured and predicted alike (the predicted step's time over "
    "those tokens)",
    "the loss is the trainer's own compute_loss, each micro-batch's divided by the accumulation; "
    "the memory probe runs the dataset's longest samples")


def tune_pick_reason(result: Any) -> str:
    """``result``: a TuneResult."""
    def tps(trial: Any) -> float | None:
        m = trial.result.measured if trial is not None else None
        return None if m is None else m.tokens_per_s
    return tune_reason(result.pick.job if result.pick else None, tps(result.pick),
                       result.baseline.job if result.baseline else None, result.vs_baseline,
                       [n for n in result.notes if n.kind not in RULE_KINDS],
                       result.unconfirmed.job if result.unconfirmed else None)


RULE_KINDS = ("host_busy", "threads_for_load", "cpu_peaks", "persistent_workers")
"""Notes tune states around the search (not reasons a search found nothing)."""


def tune_notes(result: Any) -> list[str]:
    """Every note of a TuneResult in words: the data's, the search's, then the conventions."""
    search = [note_words(n) for n in result.notes if n.kind not in RULE_KINDS]
    rules = [note_words(n) for n in result.notes if n.kind in RULE_KINDS]
    conventions = SCRIPT_TUNE_NOTES if getattr(result, "step_source", "job") == "script" \
        else TUNE_NOTES
    pick = getattr(result, "pick", None)
    if pick is not None and getattr(pick.job, "padding_free", False) and conventions is TUNE_NOTES:
        conventions = PADDING_FREE_TUNE_NOTES
    return [*result.data_notes, *search, *conventions, *rules]


SPEED_RATIO_SAID_OUTSIDE = 1.5
"""The probes' median measured ÷ predicted tokens/s outside 1/1.5 … 1.5 gets a note (the CPU
model's median error is 20 %, benchmarks/results/speed_cpu.md)."""


def speed_ratio_note(probes: list[dict[str, Any]], device: str, step_source: str) -> str | None:
    """How far the probes' measured tokens/s sit from the predicted, where that is far: a CPU
    tune of a script read 0.25-0.4× on every probe, with no remark (a QA run)."""
    import statistics

    ratios = [p["measured"]["tokens_per_s"] / p["predicted"]["tokens_per_s"] for p in probes
              if p.get("status") == "ok" and (p.get("measured") or {}).get("tokens_per_s")
              and (p.get("predicted") or {}).get("tokens_per_s")]
    if not ratios:
        return None
    r = statistics.median(ratios)
    if 1 / SPEED_RATIO_SAID_OUTSIDE <= r <= SPEED_RATIO_SAID_OUTSIDE:
        return None
    beyond = ("the script's trainer around the step (its collation, callbacks and logging), which "
              "the prediction leaves out" if step_source == "script" else
              "what runs around the step on this device")
    where = (" the speed model is a GPU's; on a CPU it was within 20 % (median) of trainfit's "
             "own steps of small models (benchmarks/results/speed_cpu.md):" if device == "cpu"
             else "")
    return (f"measured tokens/s are {r:.2f}× the predicted (median of {len(ratios)} probes):"
            f"{where} the gap is {beyond}; tune's choice rests on the measurements, not on the "
            "prediction")


def tune_json(result: Any) -> dict[str, Any]:
    """``trainfit tune --json``: the typed result, with its sentences beside it."""
    d = result.to_dict()
    gap = speed_ratio_note(d["probes"], str(d.get("device")),
                           getattr(result, "step_source", "job"))
    d.update(reason=tune_pick_reason(result), notes=tune_notes(result) + ([gap] if gap else []))
    return d
