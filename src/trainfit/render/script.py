"""``plan|tune -- python train.py``: what was read from the script, its sequence lengths, the
model check, and the change to make in the script's own keywords (the grid and the probes are
drawn by render/plan.py and render/tune.py)."""

from __future__ import annotations

import dataclasses
import re
import shlex
from typing import Any

from rich.console import Console
from rich.table import Table

from trainfit.render.layout import out_console
from trainfit.script.diff import SWITCH_OFF, KeywordChange
from trainfit.script.mapping import LengthStats, ReadJob, ScriptNote
from trainfit.script.plan import QUANTILE_PLAN_BELOW, ModelCheck, ScriptPlan

_PADDED_AS = {
    "sdpa": " with the padding mask, which transformers cannot skip (SDPA keeps a float copy of "
            "it per layer and runs a kernel that takes a mask; grouped heads get k and v "
            "repeated)",
    "flash-attention-2": "; flash attention unpads them (q, k and v gathered to the real "
                         "tokens, the output padded back, which o_proj keeps where it saves its "
                         "input; the B×S×S bool mask the model simulated with sdpa builds, which "
                         "flash attention does not, is counted too)",
    "eager": " with the padding mask (eager attention builds its mask anyway: for a decoder-only "
             "model the same memory)"}
"""The end of the ``padded`` note by the script's attention (SDPA's for its kernel choices)."""

NOTE_WORDS = {
    "padded": "batches are padded (the collator pads): planned at {seq_len} positions per "
              "sample{how}",
    "no_autocast": "no bf16/fp16 flag: the frozen {base} base runs in {base} and the adapters in "
                   "float32 — planned as {precision} (the same weights)",
    "autocast_over_bf16": "bf16=True over bfloat16 trainable weights: planned as {precision}",
    "attention": "attn_implementation={script!r}: planned with PyTorch's {planned} (the same "
                 "memory order)",
    "flash_fp32": "attn_implementation={script!r} in a run read as float32 (no bf16/fp16 "
                  "flag; for QLoRA bitsandbytes' default float32 compute dtype): planned as fp32 "
                  "with PyTorch's sdpa, which errs high — FlashAttention-2 takes 16-bit q, k and "
                  "v only (transformers casts fp32 ones to the model's dtype; with float32 "
                  "weights flash-attn raises)",
    "padding_free": "padding-free batches (one row of concatenated samples): planned as "
                    "micro-batch × {seq_len} positions (flash attention's varlen kernel reads "
                    "the packing from position_ids: no mask, the memory of separate rows)",
    "padding_free_mask": "padding-free batches (one row of concatenated samples): planned as "
                         "that one row of micro-batch × {seq_len} positions, with the (1, 1, N, "
                         "N) boolean attention mask transformers 5 builds from position_ids "
                         "({positions:,} positions at the script's micro-batch: {mask_mib:,.0f} "
                         "MiB) and the float copy of it SDPA keeps per layer for the backward — "
                         "memory and attention time grow with the micro-batch squared, and rows "
                         "between two simulated micro-batches are interpolated above that curve "
                         "(the pick is simulated whole); attn_implementation="
                         "\"flash_attention_2\" takes the packing with no mask",
    "own_loss": "the script computes the loss itself ({where}): planned as the model's own "
                "loss over its logits; tensors the script's loss makes beyond those (a "
                "float32 copy of the logits, a smoothed target) are not planned",
    "seq2seq_lengths": "encoder inputs up to {input_max} and targets up to {label_max} tokens: "
                       "planned at the longer of the two for both (an upper bound)",
    "frozen_by_script": "the script freezes weights itself ({trainable:,} of {total:,} "
                        "parameters train): planned as full fine-tuning, every weight training (an "
                        "upper bound)",
    "lora_bias": "LoraConfig(bias={bias!r}): the trainable biases are not planned (a few KB)",
    "fp4_double_quant": "fp4 with double quantization: planned as fp4 (the second "
                        "quantization saves ~0.4 bits per weight)",
    "dtype_assumed": "no dtype in the config or the call: planned in {dtype}",
    "cuda_asked": "the script asked torch.cuda.is_available() ({where}) and was told False (no "
                  "GPU here); on the GPU it is True, so what the script sets from it (e.g. "
                  "fp16=torch.cuda.is_available()) was read as it would run without one — write "
                  "those values out in the script, or give them as flags (--precision …)",
    "fsdp": "FSDP from {where} ({strategy}, FSDP{version}): planned per rank as HF Trainer and "
            "accelerate run it — gradients reduce-scattered in the run's 16-bit dtype (accelerate's "
            "mixed-precision policy), unsharded gradients kept between accumulation micro-steps "
            "(no_sync)",
    "engine_ignored": "the {engine} setting {what} is planned without (the --sharding given "
                      "plans its engine as asked): the plan may be under",
    "zero_param_offload_alone": "DeepSpeed offload_param without offload_optimizer: planned "
                                "with the parameter partitions on the GPU (an upper bound)",
    "deepspeed_optimizer": "the DeepSpeed config's optimizer {type} ({where}) steps, not "
                           "args.optim: planned as AdamW in one fused kernel (DeepSpeed's "
                           "FusedAdam, or its CPU Adam under offload_optimizer)",
    "zero_knob": "the DeepSpeed config's zero_optimization.{key} = {value:,} elements: plan "
                 "models {planned:,} (HF's \"auto\" from the hidden size, or DeepSpeed's "
                 "default){how}",
    "no_gpu": "no GPU named and none on this machine: what fits is unknown, so no change to the "
              "script is said (give --gpu)",
}


