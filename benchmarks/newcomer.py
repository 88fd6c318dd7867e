"""A newcomer's first hour, replayed: the README's commands run as a new user would, on a fresh
clone of this repository, each as a fresh CLI process — on a terminal of 80 and 100 columns (a
pseudo-terminal) and piped, as people run them — and the points of the issue "a newcomer's first
hour" checked on what they print:

- emit: `trainfit emit trainfit.yaml --to hf|trl|accelerate > FILE` — seconds, payload alone on
  stdout, accepted by the real TrainingArguments / SFTConfig (deprecation warnings as errors) /
  accelerate's config loader, use_cpu for the CPU-tuned job, the tuned knobs exactly; and
  `tune trainfit.yaml --emit hf` (no search again);
- plan: the header line (assumptions + stack versions), no cut number (no "…") at 80 / 100
  columns and piped, table lines within the terminal, rows shown of all configurations (without
  --effective-batch too), no bitsandbytes kernels-community line, progress lines on stderr;
- tune: its table at 100 columns and piped; train: progress lines (step/total, ETA) piped;
- the seeds' questions: each seed's plan says what its notes asked (observed vs predicted and
  what settles it, runs entirely on the GPU / what makes HF offload, host RAM, the effective
  batch changes, the stand-in's scale).

Writes benchmarks/results/newcomer.{json,md}. Takes ~15 min on this 2-core machine (the README's
tune is most of it). `--md-only` rewrites the table from the JSON.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"
ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]")
BNB_NOISE = "Failed to load CPU gemm_4bit_forward"
SEEDS = ("seed000_t4_gemma_lora", "seed001_granite_qlora", "seed002_3080_chatlm_sft",
         "seed003_a6000_gpt_pretrain", "seed004_4gb_gpt2_scratch")
SEED_ANSWERS = {  # what each seed's notes asked, as the plan must say it
    "seed000_t4_gemma_lora": ["your notes saw 2.60 GiB", "assumed, not in your notes",
                              "what settles it"],
    "seed001_granite_qlora": ["the pick runs entirely on the GPU", "device_map=\"auto\""],
    "seed002_3080_chatlm_sft": ["host RAM: 6.52 GiB free", "effective batch 16→64"],
    "seed003_a6000_gpt_pretrain": ["effective batch 120→128", "stands in for your model",
                                   "if every peak were"],  # its ratio moves with the model
    "seed004_4gb_gpt2_scratch": ["pick:", "the pick runs entirely on the GPU"],
}
README_TUNE = ["tune", "llama-tiny-58m", "--data", "examples/data/tiny_text.jsonl", "--seq-len", "64",
               "--effective-batch", "8", "--micro-batch", "1", "--device", "cpu", "--memory-limit",
               "1.2GiB", "--out", "trainfit.yaml"]


def _env(clone: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["PYTHONPATH"] = str(clone / "src")  # the clone's code, as an install of it would run
    return env


def _cmd(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "trainfit.cli.main", *args]


def piped(clone: Path, args: list[str], timeout: int = 1800) -> dict[str, Any]:
    t0 = time.perf_counter()
    p = subprocess.run(_cmd(args), cwd=clone, env=_env(clone), capture_output=True, text=True,
                       timeout=timeout)
    return {"args": args, "rc": p.returncode, "wall_s": time.perf_counter() - t0,
            "stdout": p.stdout, "stderr": p.stderr}


def terminal(clone: Path, args: list[str], cols: int, timeout: int = 1800) -> dict[str, Any]:
    """Run on a pseudo-terminal ``cols`` wide (stdout and stderr both the terminal, as a person
    sees them); returns the text without colours and cursor codes."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 60, cols, 0, 0))
    t0 = time.perf_counter()
    p = subprocess.Popen(_cmd(args), cwd=clone, env=_env(clone), stdout=slave, stderr=slave,
                         stdin=subprocess.DEVNULL)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    p.wait(timeout=timeout)
    os.close(master)
    text = ANSI.sub("", b"".join(chunks).decode(errors="replace")).replace("\r", "")
    return {"args": args, "cols": cols, "rc": p.returncode, "wall_s": time.perf_counter() - t0,
            "text": text}


