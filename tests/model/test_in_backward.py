"""optimizer_in_backward: the same update as the ordinary step, with no gradient left after the
backward; its state saves and loads as one optimizer's; dropped hooks stop stepping; the job
refuses what it cannot do; plan and tune offer only the micro-batch it allows."""

from __future__ import annotations

import copy

import pytest
import torch

from trainfit.engine.step import repeat_batches, train_step
from trainfit.job import JobError, JobSpec
from trainfit.model.in_backward import InBackwardOptimizer
from trainfit.model.workload import make_optimizer


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


class _Loss(torch.nn.Module):
    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).pow(2).mean()


@pytest.mark.parametrize("impl", ["fused", "foreach", "forloop"])
def test_same_weights_as_the_ordinary_step_and_no_gradient_left(impl):
    job = JobSpec(model="m", optimizer_impl=impl, micro_batch=5)
    a, b = _Loss(_model()), _Loss(_model())
    b.load_state_dict(a.state_dict())
    seen: list[bool] = []  # registered first, so it runs before the optimizer's hook
    b.net[2].weight.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad is not None))
    opt_a = make_optimizer(job, list(a.parameters()), simulate=False, lr=1e-2)
    opt_b = make_optimizer(job.replace(optimizer_in_backward=True, max_grad_norm=None),
                           list(b.parameters()), simulate=False, lr=1e-2)
    assert isinstance(opt_b, InBackwardOptimizer) and not isinstance(opt_a, InBackwardOptimizer)
    for k in range(3):
        x = torch.randn(5, 8, generator=torch.Generator().manual_seed(k))
        la = train_step(a, opt_a, repeat_batches({"x": x}, 1), grad_accum=1, max_grad_norm=None)
        b(x).backward()  # the backward alone: the hooks stepped and freed every gradient
        assert all(p.grad is None for p in b.parameters())
        opt_b.step()  # train_step's own step: nothing left to do
        assert la.loss is not None
    assert seen == [True, True, True]
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    assert all(s["step"].item() == 3 for s in opt_b.state.values()) and len(opt_b.state) == 4


def test_state_dict_round_trip_and_scheduler():
    net = _Loss(_model())
    opt = InBackwardOptimizer(net.parameters(), lambda ps: torch.optim.AdamW(ps, lr=1e-2))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 ** s)
    net(torch.randn(3, 8)).backward()
    opt.step()
    sched.step()
    assert [o.param_groups[0]["lr"] for o in opt.optimizers] == [5e-3] * 4  # the shared groups
    sd = copy.deepcopy(opt.state_dict())
    assert sorted(sd["state"]) == [0, 1, 2, 3] and sd["param_groups"][0]["params"] == [0]
    twin_net = copy.deepcopy(net)
    twin = InBackwardOptimizer(twin_net.parameters(), lambda ps: torch.optim.AdamW(ps, lr=1e-2))
    twin.load_state_dict(sd)
    assert all(o.state is twin.state for o in twin.optimizers)
    x = torch.randn(3, 8)
    net(x).backward()
    twin_net(x).backward()  # both continue from the same state: the same weights
    for p, q in zip(net.parameters(), twin_net.parameters(), strict=True):
        assert torch.equal(p, q)


def test_removed_hooks_stop_stepping():
    net = _Loss(_model())
    opt = InBackwardOptimizer(net.parameters(), lambda ps: torch.optim.SGD(ps, lr=1.0))
    before = [p.detach().clone() for p in net.parameters()]
    opt.remove_hooks()
    net(torch.randn(3, 8)).backward()
    assert all(p.grad is not None for p in net.parameters())
    assert all(torch.equal(p, q) for p, q in zip(net.parameters(), before, strict=True))


@pytest.mark.parametrize("kw, needle", [
    ({"micro_batch": 2, "grad_accum": 2, "max_grad_norm": None}, "grad-accum 2"),
    ({"micro_batch": 2}, "gradient clipping"),
    ({"micro_batch": 2, "max_grad_norm": None, "ranks": 2}, "--ranks 2"),
    ({"micro_batch": 2, "max_grad_norm": None, "precision": "amp-fp16"}, "amp-fp16"),
])
def test_the_job_refuses_what_it_cannot_do(kw, needle):
    with pytest.raises(JobError, match=needle):
        JobSpec(model="m", optimizer_in_backward=True, **kw)


def test_plan_and_tune_offer_only_the_per_rank_batch():
    from trainfit.plan.grid import _micro_candidates
    from trainfit.tune.search import micro_options

    job = JobSpec(model="m", effective_batch=8, optimizer_in_backward=True, max_grad_norm=None)
    assert _micro_candidates(job) == [8]
    assert micro_options(job, 100)[0] == [8]
    assert micro_options(job, 4)[0] == []  # the data holds fewer samples than one step needs
    plain = JobSpec(model="m", effective_batch=8)
    assert _micro_candidates(plain) == [1, 2, 4, 8] and micro_options(plain, 100)[0] == [1, 2, 4, 8]