def note_words(n: ScriptNote) -> str:
    data = n.data
    if n.kind == "padded":
        data = {**data, "how": _PADDED_AS.get(data.get("attention", "sdpa"), _PADDED_AS["sdpa"])}
    if n.kind == "fsdp" and int(data.get("version", 2)) == 2:
        # accelerate's fsdp2_prepare_model shards a model still on the host: fully_shard moves
        # each unit to the GPU whole, then shards it (a review); plan's FSDP2 arrives sharded
        return NOTE_WORDS["fsdp"].format(**data) + (
            "; accelerate's fully_shard of the model on the host moves each unit to the GPU "
            "whole before sharding it: the full-size blocks that frees stay reserved, which the "
            "reserved peak does not count (the allocated peak is not affected)")
    if n.kind == "zero_knob":
        data = {**data, "how": " — the plan may be under: more is held than planned" if
                data["more"] else " — an upper bound there"}
    said = NOTE_WORDS[n.kind].format(**data)
    if n.kind == "padding_free_mask" and n.data.get("flex"):
        said += ("; flex_attention builds a block mask of the packing instead of the dense one: "
                 "planned with the dense mask, an over-prediction")
    return said


def length_words(ln: LengthStats, micro_batch: int, quantile_grid: bool | None = None,
                 seq_len_flag: int | None = None) -> str:
    """``quantile_grid``: whether the grid at the quantile is shown (a plan shows it when that
    length is ≥ 10 % shorter than the longest); None where no grid follows (tune).
    ``seq_len_flag``: the length ``--seq-len`` set (planned at it instead)."""
    samples = (f"{ln.samples_read:,} samples" + ("" if ln.all_samples_read else
                                                 f" of {ln.dataset_samples or 'unknown'}")
               + f" collated alone: min {ln.sample_min}, median {ln.sample_median:g}, max "
               f"{ln.sample_max}") if ln.samples_read else "samples: not readable one by one"
    batches = (f"{ln.batches_read:,} batches of {micro_batch} in the trainer's own order"
               + ("" if ln.batches_total in (None, ln.batches_read) else
                  f" (of {ln.batches_total:,})")
               + (" (each one row of its samples concatenated)" if ln.padding_free else "")
               + f": p{ln.quantile * 100:g} {ln.batch_quantile_length}, max {ln.batch_max_length}")
    longest = (f"{ln.longest} positions per sample (a row of {micro_batch} × {ln.longest} "
               "positions)" if ln.padding_free else f"{ln.longest}")
    q = f"p{ln.quantile * 100:g}"
    grid = "" if quantile_grid is None else f"; the grid is also shown at the {q}" \
        if quantile_grid else (f"; no second grid at the {q} (shown when it is ≥ 10 % shorter "
                               "than the longest and --seq-len is not given)")
    if seq_len_flag is not None:
        return (f"sequence lengths (tokens, padding included): {samples}; {batches}. The pick is "
                f"planned at --seq-len {seq_len_flag} (the command line); the longest batch the "
                f"data makes is {longest}")
    return (f"sequence lengths (tokens, padding included): {samples}; {batches}. The pick is "
            f"planned at the longest batch the data makes, {longest} (every epoch reaches "
            f"it){grid}")


