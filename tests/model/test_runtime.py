import pytest
import torch

from trainfit.job import JobError
from trainfit.model.runtime import check_no_offload, parse_device, use_job_allocator


def test_offload_is_refused_with_names_and_bytes():
    m = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256))
    m.hf_device_map = {"0": 0, "1": "cpu"}
    with pytest.raises(JobError, match=r"1→cpu; 0\.00 GiB") as e:
        check_no_offload(m)
    assert "--allow-offload" in e.value.hint
    check_no_offload(m, allow_offload=True)
    m.hf_device_map = {"0": 0, "1": 0}
    check_no_offload(m)


def test_cuda_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(JobError, match="no CUDA device") as e:
        parse_device("cuda:0")
    assert "with --memory-limit to stand in" in e.value.hint
    assert parse_device("cpu").type == "cpu"
    # doctor reads the limit from the job file, and says so (an audit: it named tune's flag)
    from trainfit.doctor.run import _JOB_LIMIT

    with pytest.raises(JobError) as e:
        parse_device("cuda", _JOB_LIMIT)
    assert "with memory_limit: in the job file to stand in" in e.value.hint


def test_a_job_planned_with_expandable_segments_runs_with_them(monkeypatch):
    from trainfit.job import JobSpec

    calls: list[str] = []
    monkeypatch.setattr(torch.cuda.memory, "_set_allocator_settings", calls.append)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    job = JobSpec(model="m", expandable_segments=True)
    assert use_job_allocator(job, torch.device("cuda", 0))
    # the cache goes after the switch: blocks cached in default segments would serve the job
    assert calls == ["expandable_segments:True", "empty_cache"]
    # on the CPU, or for a job planned with the default segments, nothing is changed (a job
    # without the field leaves the environment's PYTORCH_CUDA_ALLOC_CONF as it is)
    assert not use_job_allocator(job, torch.device("cpu"))
    assert not use_job_allocator(job.replace(expandable_segments=False), torch.device("cuda", 0))
    assert calls == ["expandable_segments:True", "empty_cache"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_expandable_segments_reach_the_cuda_allocator():
    from trainfit.job import JobSpec

    mib = 2**20
    y = torch.empty(3 * mib, device="cuda")
    del y  # a default segment's block, cached: the job's tensors must not land in it
    try:
        use_job_allocator(JobSpec(model="m", expandable_segments=True), torch.device("cuda", 0))
        # free space inside default segments that earlier tests left partly live still serves
        # requests that fit it (empty_cache releases whole segments only): ask for more
        free = [b["size"] for s in torch.cuda.memory_snapshot() for b in s["blocks"]
                if b["state"] == "inactive"]
        x = torch.empty((max(free, default=0) + 12 * mib) // 4, device="cuda")
        # the large pool's segment grows by 20 MiB pages
        segments = [s for s in torch.cuda.memory_snapshot() if s.get("is_expandable")]
        assert segments and all(s["total_size"] % (20 * mib) == 0 for s in segments
                                if s["segment_type"] == "large"), \
            [(s["total_size"], s.get("is_expandable")) for s in torch.cuda.memory_snapshot()]
        assert any(b["address"] == x.data_ptr() for s in segments for b in s["blocks"])
        del x
    finally:  # the tests after this one run on the allocator the environment asks for again
        from trainfit.memory.expandable import env_expandable_segments

        torch.cuda.memory._set_allocator_settings(
            f"expandable_segments:{env_expandable_segments()}")
        torch.cuda.empty_cache()


def test_fsdp_build_holds_only_this_ranks_shards_with_the_one_rank_values():
    """build_real(shard=...) shards on meta, so no rank ever holds a full weight; each rank's
    rows are the one-rank model's (the same draw, cut as FSDP2's Shard(0) cuts it)."""
    from transformers import LlamaConfig

    from trainfit.model.source import ModelSource

    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False)
    source = ModelSource("tiny", cfg, "causal-lm", "local")
    _check_sharded_build(source)


def test_fsdp_build_loads_pretrained_weights_into_the_shards(tmp_path):
    """The same with weights read from a model directory's safetensors (each rank copies its
    rows of each tensor read on the host)."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    from trainfit.model.source import ModelSource

    # an odd vocabulary: FSDP2's Shard(0) gives rank 0 the larger half (48 of 95 rows)
    cfg = LlamaConfig(vocab_size=95, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False)
    gen = torch.Generator().manual_seed(7)
    with torch.device("meta"):
        from transformers import AutoModelForCausalLM

        shapes = {n: p.shape for n, p in AutoModelForCausalLM.from_config(cfg).named_parameters()}
    save_file({n: torch.randn(s, generator=gen) for n, s in shapes.items()},
              str(tmp_path / "model.safetensors"))
    cfg.save_pretrained(tmp_path)
    _check_sharded_build(ModelSource(str(tmp_path), cfg, "causal-lm", "local"), loaded=True)


def _check_sharded_build(source, loaded: bool = False) -> None:
    from pathlib import Path

    import torch
    from safetensors.torch import load_file

    from trainfit.engine.dist import fully_shard_model
    from trainfit.job import JobSpec
    from trainfit.memory.sharded import fake_world
    from trainfit.model.runtime import build_real

    job = JobSpec(model=source.name, method="full", seq_len=16, micro_batch=1, ranks=2,
                  sharding="fsdp")
    whole = build_real(JobSpec(model=source.name, method="full", seq_len=16, micro_batch=1),
                       source, torch.device("cpu"), seed=3)
    full = dict(whole.model.named_parameters())
    if loaded:  # the one-rank build read the file too
        saved = load_file(str(Path(source.name) / "model.safetensors"))
        assert all(torch.equal(full[n].detach(), saved[n]) for n in saved)
    with fake_world(2) as mesh:
        wl = build_real(job, source, torch.device("cpu"), seed=3,
                        shard=lambda m: fully_shard_model(m, mesh=mesh))
        for name, p in wl.model.named_parameters():
            local = p.to_local()
            ref = torch.chunk(full[name].detach(), 2, dim=0)[0]
            assert local.shape == ref.shape and local.numel() < full[name].numel(), name
            assert torch.equal(local.detach(), ref), name
        # the optimizer was built over the shards (no full tensor kept alive by it)
        held = [q for g in wl.optimizer.param_groups for q in g["params"]]
        assert all(hasattr(q, "to_local") for q in held)


def test_a_tied_head_adapted_by_lora_stays_tied():
    """--lora-targets ...,lm_head on a tied model: transformers' tie_weights cannot set the LoRA
    wrapper's weight (KeyError, a traceback in tune: an audit); the head's base weight is still
    the embedding's Parameter after the build."""
    import torch
    from transformers import LlamaConfig

    from trainfit.job import JobSpec
    from trainfit.model.runtime import build_real
    from trainfit.model.source import ModelSource

    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                      tie_word_embeddings=True)
    src = ModelSource("tiny-tied", cfg, "causal-lm", "local")
    job = JobSpec(model="tiny", method="lora", lora_targets="q,v,lm_head", seq_len=16,
                  micro_batch=1)
    wl = build_real(job, src, torch.device("cpu"), seed=0)
    base = wl.model.get_base_model()
    assert base.lm_head.base_layer.weight is base.model.embed_tokens.weight
