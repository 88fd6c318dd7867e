"""plan's header names what the simulation ran beyond the installed stack."""

from __future__ import annotations

from types import SimpleNamespace

from trainfit.job import JobSpec
from trainfit.plan.context import plan_assumptions
from trainfit.render.plan_words import plan_header


def test_header_says_an_older_torchs_softmax_saves_are_modelled():
    said = {}
    for legacy in (False, True):
        job = JobSpec(model="t", seq_len=64, softmax_saves_input=legacy, attention="eager")
        said[legacy] = plan_header(SimpleNamespace(assumptions=plan_assumptions(job, {}),
                                                   rows=[SimpleNamespace(job=job)]))
    tail = "(softmax/log_softmax also holding their inputs, as torch ≤ 1.10's did)"
    assert said[True].endswith(tail)
    assert tail not in said[False]


def test_header_says_the_weight_decay_it_planned():
    """SGD's L2 decay copies the gradients in the step: the decay planned is said, none without."""
    said = {}
    for decay in (0.0, 0.01):
        job = JobSpec(model="t", seq_len=64, optimizer="sgd", weight_decay=decay)
        said[decay] = plan_header(SimpleNamespace(assumptions=plan_assumptions(job, {}),
                                                  rows=[SimpleNamespace(job=job)]))
    assert "sgd with weight decay 0.01," in said[0.01]
    assert "weight decay" not in said[0.0]
