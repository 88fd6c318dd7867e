"""The optimizer a script steps: read from its Trainer (:mod:`trainfit.script.read`: its own,
the one its Trainer builds, the largest group's kernel) and mapped to the job's optimizer fields
(:mod:`trainfit.script.optimizer`: kernel, decay, momentum, what is refused rather than
under-predicted), and the change a pick asks of it (:mod:`trainfit.script.diff`)."""

from __future__ import annotations

import re

import pytest
import torch
from script_records import record

from trainfit.job import JobError, JobSpec
from trainfit.script.diff import keyword_diff
from trainfit.script.mapping import map_record


@pytest.mark.parametrize(("cls", "fused", "foreach", "impl"), [
    ("AdamW", None, None, "foreach"), ("AdamW", None, False, "forloop"),
    ("AdamW", False, None, "forloop"), ("AdamW", True, None, "fused"),
    ("AdamW", None, True, "foreach"), ("SGD", None, None, "foreach"), ("SGD", True, None, "fused"),
    ("SGD", False, None, "forloop")])
def test_the_scripts_own_optimizer_runs_torchs_default_kernel_on_a_gpu(cls, fused, foreach, impl):
    """torch's default (foreach=None, fused=None) is foreach for CUDA tensors: read as the for-loop,
    a default AdamW's state-sized temporary list went unplanned (a review); fused=False alone is
    the for-loop (torch/optim/adam.py: the default is taken only when both are None), whose
    temporaries on ZeRO's flat partition are twice foreach's (a review: 15 GiB under at 8B)."""
    r = record(optimizer={"class": cls, "fused": fused, "foreach": foreach, "weight_decay": 0.0})
    assert map_record(r).fields["optimizer_impl"] == impl


def test_weight_decay_from_the_trainer_or_the_scripts_own_optimizer():
    """SGD's L2 decay copies the gradients (torch's foreach SGD): the decay is planned as run."""
    assert map_record(record(args__weight_decay=0.01)).fields["weight_decay"] == 0.01
    own = {"class": "SGD", "fused": None, "foreach": None, "weight_decay": 0.05}
    # the script's optimizer, not the Trainer's argument it does not use
    j = map_record(record(optimizer=own, args__weight_decay=0.01))
    assert (j.fields["optimizer"], j.fields["weight_decay"]) == ("sgd", 0.05)
    assert "weight_decay" not in map_record(record(args__weight_decay=0.01),
                                            given=frozenset({"weight_decay"})).fields


@pytest.mark.parametrize(("own", "words"), [
    ({"class": "AdamW", "maximize": True}, "AdamW(maximize=True) is not modeled"),
    ({"class": "SGD", "nesterov": True, "momentum": 0.9, "foreach": False},
     "SGD(nesterov=True, foreach=False) is not modeled"),
    ({"class": "AdamW", "amsgrad": True}, "AdamW with amsgrad=True is not modeled"),
    ({"class": "Adafactor", "beta1": 0.9}, "Adafactor with beta1 (a first moment) is not modeled"),
    ({"class": "AdamW8bit", "min_8bit_size": 10**9}, "AdamW8bit with min_8bit_size=1000000000")])
def test_the_scripts_own_optimizer_options_that_copy_the_gradients_are_refused(own, words):
    """maximize negates a copy of every gradient (foreach); the for-loop nesterov SGD adds the
    momentum into a new tensor; amsgrad, Adafactor's beta1 and a larger 8-bit threshold keep more
    state: plan would be under (reviews: −25 %, −12 %; 790 kB of states against 526 kB, 266 kB
    against 3 kB, 526 kB against 137 kB on a tiny model)."""
    with pytest.raises(JobError, match=re.escape(words)) as err:
        map_record(record(optimizer={"fused": None, "foreach": None, "weight_decay": 0.0,
                                     **own}))
    assert err.value.hint


