"""train with ``sharding: fsdp`` (FSDP2 ``fully_shard``): 2 gloo ranks on CPU under torchrun against
1 rank — the same losses, the same OOM decision on both ranks, an exact resume, and checkpoints that
move between FSDP and 1 rank (fp32).

One torchrun launch (this file run as a script, 2 ranks) runs every FSDP job in turn, each rank
writing its result as JSON: starting 2 processes that import torch + transformers costs most of the
time on a 2-core machine, the runs themselves take a second or two each.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from trainfit.engine.dist import leave_together
from trainfit.job import JobSpec
from trainfit.run.loop import RunOptions, Trainer, train

# per-step losses, 2 ranks vs 1: the gradients are the same sums in another order (two ranks'
# halves averaged by the reduce-scatter vs one rank's accumulation): what the DDP test allows
RANKS_REL = 1e-5
# resume under FSDP vs the uninterrupted FSDP run, at the same micro-batch: the same operations in
# the same order, and the state round trip (gather → file → broadcast → shard) copies bits
RESUME_REL = 1e-6
STEPS = 6  # 24 samples, effective batch 8: 3 steps an epoch, 2 epochs


def _runs(work: Path, job: JobSpec, lora: JobSpec, one_a: Path, bad: Path) -> list[dict[str, Any]]:
    """The FSDP runs of the one launch, in order (``b`` resumes what ``a`` wrote)."""
    fsdp = job.replace(ranks=2, sharding="fsdp")
    return [
        {"name": "ref", "job": fsdp, "opts": {"out_dir": work / "ref", "inject_oom_at_steps": [1]}},
        {"name": "a", "job": fsdp, "opts": {"out_dir": work / "a", "inject_oom_at_steps": [1],
                                            "inject_interrupt_at_step": 3}},
        # after the OOM the run went on at micro-batch 1: resume at 1 (same operations as ref)
        {"name": "b", "job": fsdp.replace(micro_batch=1),
         "opts": {"out_dir": work / "a", "resume": work / "a"}},
        # and at the job's micro-batch 2 (as the DDP test resumes at another micro-batch)
        {"name": "b2", "job": fsdp, "opts": {"out_dir": work / "b2",
                                             "resume": work / "a" / "checkpoint-4"}},
        # a checkpoint written by 1 rank, resumed by 2 FSDP ranks
        {"name": "from1", "job": fsdp, "opts": {"out_dir": work / "from1", "resume": one_a}},
        {"name": "lora", "job": lora.replace(ranks=2, sharding="fsdp"),
         "opts": {"out_dir": work / "lora", "max_steps": 3}},
        # rank 0 alone reads the files: its error must reach rank 1 (not leave it waiting)
        {"name": "corrupt", "job": fsdp, "opts": {"out_dir": work / "corrupt", "resume": bad}},
    ]


def _worker(spec_path: Path) -> None:
    """One rank (under torchrun): run the spec's jobs, write each result as JSON."""
    from trainfit.job import JobError
    from trainfit.run.checkpoint import is_sharded

    spec = json.loads(spec_path.read_text())
    rank = int(os.environ["RANK"])
    for r in spec["runs"]:
        t0 = time.perf_counter()
        o = {"max_steps": STEPS, "record_samples": True, "live": False, **r["opts"]}
        for k in ("out_dir", "resume"):
            if k in o:
                o[k] = Path(o[k])
        o["inject_oom_at_steps"] = tuple(o.get("inject_oom_at_steps", ()))
        out_file = Path(spec["results"]) / f"{r['name']}.rank{rank}.json"
        try:
            t = Trainer(JobSpec.from_dict(r["job"]), RunOptions(**o))
        except JobError as err:
            out_file.write_text(json.dumps({"error": str(err)}))
            continue
        m = t.wl.model
        local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
                    for p in m.parameters())
        full = sum(p.numel() for p in m.parameters())
        res = t.run()
        out = {"losses": res.losses, "oom_events": [e.to_dict() for e in res.oom_events],
               "samples": res.samples,
               "steps": res.steps, "interrupted": res.interrupted, "checkpoints": res.checkpoints,
               "resumed_from": res.resumed_from, "sharded": is_sharded(m),
               "local_params": local, "full_params": full, "wall_s": time.perf_counter() - t0}
        out_file.write_text(json.dumps(out))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, micro_chat_files: tuple[Path, Path],
         two_gloo_ranks: Any
         ) -> dict[str, Any]:

    work = tmp_path_factory.mktemp("fsdp")
    cfg, data = micro_chat_files
    # padded chat rows of different lengths: the token weighting across ranks matters
    job = JobSpec(model=str(cfg), seq_len=32, effective_batch=8, micro_batch=2,
                  precision="fp32", data=str(data))
    lora = job.replace(method="lora", lora_dropout=0.0)  # dropout draws differ between 1 and 2 ranks
    one = {"ref": train(job, RunOptions(out_dir=work / "one_ref", max_steps=STEPS,
                                        record_samples=True)),
           "a": train(job, RunOptions(out_dir=work / "one_a", max_steps=STEPS,
                                      inject_interrupt_at_step=3)),
           "lora": train(lora, RunOptions(out_dir=work / "one_lora", max_steps=3))}
    bad = work / "bad" / "checkpoint-4"
    shutil.copytree(work / "one_a" / "checkpoint-4", bad)
    (bad / "optimizer.pt").write_bytes(b"garbage")
    # digests recorded for the garbage: the collective read itself must fail cleanly (a changed
    # file with the old digests is refused before any read: tests/reliability)
    from trainfit.run.checkpoint import write_digests

    write_digests(bad)
    results = work / "results"
    results.mkdir()
    spec = work / "spec.json"
    spec.write_text(json.dumps({"results": str(results), "runs": [
        {**r, "job": r["job"].to_dict(), "opts": {k: str(v) if isinstance(v, Path) else v
                                                  for k, v in r["opts"].items()}}
        for r in _runs(work, job, lora, work / "one_a", bad)]}))
    two_gloo_ranks(__file__, str(spec))
    two = {p.name.removesuffix(".json"): json.loads(p.read_text()) for p in results.iterdir()}
    return {"work": work, "job": job, "one": one, "two": two}