def _weights_words(rec: dict[str, Any]) -> str:
    """How the script's model was read: plan loads ``from_pretrained`` weights on the meta device,
    but a model the script builds itself (``from_config``) is built for real on its device (an
    audit: 304M fp32 parameters built on the CPU were said to be read 'without weights')."""
    if rec["mode"] != "plan":
        return "with its weights"
    on = rec.get("model", {}).get("device")
    if on in (None, "meta"):
        return "without weights (meta device)"
    return (f"with weights the script built itself on {on} (plan skips from_pretrained's "
            "loading, not a model made from a config)")


def check_words(c: ModelCheck, on: str | None = "meta") -> str:
    verdict = "equal" if c.equal else "DIFFERENT"
    return (f"model check ({verdict}): parameters {c.script_total_params:,} in the script / "
            f"{c.planned_total_params:,} planned; trainable {c.script_trainable_params:,} / "
            f"{c.planned_trainable_params:,}; LoRA layers {c.script_lora_layers} / "
            f"{c.planned_lora_layers}; frozen weights outside 4-bit layers "
            f"{c.script_frozen_bytes:,} B / {c.planned_frozen_bytes:,} B ("
            + ("counts, on meta" if on in (None, "meta") else
               f"counts; the script's model on {on}, the plan's on meta") + ")")


def change_words(changes: list[KeywordChange]) -> list[str]:
    """One line per place to edit: ``TrainingArguments(per_device_train_batch_size=8, …)``."""
    by_where: dict[str, list[str]] = {}
    for c in changes:
        value = c.after if isinstance(c.after, str) and c.after.startswith("torch.") else repr(c.after)
        by_where.setdefault(c.where, []).append(c.keyword if c.keyword == SWITCH_OFF else
                                                f"{c.keyword}={value}")
    return [f"{w}: {', '.join(kws)}" for w, kws in by_where.items()]


_FLAG_WORDS = {"bs": "batch", "mbs": "batch", "ga": "accumulation", "gas": "accumulation",
               "accum": "accumulation", "gc": "checkpointing", "ckpt": "checkpointing",
               "grad": "gradient", "workers": "workers", "compile": "compile"}
"""Short flag words and the keyword word each stands for (``--bs`` → batch)."""
_GENERIC = {"per", "device", "train", "size", "steps", "num", "use", "enable", "dataloader"}


def _related(flag: str, keyword: str) -> bool:
    """Whether a flag's name may set a keyword: a shared word (``--batch-size`` and
    ``per_device_train_batch_size``), a prefix (``--grad-accum``: gradient, accumulation) or a
    known short form (``--bs``, ``--gc``)."""
    words = {_FLAG_WORDS.get(w, w) for w in re.split(r"[-_]", flag.lstrip("-").lower()) if w}
    keys = set(keyword.lower().split("_")) - _GENERIC
    return any(len(w) >= 2 and (k.startswith(w) or w.startswith(k)) for w in words - _GENERIC
               for k in keys)


def _carries(value: Any, before: Any) -> bool:
    """Whether a flag's value (typed, a bare switch being True) is a keyword's value before the
    change: a bool keyword's by a bool, an int or str keyword's by its text."""
    if isinstance(before, bool):
        return isinstance(value, bool) and value == before
    return isinstance(before, (int, str)) and not isinstance(value, bool) \
        and str(value) == str(before)


