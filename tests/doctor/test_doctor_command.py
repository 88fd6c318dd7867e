"""Someone else's script under the doctor: hooks injected, sync-bound named; bad input."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from trainfit.cli.main import app

SYNC_SCRIPT = textwrap.dedent('''
    import sys, torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(300, 32), torch.nn.Linear(32, 300))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 300, (256, 64))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=16)
    table = [0.0] * 300
    step = 0
    while step < int(sys.argv[1]):
        for (x,) in loader:
            for _ in range(2):
                logits = model(x[:, :-1])
                per_tok = torch.nn.functional.cross_entropy(logits.reshape(-1, 300), x[:, 1:].reshape(-1),
                                                            reduction="none")
                (per_tok.mean() / 2).backward()
                for tok, val in zip(x[:, 1:].reshape(-1), per_tok.detach(), strict=True):
                    table[tok.item()] += val.item()
                print("loss", per_tok.mean().item())
            opt.step()
            opt.zero_grad()
            step += 1
            if step >= int(sys.argv[1]):
                break
''')


def test_sync_bound_script_is_named(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    # a Trainer-like output directory made before training (removed: empty when stopped) and a
    # log directory the script wrote in (kept): an audit found doctor left the empty one; an
    # empty one another process made (mkdir, not the command's Python) stays too (a review)
    script.write_text('import os, subprocess\nos.makedirs("out_dir/sub")\nos.makedirs("logs")\n'
                      'open("logs/x.txt", "w").write("x")\n'
                      'subprocess.run(["mkdir", "not_mine"], check=True)\n' + SYNC_SCRIPT)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["doctor", "--json", "--steps", "4", "--warmup", "1", "--",
                                   sys.executable, str(script), "50"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["kind"] == "doctor" and d["after"] is None and d["applied"] == []
    top = d["findings"][0]
    assert top["bottleneck"] == "sync-bound"
    # one measured window of 4 steps: each half named it (an audit found [] here)
    assert d["round_bottlenecks"] == ["sync-bound", "sync-bound"] and d["verdict_stable"]
    # 2 micro-steps × (2 × 16·63 token values + 1 loss) sync points in the loop; every one is
    # counted, the loop/model split of the untimed ones is estimated (AdamW's own 3 .item() calls)
    assert abs(top["evidence"]["sync_calls_per_step"] - 2 * (2 * 16 * 63 + 1)) <= 3
    assert top["evidence"]["micro_steps_per_step"] == 2
    assert top["evidence"]["log_calls_per_step"] == 2
    assert top["gain_fraction"] > 0
    assert d["steps_measured"] == 4
    assert d["before"]["tokens_per_s"] > 0 and d["before"]["gpu_util_percent"] is None
    assert not (tmp_path / "out_dir").exists() and (tmp_path / "logs" / "x.txt").is_file()
    assert (tmp_path / "not_mine").is_dir()
    assert any("removed what the command created" in n and "out_dir/" in n for n in d["notes"])


def test_command_not_found():
    res = CliRunner().invoke(app, ["doctor", "--", "no-such-command-xyz", "--flag"])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert lines == ["error: no-such-command-xyz: command not found"]


@pytest.mark.parametrize("verb", ["doctor", "plan", "tune"])
def test_a_missing_script_is_said_before_anything_runs(tmp_path, verb, fresh_cli):
    """``python missing.py``: one line naming the file, exit 2, before torch loads (the
    interpreter's own "can't open file" came after the hooks' setup, 5-6 s in: an audit)."""
    missing = tmp_path / "missing.py"
    res = CliRunner().invoke(app, [verb, "--", sys.executable, str(missing)])
    assert res.exit_code == 2
    assert [ln for ln in res.output.splitlines() if ln.startswith("error:")] == [
        f"error: {missing}: no such file"]
    code, err, imported = fresh_cli([verb, "--", sys.executable, str(missing)])
    assert (code, imported.get("torch")) == (2, False), err
    # the interpreter's own options before the script (a review: python -u got past the check)
    res = CliRunner().invoke(app, [verb, "--", sys.executable, "-u", "-X", "importtime",
                                   str(missing)])
    assert res.exit_code == 2 and f"error: {missing}: no such file" in res.output


def test_crashing_script_reports_code_and_last_lines(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text("import sys\nprint('loading config')\nprint('bad value: 7', file=sys.stderr)\n"
                      "sys.exit(3)\n")
    res = CliRunner().invoke(app, ["doctor", "--", sys.executable, str(script)])
    assert res.exit_code == 2
    assert "exited with code 3 after 0 optimizer steps" in res.output
    # the steps asked for said beside the fewest (an audit: "needs 5 … 3 measured" under the
    # default 8)
    assert "the fewest it measures; 10 for the 8 measured steps asked" in \
        " ".join(res.output.split())
    assert "  | loading config" in res.output and "  | bad value: 7" in res.output


def test_too_short_run_says_how_many_steps_it_needs(tmp_path):
    script = tmp_path / "short.py"
    script.write_text("import torch\nm = torch.nn.Linear(4, 4)\n"
                      "o = torch.optim.SGD(m.parameters(), lr=0.1)\nfor _ in range(3):\n"
                      "    m(torch.ones(2, 4)).sum().backward(); o.step(); o.zero_grad()\n")
    res = CliRunner().invoke(app, ["doctor", "--steps", "5", "--", sys.executable, str(script)])
    assert res.exit_code == 2
    assert "too short to measure: 3 optimizer steps" in res.output
    assert ("needs at least 5 (2 warm-up + 3 measured, the fewest it measures; all 7 for the 5 "
            "measured steps --steps asks)") in " ".join(res.output.split())


@pytest.mark.parametrize("end, said", [
    ("os.kill(os.getpid(), 9)", "was killed by signal 9 (SIGKILL: the Linux OOM killer"),
    ("os._exit(0)", "exited with code 0; its training process ended without Python's exit"),
])
def test_a_script_that_leaves_without_pythons_exit_keeps_its_step_count(tmp_path, end, said):
    """An audit: a script killed by SIGKILL (what the OOM killer sends) after 8 steps, or ended by
    os._exit after 7, was said to have made "0 optimizer steps" / "no optimizer.step() call
    seen": the hooks wrote their records at exit only.  A line a step is written as it goes."""
    script = tmp_path / "leaves.py"
    script.write_text("import os, torch\nm = torch.nn.Linear(4, 4)\n"
                      "o = torch.optim.SGD(m.parameters(), lr=0.1)\nfor i in range(8):\n"
                      "    m(torch.ones(2, 4)).sum().backward(); o.step(); o.zero_grad()\n"
                      f"{end}\n")
    res = CliRunner().invoke(app, ["doctor", "--steps", "20", "--", sys.executable, str(script)])
    assert res.exit_code == 2, res.output
    out = " ".join(res.output.split())
    assert f"{said}" in out and "after 8 optimizer steps" in out, out
    assert "no optimizer.step() call seen" not in out


def test_no_target():
    res = CliRunner().invoke(app, ["doctor"])
    assert res.exit_code == 2 and "nothing to examine" in res.output


@pytest.mark.parametrize("args, needle", [
    (["--timeout-s", "-5", "--", "python", "x.py"], "--timeout-s -5: must be a finite number of seconds > 0"),
    (["--timeout-s", "0", "--", "python", "x.py"], "--timeout-s 0: must be a finite number of seconds > 0"),
    (["--device", "cuda", "--", "python", "x.py"], "--device: for a trainfit job only"),
    (["--repeats", "3", "--no-apply", "--", "python", "x.py"],
     "--apply, --repeats: for a trainfit job only"),
    (["ok.yaml", "extra"], "extra: after the job file ok.yaml, which is examined alone"),
    # a job file's run is bounded by --steps: these were silently ignored (an audit)
    (["--timeout-s", "20", "ok.yaml"], "--timeout-s: for a command only"),
    (["--keep-running", "ok.yaml"], "--keep-running: for a command only"),
    # without --, the script's own --steps 4 was taken as the doctor's, silently (an audit)
    (["python", "x.py", "--steps", "4"], "python x.py: a command goes after --"),
])
def test_options_a_command_cannot_take_are_refused(args, needle):
    """Before anything runs: a non-positive timeout (it reported a finished script as 'still
    running after --timeout-s -5'), job-only options given with a command (ignored before)."""
    res = CliRunner().invoke(app, ["doctor", *args])
    assert res.exit_code == 2
    err = res.stderr.splitlines()
    assert err[0].startswith("error: ") and needle in err[0], res.stderr
    assert err[1].startswith("hint: ")


def test_a_sigterm_to_trainfit_kills_the_command_it_runs(tmp_path):
    """The command runs in its own session (the terminal's Ctrl-C never reaches it): trainfit
    interrupted — SIGTERM here, raised as Ctrl-C's KeyboardInterrupt — kills its group on the
    way out instead of leaving it training, orphaned."""
    import os
    import signal
    import threading
    import time

    import pytest

    from trainfit.doctor.inject import run_with_hooks

    pid_file = tmp_path / "pid"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    before = signal.getsignal(signal.SIGTERM)
    threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_with_hooks([sys.executable, "-c", child], {}, timeout_s=60)
    assert time.monotonic() - t0 < 30
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert signal.getsignal(signal.SIGTERM) is before  # the handler was put back


def test_a_script_that_asks_for_torch_before_importing_it_is_measured(tmp_path):
    """transformers, datasets and accelerate call importlib.util.find_spec("torch") before they
    import it: the doctor's post-import hook must still see the real import (a review found it
    gone at the first question, every HF Trainer / TRL script failing "never imported torch"
    after running its whole training)."""
    script = tmp_path / "train.py"
    script.write_text('import importlib.util\nassert importlib.util.find_spec("torch")\n'
                      + SYNC_SCRIPT)
    res = CliRunner().invoke(app, ["doctor", "--json", "--steps", "3", "--warmup", "1", "--",
                                   sys.executable, str(script), "500"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["steps_measured"] == 3
    assert d["findings"][0]["bottleneck"] == "sync-bound"


def test_keep_running_lets_the_command_end_and_keeps_its_exit_code(tmp_path):
    """An audit: under --keep-running the script ran to its own sys.exit(3), yet doctor said it
    was stopped after the window and dropped the 3."""
    script = tmp_path / "train.py"
    marker = tmp_path / "done"
    script.write_text(textwrap.dedent(f'''
        import sys, torch
        torch.set_num_threads(1)
        model = torch.nn.Linear(16, 16)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(10):
            model(torch.randn(8, 16)).square().mean().backward()
            opt.step()
            opt.zero_grad()
        open({str(marker)!r}, "w").write("ok")
        print("the script's own last line")
        sys.exit(3)
    '''))
    res = CliRunner().invoke(app, ["doctor", "--json", "--keep-running", "--steps", "3",
                                   "--warmup", "1", "--", sys.executable, str(script)])
    assert res.exit_code == 0, res.output
    notes = json.loads(res.stdout)["notes"]
    assert marker.exists()
    assert not any("was stopped" in n for n in notes)
    assert "the command exited with code 3 after the measured window" in notes
    # its output shown as it ran (hidden before), on stderr: stdout is the JSON
    assert "the script's own last line" in res.stderr


CKPT_SCRIPT = textwrap.dedent('''
    import sys
    import torch
    from torch.utils.checkpoint import checkpoint
    torch.set_num_threads(1)
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(256, 1024), torch.nn.Linear(1024, 256)

        def forward(self, x):
            return x + self.b(torch.nn.functional.gelu(self.a(x)))

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList(Block() for _ in range(4))

        def forward(self, x):
            for b in self.blocks:  # non-reentrant: a recomputation stops early, by raising
                x = checkpoint(b, x, use_reentrant=False)
            return x

    m = M()
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    x = torch.randn(16, 128, 256)
    for i in range(int(sys.argv[1])):
        if i == int(sys.argv[2]):
            raise RuntimeError("boom in step %d" % i)
        m(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
''')


def test_recomputation_is_measured_for_every_checkpointed_layer(tmp_path):
    """Each block's recomputation re-runs its first matmul and GELU (the early stop skips the
    second matmul): about half its forward. An audit measured a quarter of that: the first
    early stop left the discovery one level deep and only one of the 4 layers was timed."""
    import statistics

    from trainfit.doctor.inject import run_foreign

    script = tmp_path / "ckpt.py"
    script.write_text(CKPT_SCRIPT)
    r = run_foreign([sys.executable, str(script), "40", "-1"], steps=4, warmup=1, profile=False)
    ratio = statistics.median(x.counters["recompute_s"] / x.phases_s["forward"] for x in r.records)
    assert 0.3 < ratio < 1.2, ratio


def test_a_crash_inside_the_measured_window_is_said_not_diagnosed(tmp_path):
    """A script that dies after 4 of the 8 steps asked: exit 2, its last lines, and no diagnosis
    (an audit: exit 0, a diagnosis, and "exited … after the measured window")."""
    script = tmp_path / "ckpt.py"
    script.write_text(CKPT_SCRIPT)
    res = CliRunner().invoke(app, ["doctor", "--steps", "8", "--warmup", "1", "--", sys.executable,
                                   str(script), "40", "5"])
    assert res.exit_code == 2, res.output
    out = " ".join(res.output.split())
    assert "exited with code 1 inside the measured window, after 5 optimizer steps (4 of the 8 " \
        "asked measured)" in out, out
    assert "boom in step 5" in out and "--steps 4" in out


def test_a_scripts_mfu_counts_a_frozen_base_and_its_own_threads(monkeypatch):
    """MFU of a LoRA script: 4·N + 2·N_trainable FLOPs per token (6·N counted the frozen base as
    trained), against the peak at the script's thread count (the doctor's own count was used),
    the peak in the evidence (an audit)."""
    from trainfit.doctor import command
    from trainfit.doctor.findings import find
    from trainfit.doctor.inject import ForeignRun
    from trainfit.doctor.split import StepRecord
    from trainfit.doctor.watch import HostSummary

    asked = []
    monkeypatch.setattr(command, "cpu_peak_flops", lambda threads=None: asked.append(threads) or 1e10)
    host = HostSummary(wall_s=1.0, swap_in_bytes_per_s=0.0, swap_out_bytes_per_s=0.0,
                       swap_used_bytes=0, min_available_bytes=2**30, ram_total_bytes=2**34,
                       peak_rss_bytes=2**29, gpu_util_percent=None, cpu_percent=50.0,
                       sampler_cpu_s=0.0)
    recs = [StepRecord(phases_s={"forward": 0.4, "backward": 0.5, "optimizer": 0.1},
                       step_time_s=1.0, counters={"tokens": 1000.0, "micro_steps": 1.0})] * 3
    run = ForeignRun(command=["python", "t.py"], exit_code=None, stopped_by_doctor=True,
                     records=recs, host=host,
                     summary={"params": 1_000_000, "trainable_params": 10_000,
                              "torch_threads": 1, "profile": {"matmul_time_fraction": 0.8}})
    obs, _ = command.foreign_observation(run, 1e-5)
    assert asked == [1]
    assert obs.mfu == pytest.approx((4e6 + 2e4) * 1000 / 1.0 / 1e10)
    assert find(obs)[0].evidence["peak_flop_per_s"] == 1e10


def _foreign(records, others_cores: float | None):
    from trainfit.doctor.inject import ForeignRun
    from trainfit.doctor.watch import HostSummary

    host = HostSummary(wall_s=10.0, swap_in_bytes_per_s=0.0, swap_out_bytes_per_s=0.0,
                       swap_used_bytes=0, min_available_bytes=2**30, ram_total_bytes=2**34,
                       peak_rss_bytes=2**29, gpu_util_percent=None, cpu_percent=90.0,
                       sampler_cpu_s=0.0, others_cores=others_cores, cpus=2)
    return ForeignRun(command=["python", "t.py"], exit_code=None, stopped_by_doctor=True,
                      records=records, host=host,
                      summary={"params": 1_000_000, "trainable_params": 1_000_000,
                               "torch_threads": 2, "optimizer": {"name": "AdamW", "fused": False},
                               "profile": {"matmul_time_fraction": 0.5}})


def test_a_commands_verdict_must_hold_across_the_halves_of_its_window(monkeypatch, tmp_path):
    """One measured window: its halves are the repeat. A loop input-bound in one half and
    optimizer-heavy in the other (beside busy neighbours) is undecided, with no gain, and the
    busy host is said (an audit: such a run named slow-optimizer, +68 %, with no word)."""
    from rich.console import Console

    from trainfit.doctor import command
    from trainfit.doctor.split import StepRecord
    from trainfit.render.doctor import findings_block

    def rec(data: float, opt: float) -> StepRecord:
        return StepRecord(phases_s={"data_wait": data, "forward": 0.01, "backward": 0.01,
                                    "optimizer": opt}, step_time_s=data + opt + 0.02,
                          counters={"tokens": 1000.0, "micro_steps": 1.0})

    calm = [rec(0.06, 0.002)] * 2 + [rec(0.001, 0.12)] * 2  # input-bound, then slow-optimizer
    monkeypatch.setattr(command, "run_foreign", lambda cmd, **kw: _foreign(calm, 1.6))
    res = command.doctor_command(["python", "t.py"], steps=4)
    # busy: run twice (test_a_busy_hosts_command_runs_twice), each window's halves listed
    assert res.round_bottlenecks == ["input-bound", "slow-optimizer"] * 2
    assert res.verdict_stable is False and res.command_runs == 2
    assert res.findings[0].gain_fraction is None and "undecided" in res.findings[0].detail
    assert any("did not hold across the 4 halves of the two runs' measured windows" in n
               for n in res.notes)
    busy = [n for n in res.notes if n.startswith("the host was busy")]
    assert len(busy) == 1 and "up to 1.6 of 2 CPU cores during the run" in busy[0]
    assert "torch ran 2 threads" in busy[0]
    # report says which repeat it was (the halves of one window, not 'before' rounds)
    import json

    from trainfit.report.build import build_report
    from trainfit.report.doctor_tables import doctor_texts
    from trainfit.report.load import load_inputs

    assert res.to_dict()["form"] == "command"
    path = tmp_path / "doctor.json"
    path.write_text(json.dumps(res.to_dict()))
    (d,) = build_report(load_inputs([str(path)])).doctors
    said = " ".join(doctor_texts(d)[2].notes)
    assert "each half of each of the command's 2 measured windows (run twice: the host was " \
        "busy): input-bound, slow-optimizer, input-bound, slow-optimizer — did not hold" in said
    # the same loop, steady and on a quiet host: one verdict, its gain an upper bound, no note
    steady = [rec(0.06, 0.002)] * 4
    monkeypatch.setattr(command, "run_foreign", lambda cmd, **kw: _foreign(steady, 0.05))
    res = command.doctor_command(["python", "t.py"], steps=4)
    assert res.round_bottlenecks == ["input-bound", "input-bound"] and res.verdict_stable
    assert res.command_runs == 1 and res.to_dict()["command_runs"] == 1
    top = res.findings[0]
    assert top.gain_fraction == pytest.approx(1 / (1 - 0.06 / 0.082) - 1, rel=1e-3)
    assert top.gain_upper_bound and top.to_dict()["gain_upper_bound"] is True
    assert not any(n.startswith("the host was busy") for n in res.notes)
    con = Console(width=200, record=True)
    con.print(findings_block(res.findings, "findings"))
    assert f"predicted gain at most {top.gain_fraction:+.0%} tokens/s" in con.export_text()


def test_a_busy_hosts_command_runs_twice_and_its_verdict_must_repeat(monkeypatch):
    """An audit: on a busy host one loop named slow-optimizer (+124 %) in 5 of 7 runs,
    compute-bound and bandwidth-bound in the others, each run saying its verdict held — the
    optimizer's time was bimodal between processes, which one window's halves cannot see. On a
    busy CPU host the command runs a second time; its halves must agree with the first's."""
    from trainfit.doctor import command
    from trainfit.doctor.split import StepRecord

    def rec(data: float, opt: float) -> StepRecord:
        return StepRecord(phases_s={"data_wait": data, "forward": 0.01, "backward": 0.01,
                                    "optimizer": opt}, step_time_s=data + opt + 0.02,
                          counters={"tokens": 1000.0, "micro_steps": 1.0})

    slow_opt, quick_opt = [rec(0.001, 0.19)] * 4, [rec(0.001, 0.0015)] * 4
    calls: list[int] = []

    def runs(*windows):
        def run_foreign(cmd, **kw):
            calls.append(1)
            return _foreign(windows[len(calls) - 1], 1.3)
        return run_foreign

    monkeypatch.setattr(command, "run_foreign", runs(slow_opt, quick_opt))
    res = command.doctor_command(["python", "t.py"], steps=4)
    assert len(calls) == 2 and res.command_runs == 2
    assert res.round_bottlenecks[:2] == ["slow-optimizer"] * 2
    assert res.round_bottlenecks[2:] != ["slow-optimizer"] * 2
    assert res.findings[0].bottleneck == "slow-optimizer"  # the first run's figures
    assert res.findings[0].gain_fraction is None and "undecided" in res.findings[0].detail
    assert any("run a second time" in n and "1.3 of 2 CPU cores" in n for n in res.notes)
    # the same in both processes: held, the gain kept
    calls.clear()
    monkeypatch.setattr(command, "run_foreign", runs(slow_opt, slow_opt))
    res = command.doctor_command(["python", "t.py"], steps=4)
    assert len(calls) == 2 and res.verdict_stable and res.findings[0].gain_fraction > 0
    # a quiet host, or --keep-running (the command runs to its own end): once
    for quiet, stop in ((0.05, True), (1.3, False)):
        calls.clear()
        monkeypatch.setattr(command, "run_foreign",
                            lambda cmd, q=quiet, **kw: calls.append(1) or _foreign(slow_opt, q))
        res = command.doctor_command(["python", "t.py"], steps=4, stop=stop)
        assert len(calls) == 1 and res.command_runs == 1


def test_a_second_run_that_fails_leaves_the_first_runs_verdict_unconfirmed(monkeypatch):
    """A script may refuse to run twice (a directory it makes without exist_ok): the first
    run's verdict stands, said to be unconfirmed, not an error."""
    from trainfit.doctor import command
    from trainfit.doctor.inject import DoctorError
    from trainfit.doctor.split import StepRecord

    slow_opt = [StepRecord(phases_s={"data_wait": 0.001, "forward": 0.01, "backward": 0.01,
                                     "optimizer": 0.19}, step_time_s=0.211,
                           counters={"tokens": 1000.0, "micro_steps": 1.0})] * 4
    calls: list[int] = []

    def run_foreign(cmd, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise DoctorError("python t.py exited with code 1 after 0 optimizer steps")
        return _foreign(slow_opt, 1.3)

    monkeypatch.setattr(command, "run_foreign", run_foreign)
    res = command.doctor_command(["python", "t.py"], steps=4)
    assert len(calls) == 2 and res.command_runs == 1
    assert res.round_bottlenecks == ["slow-optimizer"] * 2 and res.findings[0].gain_fraction > 0
    assert any("that run failed (python t.py exited with code 1" in n and "not confirmed" in n
               for n in res.notes)
