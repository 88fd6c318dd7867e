"""How much the allocator's reserve grows when micro-batches are padded to different lengths.

plan simulates a step whose micro-batches all have the job's ``seq_len``: packed data, or
padded data at its longest batch.  A loop that pads each batch to its own longest sample
(torchtune 0.1's ``padded_collate``, transformers' ``DataCollatorWithPadding``) asks the caching
allocator for blocks of a new size at every length; a freed block is reused only by a request it
can hold, so blocks cached at one length can sit idle at the next and ``max_memory_reserved``
climbs above the fixed-length step's.  The allocated peak does not move (the longest batch sets
it).

This replays that on the held-out cases that are padded per batch, accumulate gradients and
compare ``max_memory_reserved`` (torchtune 0.1's alpaca runs, heldout_memory.json): the step of
each case is simulated at full size with ``MICRO_STEPS`` micro-batches, once all at the cap and
once per order of a length schedule (fractions of the cap; the real length distribution of
Alpaca is not read here, no dataset is reachable), and each trace is replayed through the
allocator model (src/trainfit/memory/allocator.py).  Shuffled orders are what a shuffled epoch
gives; ascending is a bad case (every new length is the longest yet).

Run: ``python benchmarks/variable_length.py [--workers 2]`` (about 10 min on 2 cores)
→ results/variable_length.{json,md}.  Nothing in plan reads these figures.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

DATA = ROOT / "data" / "heldout_memory.json"
OUT = ROOT / "results"
GIB = 2**30
CASES = ("torchtune011_readme_llama2-7b_lora_1x4090", "torchtune011_readme_llama2-7b_qlora_1x4090",
         "torchtune011_readme_llama2-7b_lora_2x4090_fsdp")
"""Padded per batch (alpaca, capped at 512), accumulating, compared on the reserved peak."""
TWINS = {"torchtune011_readme_llama2-7b_lora_1x4090": "torchtune01_tutorial_llama2-7b_lora_1dev",
         "torchtune011_readme_llama2-7b_qlora_1x4090": "torchtune01_tutorial_llama2-7b_qlora_1dev"}
"""Cases of the same job published elsewhere (torchtune 0.1's tutorials): the same replay, their
own measurement (checked equal as mapped in :func:`run_one`)."""
MICRO_STEPS = 12
FRACTIONS = (1.0, 0.9, 0.75, 0.6, 0.45, 0.3, 0.2)
"""Lengths of the schedule as fractions of the cap."""
ORDERS = ("fixed", "shuffled-0", "shuffled-1", "ascending")


def lengths_for(order: str, cap: int) -> list[int]:
    """``MICRO_STEPS`` lengths ending at the cap (so every order reaches the same allocated peak).
    ``fixed``: all at the cap; ``shuffled-N``: drawn from :data:`FRACTIONS` with seed N;
    ``ascending``: the same draw as seed 0, sorted."""
    if order == "fixed":
        return [cap] * MICRO_STEPS
    rng = random.Random(0 if order == "ascending" else int(order.split("-")[1]))
    drawn = [max(1, int(cap * rng.choice(FRACTIONS))) for _ in range(MICRO_STEPS - 1)]
    return (sorted(drawn) if order == "ascending" else drawn) + [cap]


def run_one(item: tuple[str, str]) -> dict[str, Any]:
    """One (case, order): the step's trace with its micro-batches' lengths, replayed."""
    case_id, order = item
    warnings.filterwarnings("ignore")
    from heldout_mapping import map_case
    from heldout_models import build_source
    from trainfit.job import JobSpec
    from trainfit.memory.allocator import replay
    from trainfit.memory.simulate import simulate_step
    from trainfit.model.batch import make_batch

    cases = {c["id"]: c for c in json.loads(DATA.read_text())["cases"]}
    case = cases[case_id]
    mapping = map_case(case)
    twin = TWINS.get(case_id)
    if twin is not None and map_case(cases[twin]).job != mapping.job:
        raise ValueError(f"{twin} is not mapped to the same job as {case_id}")
    job = JobSpec(**mapping.job).replace(grad_accum=MICRO_STEPS)
    source, _ = build_source(mapping)
    lengths = lengths_for(order, job.seq_len)
    t0 = time.perf_counter()
    sim = simulate_step(job, source, record_events=True, batch_fn=lambda: [
        make_batch(source, job.micro_batch or 1, n) for n in lengths])
    rep = replay(sim.events, sim.event_streams)
    return {"id": case_id, "order": order, "lengths": lengths,
            "allocated_bytes": rep.peak_allocated_bytes, "reserved_bytes": rep.peak_reserved_bytes,
            "measured_bytes": case["measured"]["peak_memory_bytes"],
            "twin_measured_bytes": None if twin is None else
            cases[twin]["measured"]["peak_memory_bytes"],
            "sim_time_s": time.perf_counter() - t0}


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for cid in CASES:
        mine = {r["order"]: r for r in rows if r["id"] == cid}
        if "fixed" not in mine:
            continue
        fixed = mine["fixed"]["reserved_bytes"]
        for order in ORDERS[1:]:
            r = mine.get(order)
            if r is None:
                continue
            out.append({"id": cid, "order": order, "fixed_reserved_bytes": fixed,
                        "reserved_bytes": r["reserved_bytes"],
                        "growth_bytes": r["reserved_bytes"] - fixed,
                        "growth": r["reserved_bytes"] / fixed - 1,
                        "allocated_moved_bytes": r["allocated_bytes"]
                        - mine["fixed"]["allocated_bytes"],
                        "measured_bytes": r["measured_bytes"],
                        "twin": TWINS.get(cid), "twin_measured_bytes": r["twin_measured_bytes"]})
    return out


def render(summary: list[dict[str, Any]], wall_s: float) -> str:
    lines = [
        "# Reserve growth with micro-batches padded to different lengths", "",
        "Regenerate: `python benchmarks/variable_length.py` (no GPU). Each case's step simulated at "
        f"full size with {MICRO_STEPS} micro-batches — all at the cap, or lengths drawn from "
        f"{', '.join(f'{f:g}' for f in FRACTIONS)} × the cap (shuffled: seeds 0 and 1; ascending: "
        "seed 0's draw sorted), the last at the cap — and replayed through trainfit's model of "
        "the CUDA caching allocator. The allocated peak is the same in every order (the longest "
        "batch sets it); the reserved peak is what moves. Measured: the case's published "
        "`max_memory_reserved` (heldout_memory.json).", "",
        f"Wall time: {wall_s / 60:.1f} min.", "",
        "| case | order | reserved, all at the cap (GiB) | reserved, lengths varied (GiB) "
        "| growth | allocated moved (GiB) | measured (GiB) |",
        "|---|---|---|---|---|---|---|"]
    for s in summary:
        measured = f"{s['measured_bytes'] / GIB:.2f}"
        if s["twin"]:
            measured += f" (tutorial: {s['twin_measured_bytes'] / GIB:.2f})"
        lines.append(
            f"| {s['id']} | {s['order']} | {s['fixed_reserved_bytes'] / GIB:.2f} | "
            f"{s['reserved_bytes'] / GIB:.2f} | {s['growth']:+.1%} | "
            f"{s['allocated_moved_bytes'] / GIB:+.2f} | {measured} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    items = [(c, o) for c in CASES for o in ORDERS]
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        rows = pool.map(run_one, items, chunksize=1)
    wall = time.perf_counter() - t0
    summary = summarize(rows)
    OUT.mkdir(exist_ok=True)
    (OUT / "variable_length.json").write_text(json.dumps(
        {"rows": rows, "summary": summary, "wall_s": wall}, indent=1) + "\n")
    (OUT / "variable_length.md").write_text(render(summary, wall))
    print(render(summary, wall))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