# The words a script's own flag may take to choose a trainer's boolean keyword by value
# (``--precision fp16``, ``--mixed-precision bf16``: Lightning's and accelerate's spellings too)
_VALUE_NAMES = {"fp16": {"fp16", "float16", "half", "16-mixed"},
                "bf16": {"bf16", "bfloat16", "bf16-mixed"}, "tf32": {"tf32"}}
# A bare number names a precision only under a precision's flag (Lightning's ``--precision
# 16``): ``--batch-size 16`` is not fp16 (a review)
_NUMBER_NAMES = {"fp16": {"16"}}
_PRECISION_FLAG_WORDS = {"precision", "dtype", "amp", "mixed", "fp", "half"}


def _names(value: Any, c: KeywordChange, flag: str) -> bool:
    """Whether a flag's value names a boolean keyword the change turns off (``--precision
    fp16`` for ``fp16`` True → False, whatever the flag's name: an audit; ``16`` under a
    precision's flag alone)."""
    if c.before is not True or isinstance(value, bool):
        return False
    text = str(value).lower()
    if text in _VALUE_NAMES.get(c.keyword, {c.keyword.lower()}):
        return True
    words = set(re.split(r"[-_]", flag.lstrip("-").lower()))
    return text in _NUMBER_NAMES.get(c.keyword, set()) and bool(words & _PRECISION_FLAG_WORDS)


def own_flag_words(command: list[str], changes: list[KeywordChange],
                   parsed: list[dict[str, Any]] | None = None) -> str | None:
    """Where the script's own command line carries what the change replaces: a flag whose name
    may set a changed keyword and whose value is the keyword's (``--bs 4`` for
    ``per_device_train_batch_size`` 4), or a switch that may turn a changed one on (``--gc``
    for ``gradient_checkpointing`` True → False).  The keywords are what its trainer holds,
    which it may set from those flags — said as such, the flags named (a QA run's script took
    its batch from its argparse).  An audit: ``--lora-r 4`` and ``--steps 4`` were named for
    their value alone, and ``--gc`` was missed.  None where no flag does."""
    found: list[str] = []
    for i, tok in enumerate(command):
        if not tok.startswith("--"):
            continue
        flag, eq, val = tok.partition("=")
        nxt = command[i + 1] if i + 1 < len(command) else ""
        switch = not eq and (not nxt or nxt.startswith("-"))
        if not eq and not switch:
            val = nxt
        for c in changes:
            # a bare switch is True; "true" / "1" / "yes" given to a bool keyword's flag too
            value = True if switch else (val.lower() in ("true", "1", "yes") or val) \
                if isinstance(c.before, bool) else val
            if (_related(flag, c.keyword) and _carries(value, c.before)) or \
                    (not switch and _names(val, c, flag)):
                found.append(flag if switch else f"{flag} {val}")
                break
    # flags the command line left at the script's argparse default (HfArgumentParser's, the
    # keywords themselves, are not recorded: script/hooks.py; a plain argparse flag spelled
    # like the keyword, --per_device_train_batch_size, is the script's own and named — an
    # audit found it skipped)
    given = {f.partition("=")[0] for f in command if f.startswith("--")}
    defaults: list[str] = []
    for opt in parsed or []:
        # its long spelling, which names what it sets (``-p, --precision``: a review)
        flag = max(opt["flags"], key=len) if opt.get("flags") else None
        if flag is None or any(f in given for f in opt["flags"]):
            continue
        v = opt.get("value")
        for c in changes:
            if (_related(flag, c.keyword) and _carries(v, c.before)) or _names(v, c, flag):
                defaults.append(f"{flag} (its default {v})")
                break
    if not found and not defaults:
        return None
    said = ", ".join([*found, *defaults])
    where = "command line and argparse defaults carry" if defaults and found else \
        "argparse defaults carry" if defaults else "command line carries"
    return (f"the script's own {where} what the change replaces ({said}): where the script "
            "sets these keywords from its flags, change the flags instead")