ROW = re.compile(r"^\s*[★▲]?\s*(fp32|amp-fp16|amp-bf16|bf16-true)\s|^\s*\d+\s+[a-z]+\s+\d+×\d+")


def _table_lines(text: str) -> list[str]:
    """The lines of tables (a row of a plan or tune table, or its rule), not prose or progress."""
    return [ln for ln in text.splitlines() if "────" in ln or ROW.search(ln)]


SPINNER = re.compile("[\u2800-\u28ff]|probing")
CUT = re.compile(r"\S…")


def _not_progress(text: str) -> str:
    """The text without the progress frames rich redraws on the terminal (plan's bar, tune's
    "probing…" spinner): what stays on the screen is what is checked."""
    return "\n".join(ln for ln in text.splitlines()
                     if "plan:" not in ln and "━" not in ln and not SPINNER.search(ln))


def layout_checks(text: str, cols: int | None) -> dict[str, Any]:
    text = _not_progress(text)
    lines = _table_lines(text)
    # a cut cell ends in "…" ("allo…", "12.3…"); a range in prose ("-13% … +10%") is not one
    return {"cut_cells": len(CUT.findall(text)),
            "widest_table_line": max((len(ln.rstrip()) for ln in lines), default=0),
            "within_terminal": cols is None or all(len(ln.rstrip()) <= cols for ln in lines)}


def plan_checks(run: dict[str, Any], text: str, stderr: str) -> dict[str, Any]:
    return {"header": "planned for:" in text and "transformers " in text and "torch " in text,
            "bnb_noise_lines": (text + stderr).count(BNB_NOISE),
            "progress_lines": sum(ln.startswith("plan:") for ln in stderr.splitlines()),
            "progress_on_terminal": "plan:" in text,
            "wall_s": round(run["wall_s"], 1)}


