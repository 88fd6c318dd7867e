"""tune's table: a predicted speed resting on kernel times from a busy host is marked there."""

from __future__ import annotations

from trainfit.render.tune import render_tune_dict


def _probe(index: int, busy: bool) -> dict:
    return {"index": index, "stage": "speed", "micro_batch": 8, "grad_accum": 1,
            "precision": "fp32", "grad_ckpt": "off", "attention": "sdpa", "optimizer": "adamw",
            "optimizer_impl": "foreach", "num_workers": 0, "status": "ok", "fits": True,
            "measured": {"peak_allocated_bytes": 2**29, "tokens_per_s": 5000.0,
                         "data_wait_fraction": 0.01},
            "predicted": {"peak_allocated_bytes": 2**29, "tokens_per_s": 344.0,
                          "from_busy_timings": busy}}


def _out(capsys, busy: bool) -> str:
    render_tune_dict({"device_name": "cpu", "probes": [_probe(1, busy), _probe(2, False)],
                      "memory_limit_bytes": 2**30, "margin": 0.1, "search_time_s": 12.0,
                      "reason": "fp32 8 × 1", "notes": []})
    return capsys.readouterr().out


def test_a_prediction_from_busy_timings_is_starred_and_the_star_said(capsys):
    """An audit: the same configuration predicted at 344 tokens/s in one run and 10,211 in the
    next, the table silent (only --json's from_busy_timings said it)."""
    out = _out(capsys, True)
    assert "5,000/344*" in out and "5,000/344 " in out.replace("344*", "")
    assert "*: predicted from kernel times measured while other processes used this CPU" in \
        " ".join(out.split())
    quiet = _out(capsys, False)
    assert "344*" not in quiet and "*: predicted" not in quiet