def _max_rel(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


def test_fsdp_shards_and_matches_one_rank(runs):
    ref0, ref1 = runs["two"]["ref.rank0"], runs["two"]["ref.rank1"]
    one = runs["one"]["ref"]
    # really sharded: DTensor parameters, each rank holding half of them (+ padding of odd dims)
    assert ref0["sharded"] and ref1["sharded"]
    assert ref0["local_params"] + ref1["local_params"] == ref0["full_params"]
    assert abs(ref0["local_params"] - ref0["full_params"] / 2) <= 0.01 * ref0["full_params"]
    assert len(ref0["losses"]) == STEPS
    assert ref0["losses"] == ref1["losses"]  # the mean over ranks, reduced on both
    assert ref0["losses"] == pytest.approx(one.losses, rel=RANKS_REL)
    print(f"FSDP vs 1 rank: max rel loss diff {_max_rel(ref0['losses'], one.losses):.2e}")


def test_fsdp_oom_same_decision_on_both_ranks(runs):
    ref0, ref1 = runs["two"]["ref.rank0"], runs["two"]["ref.rank1"]
    want = [{"step": 1, "phase": "step", "micro_batch_before": 2, "micro_batch_after": 1,
             "grad_accum_after": 4}]
    assert ref0["oom_events"] == want and ref1["oom_events"] == want
    # every step: both ranks' ids (gathered) are the 1-rank step's 8 ids, none twice
    one = runs["one"]["ref"].samples
    for step2, step1 in zip(ref0["samples"], one, strict=True):
        assert len(step2) == len(set(step2)) == 8
        assert sorted(step2) == sorted(step1)
    flat = [i for s in ref0["samples"] for i in s]
    assert sorted(flat) == sorted(list(range(24)) * 2)  # 2 epochs: each sample once per epoch


def test_fsdp_interrupt_resume_reproduces_the_run(runs):
    a, b, ref = (runs["two"][f"{n}.rank0"] for n in ("a", "b", "ref"))
    assert a["interrupted"] and a["steps"] == 4 and a["checkpoints"][-1].endswith("checkpoint-4")
    assert runs["two"]["a.rank1"]["interrupted"] and runs["two"]["a.rank1"]["checkpoints"] == []
    assert b["resumed_from"].endswith("checkpoint-4") and b["steps"] == STEPS
    # the resumed run's record holds both segments' steps
    assert b["losses"][:4] == a["losses"]
    assert b["losses"] == pytest.approx(ref["losses"], rel=RESUME_REL)
    assert [sorted(s) for s in a["samples"] + b["samples"]] == [sorted(s) for s in ref["samples"]]
    # another micro-batch: another float summation order, the tolerance of the DDP resume test
    b2 = runs["two"]["b2.rank0"]
    assert b2["resumed_from"].endswith("checkpoint-4")
    assert b2["losses"] == pytest.approx(ref["losses"], rel=1e-6)
    print(f"FSDP resume vs uninterrupted: max rel diff "
          f"{_max_rel(b['losses'], ref['losses']):.2e} (same micro-batch), "
          f"{_max_rel(b2['losses'], ref['losses']):.2e} (micro-batch 2 vs 1)")


def test_checkpoints_move_between_fsdp_and_one_rank(runs):
    work, job = runs["work"], runs["job"]
    ref, one = runs["two"]["ref.rank0"], runs["one"]["ref"]
    ck = work / "a" / "checkpoint-4"
    assert {p.name for p in ck.iterdir()} >= {"model.safetensors", "optimizer.pt", "scheduler.pt",
                                              "rng.pt", "trainer_state.json"}
    # FSDP → 1 rank: the same files as a 1-rank run writes, loaded without any process group
    res = train(job, RunOptions(out_dir=work / "back1", max_steps=STEPS, resume=ck))
    assert res.resumed_from == str(ck) and len(res.losses) == STEPS  # the record of the run
    assert res.losses[4:] == pytest.approx(ref["losses"][4:], rel=RANKS_REL)
    assert res.losses[4:] == pytest.approx(one.losses[4:], rel=RANKS_REL)
    # 1 rank → FSDP
    from1 = runs["two"]["from1.rank0"]
    assert from1["resumed_from"].endswith("checkpoint-4") and from1["sharded"]
    assert from1["losses"][4:] == pytest.approx(one.losses[4:], rel=RANKS_REL)
    print(f"1 rank from FSDP ckpt: {_max_rel(res.losses[4:], ref['losses'][4:]):.2e}; "
          f"FSDP from 1-rank ckpt: {_max_rel(from1['losses'][4:], one.losses[4:]):.2e}")


def test_fsdp_lora_matches_one_rank(runs):
    """PEFT LoRA under FSDP: frozen base and trainable adapters in the same units; the final
    checkpoint holds the adapters only, gathered from the shards."""
    from safetensors.torch import load_file

    lora2, lora1 = runs["two"]["lora.rank0"], runs["one"]["lora"]
    assert lora2["sharded"] and len(lora2["losses"]) == 3
    assert lora2["losses"] == pytest.approx(lora1.losses, rel=RANKS_REL)
    w2 = load_file(str(runs["work"] / "lora" / "checkpoint-3" / "model.safetensors"))
    w1 = load_file(str(runs["work"] / "one_lora" / "checkpoint-3" / "model.safetensors"))
    assert set(w2) == set(w1) and all("lora_" in n for n in w2)
    assert max(float((w2[n] - w1[n]).abs().max()) for n in w1) < 1e-6
    print(f"LoRA FSDP vs 1 rank: max rel loss diff {_max_rel(lora2['losses'], lora1.losses):.2e}")


def test_fsdp_corrupt_checkpoint_fails_cleanly_on_every_rank(runs):
    for rank in (0, 1):
        assert "corrupt" in runs["two"][f"corrupt.rank{rank}"]["error"]


if __name__ == "__main__":  # a torchrun rank (see the fixture)
    _worker(Path(sys.argv[1]))
    leave_together()  # every rank has written its results