def test_bitsandbytes_sgd_keeps_its_momentum_state():
    """bitsandbytes' SGD keeps its momentum as betas[0] (and refuses 0): read by name as torch's,
    it was planned foreach without momentum (a review); 8-bit states are refused."""
    from types import SimpleNamespace

    import bitsandbytes as bnb

    from trainfit.script.read import given_optimizer

    lin = torch.nn.Linear(8, 8)
    rec = given_optimizer(SimpleNamespace(optimizer=bnb.optim.SGD(lin.parameters(), lr=1e-3,
                                                                  momentum=0.8)))
    j = map_record(record(optimizer=rec)).fields
    assert (j["optimizer"], j["optimizer_impl"], j["sgd_momentum"]) == ("sgd", "fused", 0.8)
    with pytest.raises(JobError, match="bitsandbytes SGD with 8-bit states"):
        map_record(record(optimizer={**rec, "optim_bits": 8}))
    # its 32-bit states are fp32 whatever the weights' dtype (torch's are the weights'): on
    # bf16 weights refused, as bitsandbytes' 32-bit AdamW (a review: half its states missed)
    for own in (rec, {"class": "AdamW", "module": "bitsandbytes.optim.adamw", "optim_bits": 32,
                      "fused": None, "foreach": None, "weight_decay": 0.0}):
        with pytest.raises(JobError, match="32-bit states on bfloat16 weights"):
            map_record(record(optimizer=own, model__trainable_dtype="bfloat16"))
    # tune's probe rebuilds it with its momentum (it refuses none: never rebuilt before)
    from trainfit.script.probe import own_optimizer, rebuild_own

    opt = rebuild_own(own_optimizer(bnb.optim.SGD(lin.parameters(), lr=1e-3, momentum=0.8)),
                      JobSpec(model="x", optimizer="sgd", sgd_momentum=0.8))
    assert type(opt).__name__ == "SGD" and opt.param_groups[0]["betas"][0] == 0.8


@pytest.mark.parametrize(("bits", "job"), [(8, ("adamw-8bit", "fused")), (32, ("adamw", "fused"))])
def test_bitsandbytes_generic_adamw_is_read_by_its_bits(bits, job):
    """bitsandbytes.optim.AdamW(optim_bits=8) keeps 8-bit states: by its class name alone it was
    planned as torch's AdamW (a review)."""
    own = {"class": "AdamW", "module": "bitsandbytes.optim.adamw", "optim_bits": bits,
           "fused": None, "foreach": None, "weight_decay": 0.0}
    j = map_record(record(optimizer=own))
    assert (j.fields["optimizer"], j.fields["optimizer_impl"]) == job


def test_sgd_momentum_from_the_trainer_or_the_scripts_own_optimizer():
    """HF's optim="sgd" is torch's SGD with no momentum (no state) unless ``optim_args`` sets
    one: planned with trainfit's 0.9 it was over by a state the size of the weights."""
    assert map_record(record(args__optim="sgd")).fields["sgd_momentum"] == 0.0
    args = record(args__optim="sgd", args__optim_args="momentum=0.9, nesterov=True")
    assert map_record(args).fields["sgd_momentum"] == 0.9
    own = {"class": "SGD", "fused": None, "foreach": None, "weight_decay": 0.0, "momentum": 0.5}
    assert map_record(record(optimizer=own)).fields["sgd_momentum"] == 0.5
    assert "sgd_momentum" not in map_record(record()).fields  # AdamW: not SGD's knob
    with pytest.raises(JobError, match="optim_args momentum='high'"):
        map_record(record(args__optim="sgd", args__optim_args="momentum=high"))


def test_another_optimizer_on_the_command_line_drops_sgds_momentum():
    """A script's (or a tuned file's) SGD momentum describes the SGD the command line replaced:
    with --optimizer adamw it was refused as "given with --optimizer adamw" (a review)."""
    from trainfit.cli.jobflags import merge_job_fields
    from trainfit.script.mapping import with_flags

    read = {"model": "m", "optimizer": "sgd", "sgd_momentum": 0.0, "micro_batch": 2,
            "grad_accum": 4}
    assert "sgd_momentum" not in with_flags(read, {"optimizer": "adamw"})
    assert with_flags(read, {"optimizer": "sgd"})["sgd_momentum"] == 0.0
    merged = merge_job_fields(read, {"optimizer": "adamw"}, "usage")
    assert "sgd_momentum" not in merged and JobSpec(**merged).optimizer == "adamw"
    assert merge_job_fields(read, {"micro_batch": 1}, "usage")["sgd_momentum"] == 0.0


def test_the_scripts_own_optimizers_kernel_is_changed_at_its_constructor():
    """The Trainer ignores ``optim`` when it is handed an optimizer: a pick changing the kernel of
    the script's own AdamW said "optim: adamw_torch → adamw_torch_fused" (a review); and
    --optimizer-impl given alone keeps the script's optimizer (it had planned AdamW over an own
    SGD)."""
    own = {"class": "SGD", "fused": None, "foreach": None, "weight_decay": 0.0, "momentum": 0.9}
    r = record(optimizer=own)
    j = map_record(r, given=frozenset({"optimizer_impl"}))
    assert j.fields["optimizer"] == "sgd" and "optimizer_impl" not in j.fields
    cur = JobSpec.from_dict({**map_record(r).fields, "micro_batch": 2, "grad_accum": 4})
    ch = keyword_diff(r, cur, cur.replace(optimizer_impl="fused"))
    from trainfit.render.script import change_words

    assert change_words(ch) == [
        "the script's own SGD(...) (Trainer(optimizers=...)): fused=True, foreach=False"]
    # said where the optimizer is made: the Trainer's optimizer_cls_and_kwargs, a subclass's
    # create_optimizer
    for how, site in (("optimizer_cls_and_kwargs",
                       "Trainer(optimizer_cls_and_kwargs=(SGD, {...})): its keywords"),
                      ("MyTrainer.create_optimizer", "MyTrainer.create_optimizer: its SGD(...)")):
        r = record(optimizer={**own, "built_by": how})
        assert change_words(keyword_diff(r, cur, cur.replace(optimizer_impl="fused"))) == [
            f"{site}: fused=True, foreach=False"]


