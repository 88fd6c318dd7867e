"""The benchmarks page's Lightning ``BatchSizeFinder`` section: measured by ``tune_targets.py``
(``lightning_finder.py``) when its results carry a Lightning run, else the project's notes quoted,
labelled so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from readme_format import NOTES, load, med, pct, spread


def _lightning_rows(rows: Any) -> list[dict[str, Any]]:
    return [r for r in rows or [] if (r.get("lightning") or {}).get("status") == "measured"]


def lightning_section(results: Path) -> list[str]:
    """Measured by tune_targets.py when its results carry a Lightning run; else the notes, quoted."""
    rows = load(results, "tune_targets")
    measured = _lightning_rows(rows)
    if not measured:
        return lightning_quoted()
    lt0 = measured[0]["lightning"]
    st = lt0["settings"]
    lines = [
        "### Lightning `BatchSizeFinder`", "",
        f"Measured by `tune_targets.py` (`lightning_finder.py`, Lightning {lt0['lightning_version']}) on the "
        "same jobs, step and memory limit as above: the job's model and optimizer in a `LightningModule` "
        "whose `training_step` runs the same forward and loss, Lightning's loop around it, "
        f"`Tuner(trainer).scale_batch_size(mode=\"{st['mode']}\", init_val={st['init_val']}, "
        f"max_trials={st['max_trials']}, steps_per_trial={st['steps_per_trial']}, margin={st['margin']})` "
        "(Lightning's defaults), no accumulation. Search time = wall seconds of that call (measured). "
        "Its choice, trainfit's pick and accelerate's choice re-measured interleaved in one session "
        "(median tokens/s).", "",
        "| model | effective batch asked | Lightning: batch chosen (largest that ran) | sizes tried | "
        "search time (s) | effective batch kept | tokens/s of its choice | trainfit tune: pick "
        "(micro×accum) | tokens/s of the pick | Lightning / pick | repeat noise (Lightning, pick) | "
        "accelerate: batch, tokens/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lt = r.get("lightning") or {"status": "not run"}
        if lt.get("status") != "measured":
            lines.append(f"| {r['model']} | {r.get('effective_batch', 'n/a')} | {lt.get('status')} |"
                         + " |" * 9)
            continue
        tried = " → ".join(f"{t['batch_size']}{' OOM' if t['status'] == 'oom' else ''}"
                           for t in lt["trials"])
        lt_tps, pk = med(lt["tokens_per_s_remeasured"]), med(lt["pick_tokens_per_s_same_session"])
        ac = med(lt["accelerate_tokens_per_s_same_session"])
        p = r["pick"]
        lines.append(
            f"| {r['model']} | {r['effective_batch']} | {lt['chosen_batch']} "
            f"({lt['largest_batch_that_ran']}) | {tried} | {lt['probe_time_s']:.1f} | "
            f"{'yes' if lt['effective_batch_kept'] else 'no'} | "
            f"{lt_tps:,.0f} | {p['micro_batch']}×{p['grad_accum']} | {pk:,.0f} | {pct(lt_tps / pk, 0)} | "
            f"{pct(spread(lt['tokens_per_s_remeasured']), 0)}, "
            f"{pct(spread(lt['pick_tokens_per_s_same_session']), 0)} | "
            f"{r['accelerate']['chosen_batch']}, {ac:,.0f} |")
    lines += [
        "", "The finder changes `batch_size` and leaves the accumulation as it is: the samples per "
        "optimizer step become the batch it found, whatever the job asked for (a \"yes\" above is its "
        "batch happening to equal the one asked); it never measures speed, and its margin lowers the "
        "largest batch that ran (max(1, int(0.95 × batch))). Lightning runs `training_step` before "
        "`zero_grad`, so the previous step's gradients are alive during its forward (trainfit's step, "
        "which accelerate's finder calls here, frees them at the end of the step); largest batch that "
        "ran under the same limit, Lightning vs accelerate: "
        + ", ".join(f"{r['model']} {r['lightning']['largest_batch_that_ran']} vs "
                    f"{r['accelerate']['chosen_batch']}" for r in measured)
        + " (each trial's peak and its phase: `lightning.trials` in results/tune_targets.json). A "
        f"ratio inside the repeat noise (`{NOTES}`) is not a measured difference."]
    runs = sorted({r["lightning"]["run"] for r in measured if r["lightning"].get("run")})
    lines += [f"\nLightning figures {run}." for run in runs]
    return [*lines, ""]


def lightning_quoted() -> list[str]:
    # no Lightning run in the results (Lightning not installed when tune_targets.py ran): the notes, quoted
    return [
        "### Lightning `BatchSizeFinder`", "",
        "No run of ours in results/tune_targets.json (`pip install -e .[bench]`, then "
        "`python benchmarks/tune_targets.py --lightning-only`). Measured on this machine's kind by the "
        f"project's notes (`{NOTES}`): a GPT-NeoX model of 8.9M parameters, fp32, seq 256, AdamW, 2 threads, "
        "effective batch 16 asked.", "",
        "| finder | wall time (s, measured by the notes) | samples per step chosen | "
        "effective batch 16 kept |",
        "|---|---|---|---|",
        "| Lightning `BatchSizeFinder`, mode power | 149 | 256 | no |",
        "| Lightning `BatchSizeFinder`, mode binsearch | 645 | 287 | no |",
        "| accelerate `find_executable_batch_size`, 1.5 GiB emulated limit | — | 28 (14 sizes tried) | no |",
        "| exhaustive grid (micro × accum × checkpointing, 10 configurations) | ~110 | 16 per step, fastest "
        "varied between repeats | yes |",
        "", "Both finders maximize the samples that fit in one step; neither keeps the effective batch "
        "the job asked for, nor measures speed.", ""]