def emit_checks(clone: Path, tuned: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    validate = {
        "hf": "from transformers import TrainingArguments; import json,sys; "
              "a=TrainingArguments(output_dir='o', **json.load(open(sys.argv[1]))); "
              "print(json.dumps({'use_cpu': a.use_cpu, 'micro': a.per_device_train_batch_size, "
              "'accum': a.gradient_accumulation_steps, 'bf16': a.bf16, "
              "'ckpt': a.activation_checkpointing}))",
        "trl": "from trl import SFTConfig; import json,sys; "
               "a=SFTConfig(output_dir='o', **json.load(open(sys.argv[1]))); "
               "print(json.dumps({'use_cpu': a.use_cpu, 'micro': a.per_device_train_batch_size, "
               "'accum': a.gradient_accumulation_steps, 'bf16': a.bf16, 'packing': a.packing, "
               "'ckpt': a.activation_checkpointing}))",
        "accelerate": "from accelerate.commands.config.config_args import load_config_from_file; "
                      "import json,sys; c=load_config_from_file(sys.argv[1]); "
                      "print(json.dumps({'use_cpu': c.use_cpu, 'distributed_type': "
                      "c.distributed_type.value, 'num_processes': c.num_processes}))"}
    for target, code in validate.items():
        r = piped(clone, ["emit", "trainfit.yaml", "--to", target])
        f = clone / f"emitted.{target}"
        f.write_text(r["stdout"])
        v = subprocess.run([sys.executable, "-W", "error::FutureWarning", "-c", code, str(f)],
                           cwd=clone, env=_env(clone), capture_output=True, text=True, timeout=600)
        built = json.loads(v.stdout.strip().splitlines()[-1]) if v.returncode == 0 else None
        out[target] = {"rc": r["rc"], "wall_s": round(r["wall_s"], 2),
                       "stdout_is_payload_only": bool(r["stdout"].strip()) and r["stdout"].lstrip()[0]
                       in "{c", "accepted_by_library": v.returncode == 0,
                       "library_error": None if v.returncode == 0 else v.stderr.strip()[-300:],
                       "built": built}
        if built and "micro" in built:
            out[target]["knobs_match"] = (built["micro"], built["accum"]) == (
                tuned["micro_batch"], tuned["grad_accum"])
    r = piped(clone, ["tune", "trainfit.yaml", "--emit", "hf"])
    out["tune_file_emit_hf"] = {"rc": r["rc"], "wall_s": round(r["wall_s"], 2),
                                "searched_again": "probes on" in r["stderr"]}
    return out


def _save(res: dict[str, Any]) -> None:
    """What is measured so far (a run on a loaded host is long: nothing measured is lost)."""
    (OUT / "newcomer.partial.json").write_text(json.dumps(res, indent=1))


def quickstart_stage(clone: Path, res: dict[str, Any]) -> None:
    """The quick start: plan the embedded default, at 100 and 80 columns and piped."""
    q100 = terminal(clone, ["quickstart"], 100)
    q80 = terminal(clone, ["plan", "examples/seed000_t4_gemma_lora.yaml"], 80)
    qp = piped(clone, ["quickstart"])
    res["quickstart"] = {
        "cols100": {**layout_checks(q100["text"], 100), **plan_checks(q100, q100["text"], "")},
        "cols80": {**layout_checks(q80["text"], 80),
                   # the legend wraps at 80 columns, possibly inside these words
                   "left_out": " ".join((re.findall(r"narrow\s+terminal:\s+([^(]*?)\s+left\s+out",
                                                    q80["text"]) or [""])[0].split())},
        "piped": {**layout_checks(qp["stdout"], None), **plan_checks(qp, qp["stdout"], qp["stderr"])},
    }


def seeds_stage(clone: Path, res: dict[str, Any]) -> None:
    """Every seed on a 100-column terminal: its answers, its layout, no noise."""
    res["seeds"] = {}
    for seed in SEEDS:
        t = terminal(clone, ["plan", f"examples/{seed}.yaml"], 100)
        flat = " ".join(t["text"].split())
        res["seeds"][seed] = {**layout_checks(t["text"], 100), **plan_checks(t, t["text"], ""),
                              "answers": {a: a in flat for a in SEED_ANSWERS[seed]}}
        _save(res)


def no_effective_batch_stage(clone: Path, res: dict[str, Any]) -> None:
    """Plan without --effective-batch: rows shown of all configurations."""
    nb = piped(clone, ["plan", "gpt2", "--gpu", "a100-80gb", "--seq-len", "512", "--json"])
    d = json.loads(nb["stdout"])
    res["no_effective_batch"] = {"configurations": len(d["configs"]),
                                 "shown": sum(c["shown"] for c in d["configs"]),
                                 "effective_batches": sorted({c["effective_batch"]
                                                              for c in d["configs"]}),
                                 "said": bool(d.get("batch_note")),
                                 "wall_s": round(nb["wall_s"], 1)}


def tune_emit_train_stage(clone: Path, res: dict[str, Any]) -> None:
    """The README's tune on a 100-column terminal; emit from what it wrote; train piped."""
    import yaml

    budget = [] if res.get("tune_budget_s") is None else ["--budget-s", f"{res['tune_budget_s']:g}"]
    tu = terminal(clone, README_TUNE + budget, 100, timeout=7200)
    res["tune"] = {**layout_checks(tu["text"], 100), "rc": tu["rc"], "wall_s": round(tu["wall_s"], 1)}
    tuned = yaml.safe_load((clone / "trainfit.yaml").read_text())
    res["tuned"] = {k: tuned.get(k) for k in ("micro_batch", "grad_accum", "precision", "grad_ckpt",
                                             "packing", "device", "memory_limit")}
    res["emit"] = emit_checks(clone, tuned)
    _save(res)
    tr = piped(clone, ["train", "trainfit.yaml", "--out", "run", "--max-steps", "3"])
    lines = [ln for ln in tr["stderr"].splitlines() if ln.startswith("step ")]
    res["train_piped"] = {"rc": tr["rc"], "progress_lines": len(lines),
                          "first": lines[0] if lines else None, "last": lines[-1] if lines else None,
                          "has_total_and_eta": bool(lines) and "/3 " in lines[-1] and "ETA" in lines[-1],
                          "wall_s": round(tr["wall_s"], 1)}


STAGES = {"quickstart": quickstart_stage, "seeds": seeds_stage,
          "no_effective_batch": no_effective_batch_stage, "tune_emit_train": tune_emit_train_stage}


def run_all(clone: Path, res: dict[str, Any], stages: list[str]) -> dict[str, Any]:
    for name in stages:
        STAGES[name](clone, res)
        _save(res)
    return res


def verdicts(res: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(check, measured, passed) rows of the report."""
    q, e = res["quickstart"], res["emit"]
    rows = [
        ("emit hf / trl / accelerate: seconds (target < 2)",
         " / ".join(f"{e[t]['wall_s']:.2f}" for t in ("hf", "trl", "accelerate")),
         all(e[t]["wall_s"] < 2 for t in ("hf", "trl", "accelerate"))),
        ("emit: payload alone on stdout, accepted by the library (FutureWarning = error)",
         ", ".join(f"{t} {'yes' if e[t]['accepted_by_library'] else 'NO'}"
                   for t in ("hf", "trl", "accelerate")),
         all(e[t]["stdout_is_payload_only"] and e[t]["accepted_by_library"]
             for t in ("hf", "trl", "accelerate"))),
        ("emit: use_cpu for the CPU-tuned job; the tuned micro × accum",
         f"use_cpu {[e[t]['built'] and e[t]['built']['use_cpu'] for t in ('hf', 'trl', 'accelerate')]},"
         f" knobs match {[e[t].get('knobs_match') for t in ('hf', 'trl')]}",
         all(e[t]["built"] and e[t]["built"]["use_cpu"] for t in ("hf", "trl", "accelerate"))
         and all(e[t].get("knobs_match") for t in ("hf", "trl"))),
        ("tune trainfit.yaml --emit hf: no search again",
         f"{e['tune_file_emit_hf']['wall_s']:.2f} s, searched again: "
         f"{e['tune_file_emit_hf']['searched_again']}",
         not e["tune_file_emit_hf"]["searched_again"] and e["tune_file_emit_hf"]["wall_s"] < 2),
        ("plan header (assumptions + torch/transformers/peft/bitsandbytes versions)",
         f"100 cols {q['cols100']['header']}, piped {q['piped']['header']}",
         q["cols100"]["header"] and q["piped"]["header"]),
        ("cut numbers (…) in plan at 100 / 80 columns / piped",
         f"{q['cols100']['cut_cells']} / {q['cols80']['cut_cells']} / {q['piped']['cut_cells']}",
         q["cols100"]["cut_cells"] == q["cols80"]["cut_cells"] == q["piped"]["cut_cells"] == 0),
        ("plan table lines within the terminal (100 / 80 columns); piped: widest line",
         f"{q['cols100']['within_terminal']} / {q['cols80']['within_terminal']}"
         f" (80: {q['cols80']['left_out'] or 'nothing'} left out); piped "
         f"{q['piped']['widest_table_line']} chars",
         q["cols100"]["within_terminal"] and q["cols80"]["within_terminal"]),
        ("cut numbers in every seed's plan at 100 columns",
         str(sum(s["cut_cells"] for s in res["seeds"].values())),
         all(s["cut_cells"] == 0 and s["within_terminal"] for s in res["seeds"].values())),
        ("tune table at 100 columns: cut numbers, within the terminal",
         f"{res['tune']['cut_cells']}, {res['tune']['within_terminal']}",
         res["tune"]["cut_cells"] == 0 and res["tune"]["within_terminal"]),
        ("bitsandbytes 'Failed to load CPU gemm_4bit_forward' lines (all plans)",
         str(q["piped"]["bnb_noise_lines"] + sum(s["bnb_noise_lines"]
                                                 for s in res["seeds"].values())),
         q["piped"]["bnb_noise_lines"] == 0
         and all(s["bnb_noise_lines"] == 0 for s in res["seeds"].values())),
        ("plan progress lines on stderr, piped (quickstart)", str(q["piped"]["progress_lines"]),
         q["piped"]["progress_lines"] >= 2),
        ("train piped: progress lines with step/total and ETA",
         f"{res['train_piped']['progress_lines']}: {res['train_piped']['last']}",
         res["train_piped"]["has_total_and_eta"]),
        ("plan without --effective-batch: rows shown / configurations, batches said",
         f"{res['no_effective_batch']['shown']} / {res['no_effective_batch']['configurations']} "
         f"(effective batches {res['no_effective_batch']['effective_batches'][0]}–"
         f"{res['no_effective_batch']['effective_batches'][-1]}); said: "
         f"{res['no_effective_batch']['said']}",
         res["no_effective_batch"]["shown"] < res["no_effective_batch"]["configurations"]
         and res["no_effective_batch"]["said"]),
    ]
    for seed, s in res["seeds"].items():
        missing = [a for a, ok in s["answers"].items() if not ok]
        rows.append((f"{seed[:7]}: the plan answers the notes",
                     "all said" if not missing else "missing: " + "; ".join(missing),
                     not missing))
    return rows


def write(res: dict[str, Any]) -> None:
    rows = verdicts(res)
    (OUT / "newcomer.json").write_text(json.dumps({**res, "checks": [
        {"check": c, "measured": m, "pass": ok} for c, m, ok in rows]}, indent=1))
    seeds = res["seeds"]
    md = ["# A newcomer's first hour, replayed", "",
          "`python benchmarks/newcomer.py`: the README's commands on a fresh clone, each a fresh "
          "process, on a pseudo-terminal of 100 / 80 columns and piped (this 2-core machine, "
          "shared). Seconds are measured wall time of the whole command.", "",
          "| check | measured | pass |", "|---|---|---|"]
    md += [f"| {c} | {m} | {'yes' if ok else 'NO'} |" for c, m, ok in rows]
    md += ["", "Plan wall time per seed (s, 100-column terminal): "
           + ", ".join(f"{k[:7]} {v['wall_s']:.0f}" for k, v in seeds.items())
           + f"; the README's tune: {res['tune']['wall_s']:.0f} s"
           + ("" if res.get("tune_budget_s") is None else
              f" (run with --budget-s {res['tune_budget_s']:g}, a guard against a loaded host)")
           + f"; train 3 steps piped: {res['train_piped']['wall_s']:.0f} s.", "",
           "Before (the issue, same commands): `tune trainfit.yaml --emit` searched again "
           "(205-313 s) and printed bf16 for an fp32 file; headers cut to `allo… rese… devi…` at 100 "
           "columns; every configuration a row (72 without --effective-batch); the "
           "kernels-community line twice per plan; plan silent for 12-94 s; train piped silent "
           "until the end.", ""]
    if res.get("commits"):
        md += ["Measured at commit: " + ", ".join(f"{k} {v}" for k, v in res["commits"].items())
               + ".", ""]
    (OUT / "newcomer.md").write_text("\n".join(md))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--md-only", action="store_true", help="rewrite newcomer.md from the JSON")
    ap.add_argument("--tune-budget-s", type=float, default=None,
                    help="add --budget-s to the README's tune (a loaded host: the search stops and "
                         "keeps its best so far; said in the results)")
    ap.add_argument("--redo", choices=list(STAGES), action="append",
                    help="run only these stages again (on a fresh clone) into the existing JSON")
    args = ap.parse_args()
    res: dict[str, Any] = {"tune_budget_s": args.tune_budget_s}
    if args.md_only or args.redo:
        res = json.loads((OUT / "newcomer.json").read_text())
        res.pop("checks", None)
        if args.tune_budget_s is not None:
            res["tune_budget_s"] = args.tune_budget_s
    if not args.md_only:
        with tempfile.TemporaryDirectory() as tmp:
            clone = Path(tmp) / "trainfit"
            subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
            head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, text=True,
                                  capture_output=True, check=True).stdout.strip()
            run_all(clone, res, args.redo or list(STAGES))
        commits = dict(res.get("commits") or {})
        commits.update({name: head for name in (args.redo or list(STAGES))})
        res["commits"] = commits
        res["clone"] = "fresh `git clone` of this repository's HEAD (PYTHONPATH=clone/src)"
    write(res)
    (OUT / "newcomer.partial.json").unlink(missing_ok=True)
    print((OUT / "newcomer.md").read_text())
    return 0 if all(ok for _, _, ok in verdicts(res)) else 1


if __name__ == "__main__":
    sys.exit(main())