def test_another_optimizer_over_the_scripts_own_is_said_as_the_one_to_hand_the_trainer():
    """--optimizer adamw-8bit over a script's own AdamW: nothing was said once optim (which the
    Trainer ignores then) was left out (a review); a class with no kernel keywords gets none, and
    --optimizer-impl given alone does not refuse the kernel it replaces."""
    from trainfit.render.script import change_words

    own = {"class": "AdamW", "fused": None, "foreach": None, "weight_decay": 0.0}
    r = record(optimizer=own)
    cur = JobSpec.from_dict({**map_record(r).fields, "micro_batch": 2, "grad_accum": 4})
    words = change_words(keyword_diff(r, cur, cur.replace(optimizer="adamw-8bit",
                                                          optimizer_impl="fused")))
    assert words == ["Trainer(optimizers=(…, scheduler)): the script's own AdamW: "
                     "optimizer='bitsandbytes.optim.AdamW8bit(model.parameters(), lr=...)'"]
    bnb = record(optimizer={**own, "module": "bitsandbytes.optim.adamw", "optim_bits": 32,
                            "kernels": False})
    cur = JobSpec.from_dict({**map_record(bnb).fields, "micro_batch": 2, "grad_accum": 4})
    assert keyword_diff(bnb, cur, cur.replace(optimizer_impl="foreach")) == []
    nesterov = record(optimizer={"class": "SGD", "fused": None, "foreach": False, "momentum": 0.9,
                                 "nesterov": True, "weight_decay": 0.0})
    assert map_record(nesterov, given=frozenset({"optimizer_impl"})).fields["optimizer"] == "sgd"


def test_the_optimizer_a_trainer_builds_itself_is_read_from_what_it_builds(tmp_path):
    """``Trainer(optimizer_cls_and_kwargs=...)`` and a subclass's own ``create_optimizer`` build
    the optimizer the script steps, not ``args.optim``'s: both were read from ``args.optim``
    (transformers 5's default adamw_torch_fused: no temporaries) where a foreach AdamW keeps Ψ·4
    bytes of them.  Read from what the trainer builds (plan's meta model takes it: a constructor
    makes no state), the trainer left without it; what it raises is one line."""
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    from trainfit.script.mapping import script_optimizer
    from trainfit.script.probe import own_optimizer
    from trainfit.script.read import built_optimizer, given_optimizer, trainer_args

    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, vocab_size=256,
                                         num_hidden_layers=1, num_attention_heads=4,
                                         num_key_value_heads=2))
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                             weight_decay=0.05)
    tr = Trainer(model=model, args=args,
                 optimizer_cls_and_kwargs=(torch.optim.AdamW, {"lr": 1e-3, "foreach": True}))
    rec = given_optimizer(tr)
    assert tr.optimizer is None
    assert (rec["class"], rec["foreach"], rec["fused"], rec["weight_decay"]) == (
        "AdamW", True, None, 0.05)
    fields, where = script_optimizer({"optimizer": rec, "args": trainer_args(tr.args)})
    assert (fields["optimizer"], fields["optimizer_impl"]) == ("adamw", "foreach")
    assert where == "the optimizer its Trainer builds from optimizer_cls_and_kwargs"
    # built once per trainer (the record and tune's probe alike), and HF's create_optimizer,
    # which pops "params" out of the kwargs it is handed, given a copy: the script's own groups
    # (and their kernel) stay (a review: gone after the first build, the probe then read HF's)
    big, rest = [p for p in model.parameters() if p.ndim >= 2], [
        p for p in model.parameters() if p.ndim < 2]
    kwargs = {"lr": 1e-3, "params": [{"params": big, "foreach": False}, {"params": rest}]}
    grouped = Trainer(model=model, args=args, optimizer_cls_and_kwargs=(torch.optim.AdamW, kwargs))
    first = built_optimizer(grouped)
    assert built_optimizer(grouped) is first and set(kwargs) == {"lr", "params"}
    assert given_optimizer(grouped)["foreach"] is False  # the largest trainable group's
    # without them: args.optim's, read from the arguments (None here)
    assert given_optimizer(Trainer(model=model, args=args)) is None

    class OwnSGD(Trainer):
        def create_optimizer(self):
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.9)
            return self.optimizer

    own = OwnSGD(model=model, args=args)
    rec = given_optimizer(own)
    assert (rec["class"], rec["momentum"], own.optimizer) == ("SGD", 0.9, None)
    # the probe rebuilds what the subclass builds (its class and groups)
    assert own_optimizer(built_optimizer(own))[0] is torch.optim.SGD

    class Broken(Trainer):
        def create_optimizer(self):
            raise ValueError("needs\nthe data")

    # what its build raises is one line, raised where the plan takes the script's optimizer:
    # --optimizer plans another (a review: refused whatever the command line said)
    broken = Broken(model=model, args=args)
    rec = {"optimizer": given_optimizer(broken), "args": trainer_args(broken.args)}
    with pytest.raises(JobError, match=r"Broken\.create_optimizer\) could not be read: "
                                       r"ValueError: needs the data$") as err:
        script_optimizer(rec)
    assert "--optimizer" in err.value.hint
    r = record(optimizer=rec["optimizer"])
    assert map_record(r, given=frozenset({"optimizer"})).fields.get("optimizer") is None
    # tune's probe: no rebuild of it, and the command line's optimizer measured
    assert own_optimizer(None) is None and own_optimizer(object()) is None
    # the cached error is text: it does not keep the trainer (the cache's weak key) alive
    import gc
    import weakref

    ref = weakref.ref(broken)
    del broken, rec
    gc.collect()
    assert ref() is None

    class Both(OwnSGD):  # a subclass's create_optimizer decides over optimizer_cls_and_kwargs
        pass

    both = Both(model=model, args=args, optimizer_cls_and_kwargs=(torch.optim.AdamW, {}))
    rec = given_optimizer(both)
    assert (rec["class"], rec["built_by"]) == ("SGD", "Both.create_optimizer")