def _read_rows(read: ReadJob, rec: dict[str, Any], f: dict[str, Any],
               given: frozenset[str] = frozenset()) -> list[tuple[str, str, str]]:
    """``f``: the job as planned (what was read, with the command line's flags over it);
    ``given``: the fields the command line set (credited to it, the script's value beside)."""
    m = rec["model"]
    flag = "the command line"
    r = read.fields

    def src(keys: tuple[str, ...], script_from: str, script_value: str) -> str:
        if not set(keys) & given:
            return script_from
        return f"{flag} (the script: {script_value})" if script_value else flag
    load = next((ld for ld in rec["loads"] if ld["this_model"]), None)
    rows = [("model", f"{m['class']} {f['model']}", f"from_pretrained ({load['at']})" if load
             else "the trainer's model")]
    method = f["method"]
    if method != "full":
        layers = f" ({len(rec['lora']['adapted'])} modules)" if rec["lora"] else ""
        method += (f": LoRA r={f['lora_r']} alpha={f['lora_alpha']} dropout {f['lora_dropout']} "
                   f"on {','.join(f['lora_targets'])}{layers}")
    if f.get("quant"):
        method += f", 4-bit {f['quant']}"
    rows.append(("method", method, src(
        ("method", *(k for k in given if k.startswith(("lora_", "quant")))),
        "BitsAndBytesConfig + LoraConfig" if f.get("quant") else
        "LoraConfig" if rec["lora"] else "every weight trains", r["method"])))
    # a full fine-tune has no frozen weight (and a frozen model no trainable one): not "None"
    weights = ", ".join(f"{kind} {m[kind + '_dtype']}" for kind in ("frozen", "trainable")
                        if m.get(kind + "_dtype")) or "none"
    rows.append(("precision", f"{f['precision']} (weights: {weights}; "
                 f"bf16={rec['args']['bf16']} fp16={rec['args']['fp16']})",
                 src(("precision", "base_dtype"), rec["args"]["class"], r.get("precision", ""))))
    # fused / foreach / for-loop are torch's AdamW and SGD implementations; Adafactor and the
    # bitsandbytes optimizers have one each
    impl = f" ({f['optimizer_impl']})" if f["optimizer"] in ("adamw", "sgd") else ""
    rows.append(("optimizer", f"{f['optimizer']}{impl}",
                 read.where.get("optimizer", flag)))
    rows.append(("micro-batch × accumulation × ranks",
                 f"{f['micro_batch']} × {f['grad_accum']} × {f['ranks']}",
                 src(("micro_batch", "grad_accum", "ranks", "effective_batch"), rec["args"]["class"],
                     f"{r['micro_batch']} × {r['grad_accum']} × {r['ranks']}")))
    if f.get("sharding", "none") != "none" or "sharding" in read.where or "sharding" in given:
        # the engine each rank runs: FSDP or DeepSpeed ZeRO, read from the script's arguments or
        # accelerate's launch environment (trainfit.script.sharding), or the command line's
        engine = f.get("sharding", "none") + (f", offload {f['offload']}"
                                              if f.get("offload", "none") != "none" else "")
        # the script's own engine, as it runs, beside a --sharding given (its fields are then not
        # read: "none" had been said of an FSDP script)
        own = rec["args"].get("sharding") or {}
        script_engine = r.get("sharding") or (
            "fsdp" if own.get("engine") == "fsdp" else
            f"DeepSpeed ZeRO-{own['stage']}" if own.get("engine") == "deepspeed" else "none")
        rows.append(("data parallel", engine, src(("sharding", "offload"),
                                                  read.where.get("sharding", "DDP"),
                                                  script_engine)))
    # reentrant or not changes what the recompute holds: said (an audit: "full" alone)
    ckpt = f["grad_ckpt"] + ((" (reentrant)" if f.get("ckpt_reentrant") else " (non-reentrant)")
                             if f["grad_ckpt"] == "full" else "")
    rows.append(("checkpointing", ckpt,
                 src(("grad_ckpt",), read.where["grad_ckpt"], r["grad_ckpt"])))
    rows.append(("loss", "trl's chunked log-prob head (tiles of 4,096 tokens × 32,768 "
                 "vocabulary entries)" if f.get("trl_logprob_head") else
                 "whole logits (transformers' loss)", read.where.get("loss", rec["trainer"])))
    rows.append(("attention", f"{f['attention']} ({m['attn_implementation']})",
                 src(("attention",), "the model config", r["attention"])))
    rows.append(("sequence length", f"{f['seq_len']}" + ("" if "seq_len" in given else
                                                         " (the longest batch)"),
                 src(("seq_len",), "the script's data and collator", str(r["seq_len"]))))
    return rows


