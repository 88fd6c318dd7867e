"""tune's result, from the user's process (where the probes ran) to trainfit's (which draws it):
plain JSON both ways — the child writes a file that the parent reads as data, never as code (no
pickle: the child ran the user's script)."""

from __future__ import annotations

import dataclasses
from typing import Any

from trainfit.job import JobSpec
from trainfit.tune.result import Measured, ProbeResult, SearchNote
from trainfit.tune.search import Comparison, Predicted, Trial
from trainfit.tune.tuner import TuneResult


def _trial_json(t: Trial) -> dict[str, Any]:
    return {"index": t.index, "stage": t.stage, "job": t.job.to_dict(),
            "result": t.result.to_dict(), "fits": t.fits, "note": t.note,
            "predicted": None if t.predicted is None else dataclasses.asdict(t.predicted)}


def tune_result_json(r: TuneResult) -> dict[str, Any]:
    return {"device": r.device, "device_name": r.device_name,
            "memory_limit_bytes": r.memory_limit_bytes, "margin": r.margin,
            "search_time_s": r.search_time_s, "dataset_samples": r.dataset_samples,
            "dataset_tokens": r.dataset_tokens, "trials": [_trial_json(t) for t in r.trials],
            "pick": None if r.pick is None else r.pick.index,
            "baseline": None if r.baseline is None else r.baseline.index,
            "unconfirmed": None if r.unconfirmed is None else r.unconfirmed.index,
            "vs_baseline": None if r.vs_baseline is None else dataclasses.asdict(r.vs_baseline),
            "notes": [{"kind": n.kind, "data": n.data} for n in r.notes],
            "data_notes": list(r.data_notes), "step_source": r.step_source}


def _trial(d: dict[str, Any]) -> Trial:
    res = dict(d["result"])
    measured = res.pop("measured")
    return Trial(index=d["index"], stage=d["stage"], job=JobSpec.from_dict(d["job"]),
                 result=ProbeResult(**res, measured=None if measured is None else Measured(**measured)),
                 predicted=None if d["predicted"] is None else Predicted(**d["predicted"]),
                 fits=d["fits"], note=d["note"])


def tune_result_from_json(d: dict[str, Any]) -> TuneResult:
    trials = [_trial(t) for t in d["trials"]]
    by_index = {t.index: t for t in trials}
    vs = d["vs_baseline"]
    return TuneResult(device=d["device"], device_name=d["device_name"],
                      memory_limit_bytes=d["memory_limit_bytes"], margin=d["margin"],
                      search_time_s=d["search_time_s"], dataset_samples=d["dataset_samples"],
                      dataset_tokens=d["dataset_tokens"],
                      pick=by_index.get(d["pick"]) if d["pick"] is not None else None,
                      baseline=by_index.get(d["baseline"]) if d["baseline"] is not None else None,
                      unconfirmed=by_index.get(d["unconfirmed"])
                      if d.get("unconfirmed") is not None else None,
                      trials=trials, vs_baseline=None if vs is None else Comparison(**vs),
                      notes=[SearchNote(n["kind"], n["data"]) for n in d["notes"]],
                      data_notes=list(d["data_notes"]), step_source=d["step_source"])