def test_the_reader_takes_the_largest_groups_momentum_and_decay():
    """An own SGD whose default momentum is 0 but one group's 0.9 keeps a state for that group:
    read from the defaults alone it was planned without (a review); decay likewise, and
    nesterov / maximize in any group."""
    from types import SimpleNamespace

    from trainfit.script.read import given_optimizer

    a, b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    opt = torch.optim.SGD([{"params": a.parameters(), "momentum": 0.9, "nesterov": True},
                           {"params": b.parameters(), "weight_decay": 0.01}], lr=0.1)
    rec = given_optimizer(SimpleNamespace(optimizer=opt))
    assert (rec["momentum"], rec["weight_decay"], rec["nesterov"], rec["maximize"]) == (
        0.9, 0.01, True, False)
    assert (rec["fused"], rec["foreach"], rec["module"]) == (None, None, "torch.optim.sgd")
    # the kernel is the largest group's, which torch steps with its own (a group's foreach=False
    # over the defaults' None: the for-loop, whose flat ZeRO partition holds 8 B an element to
    # foreach's 4; read from the defaults it was foreach)
    big, small = torch.nn.Linear(64, 64), torch.nn.LayerNorm(64)
    mixed = given_optimizer(SimpleNamespace(optimizer=torch.optim.AdamW(
        [{"params": big.parameters(), "foreach": False}, {"params": small.parameters()}],
        lr=1e-3)))
    assert (mixed["fused"], mixed["foreach"]) == (None, False)
    from trainfit.script.optimizer import _implementation

    assert _implementation(mixed) == "forloop"
    flipped = given_optimizer(SimpleNamespace(optimizer=torch.optim.AdamW(
        [{"params": big.parameters()}, {"params": small.parameters(), "foreach": False}],
        lr=1e-3, fused=True)))
    assert _implementation(flipped) == "fused"
    # whether tune may ask another kernel of it: not with a tensor lr (foreach refuses one), nor
    # of a class whose constructor has no fused= / foreach= (the knob is then not tried)
    assert rec["kernels"] is True
    fixed = given_optimizer(SimpleNamespace(optimizer=torch.optim.AdamW(
        a.parameters(), lr=torch.tensor(1e-3), fused=True)))
    assert fixed["kernels"] is False
    from trainfit.script.tune import _options

    knobs = [_options(JobSpec(model="x"), {"model": {"trainable_dtype": "bfloat16"},
                                           "optimizer": own}, {}).knobs for own in (rec, fixed)]
    assert "optimizer_impl" in knobs[0] and "optimizer_impl" not in knobs[1]
    # HF's optim="sgd" passes no kernel (torch's default runs): not tried, where adamw_torch's
    # fused twin (adamw_torch_fused) is
    knobs = [_options(JobSpec(model="x"), {"model": {"trainable_dtype": "bfloat16"},
                                           "optimizer": None, "args": {"optim": optim}}, {}).knobs
             for optim in ("sgd", "adamw_torch")]
    assert "optimizer_impl" not in knobs[0] and "optimizer_impl" in knobs[1]