def render_script_read(sp: ScriptPlan | Any, console: Console | None = None) -> None:
    """What was read; ``sp`` (a plan's or tune's) has ``command``, ``record``, ``read``,
    ``current``, ``given``, ``check``, ``notes``."""
    con = console or out_console()
    rec = sp.record
    con.print(f"[bold]{rec['trainer']}[/bold] of `{shlex.join(sp.command)}` — read "
              + _weights_words(rec))
    t = Table(title="read from the script")
    for col in ("", "as trainfit plans it", "from"):
        t.add_column(col)
    given = sp.given
    for row in _read_rows(sp.read, rec, sp.current.to_dict(), given):
        t.add_row(*row)
    con.print(t)
    # a plan (not tune's read) says whether its grid at the quantile follows
    grid = sp.plan_quantile is not None if hasattr(sp, "plan_quantile") else None
    con.print(length_words(sp.read.lengths, sp.read.fields["micro_batch"], grid,
                           sp.current.seq_len if "seq_len" in given else None))
    if sp.check is not None:
        con.print(check_words(sp.check, rec.get("model", {}).get("device")))
    for n in [*sp.read.notes, *sp.notes]:
        con.print(f"  note: {note_words(n)}")


def plan_change_heading(sp: Any) -> str:
    """The line above a plan's script change.  A pick slower than the script's own configuration
    comes from the flags given: said with its ratio (a review: `--micro-batch 2` gave a 0.51×
    change under the same heading as a gain)."""
    ratio = sp.plan.speedup_vs_current
    why = ", as the flags given set it" if getattr(sp, "given", None) else ""
    slower = (f"predicted {ratio:.2f}× the tokens/s the script runs now — slower{why}; "
              if ratio is not None and ratio < 1 else "")
    return (f"[bold]change in the script[/bold] ({slower}the effective batch kept, "
            f"{sp.current.effective_batch}):")


def render_script_plan(sp: ScriptPlan) -> None:
    from trainfit.render.plan import render_plan

    con = out_console()
    render_script_read(sp, con)
    render_plan(sp.plan)
    q = sp.plan_quantile
    ln = sp.read.lengths
    if q is None and ln.batch_quantile_length < ln.longest:
        con.print(f"the p{ln.quantile * 100:g} batch length ({ln.batch_quantile_length}) is within "
                  f"{1 - QUANTILE_PLAN_BELOW:.0%} of the longest ({ln.longest}): not planned apart")
    if q is not None and q.pick is not None:
        j = q.pick.job
        con.print(f"at the p{sp.read.lengths.quantile * 100:g} batch length ({j.seq_len}) the grid's "
                  f"pick is {j.precision}, checkpointing {j.grad_ckpt}, {j.micro_batch} × "
                  f"{j.grad_accum} (predicted); the pick above is planned at the longest batch "
                  f"({sp.current.seq_len}), which every epoch reaches")
    if sp.changes:
        con.print(plan_change_heading(sp))
        for line in change_words(sp.changes):
            con.print(f"  {line}", markup=False, highlight=False)
        if (own := own_flag_words(sp.command, sp.changes, sp.record.get("argparse"))) \
                is not None:
            con.print(f"  {own}", markup=False, highlight=False)
    elif sp.plan.pick is not None and sp.plan.gpu:
        con.print("[bold]no change[/bold]: the script's configuration is the pick")


