import pytest
import torch

from trainfit.job import JobError
from trainfit.model.runtime import check_no_offload, parse_device


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
    with pytest.raises(JobError, match="no CUDA device"):
        parse_device("cuda:0")
    assert parse_device("cpu").type == "cpu"