def script_plan_json(sp: ScriptPlan) -> dict[str, Any]:
    from trainfit.render.words import plan_json

    rec = dict(sp.record)
    return {"kind": "plan-script", "command": sp.command, "read": rec,
            "job": sp.current.to_dict(),
            "script_job": None if sp.as_read is None else sp.as_read.to_dict(),
            "given": sorted(sp.given), "lengths": dataclasses.asdict(sp.read.lengths),
            "where": sp.read.where,
            "notes": [note_words(n) for n in [*sp.read.notes, *sp.notes]],
            "model_check": None if sp.check is None else {**dataclasses.asdict(sp.check),
                                                          "equal": sp.check.equal},
            "plan": plan_json(sp.plan),
            "plan_quantile": None if sp.plan_quantile is None else plan_json(sp.plan_quantile),
            "changes": [dataclasses.asdict(c) for c in sp.changes],
            "change_lines": change_words(sp.changes)}


def _change_source(result: Any) -> str:
    """Where the script's change comes from: a pick the interleaved rounds confirmed faster than
    the script's configuration, or the search's best they did not (a review: the budget's cut
    rounds still read "measured by tune", a line under "no speed-up this run could confirm")."""
    vs = result.vs_baseline
    if vs is None or vs.verdict == "faster":
        return "measured by tune"
    cut = any(n.kind == "budget" for n in result.notes)
    return ("the search's best, not confirmed faster than yours" +
            (": --budget-s stopped the rounds — tune again with more budget to decide"
             if cut else ""))


def render_script_tune(st: Any) -> None:
    """``st``: a trainfit.script.tune.ScriptTune."""
    from trainfit.render.tune import render_tune

    con = out_console()
    render_script_read(st, con)
    render_tune(st.result)
    pick = st.result.pick
    if pick is None:
        return
    m = pick.result.measured
    if st.changes:
        con.print(f"[bold]change in the script[/bold] ({_change_source(st.result)}; the "
                  f"effective batch kept, {st.current.effective_batch}):")
        for line in change_words(st.changes):
            con.print(f"  {line}", markup=False, highlight=False)
        if (own := own_flag_words(st.command, st.changes, st.record.get("argparse"))) \
                is not None:
            con.print(f"  {own}", markup=False, highlight=False)
    elif st.result.unconfirmed is not None:
        con.print("[bold]no change[/bold]: the script's configuration is kept — the search's "
                  "best was not confirmed faster than it (measured, above)")
    elif (undecided := sum(n.kind == "undecided" for n in st.result.notes)) or \
            any(n.kind == "budget" for n in st.result.notes):
        # nothing was confirmed either way, or not everything was tried: "the fastest" would
        # claim what the search did not show
        why = [f"{undecided} comparison(s) could not be decided"] if undecided else []
        if any(n.kind == "budget" for n in st.result.notes):
            why.append("--budget-s stopped the search before it tried everything")
        con.print("[bold]no change[/bold]: nothing measured was confirmed faster than the "
                  f"script's configuration; {'; '.join(why)} (measured, above)")
    else:
        con.print("[bold]no change[/bold]: the script's configuration is the fastest that fits "
                  "(measured)")
    if m is not None and m.step_time_s:
        con.print(f"  the pick measured: {m.peak_allocated_bytes / 2**30:.3f} GiB peak "
                  f"allocated, {m.step_time_s:.3f} s per optimizer step, "
                  f"{m.tokens_per_s:,.0f} tokens/s (non-padding tokens)")


def script_tune_json(st: Any) -> dict[str, Any]:
    from trainfit.render.tune_words import tune_json

    return {"kind": "tune-script", "command": st.command, "read": st.record,
            "job": st.current.to_dict(), "lengths": dataclasses.asdict(st.read.lengths),
            "where": st.read.where, "notes": [note_words(n) for n in st.read.notes],
            "tune": tune_json(st.result),
            "changes": [dataclasses.asdict(c) for c in st.changes],
            "change_lines": change_words(st.changes),
            "change_source": _change_source(st.result) if st.changes else None}
