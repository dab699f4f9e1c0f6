"""How many seeds one batched WALLA fit holds (device_memory.seeds_per_chunk, walla.seed_bytes, issue 22).

The paper's heads at H = 4096 with 12 agents are 228M parameters per seed: on the host (3 GiB budget) one
seed per chunk, as before; on an 80 GB GPU (79 GiB free) every seed of a 5-seed run in one chunk.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from synthetic import make_private_context_scenario
from walla.manifests.validate import build
from walla.train.engine import (
    DEVICE_MEMORY_SHARE,
    PARAM_BUDGET_BYTES,
    TrainEnv,
    free_device_bytes,
    seeds_per_chunk,
)
from walla.train.methods import walla

GIB = 2**30
PAPER = SimpleNamespace(hidden=[np.zeros((1, 4096), dtype=np.float32)] * 12, n_agents=12)  # shapes only
CFG = walla.Config()  # projection 4096, MLP [512, 256], batch 100


def test_seed_bytes_counts_the_paper_heads():
    per_head = 4096 * 4096 + 4096 + 4096 * 512 + 512 + 512 * 256 + 256 + 256 + 1
    assert per_head * 12 == 228_126_732  # the 228M parameters of one seed (issue 22)
    assert walla.seed_bytes(PAPER, CFG, on_device=False) == 228_126_732 * 4 * walla.COPIES_PER_PARAM
    activations = 12 * 100 * (4096 + 4096 + 512 + 256 + 1) * 4 * walla.ACTIVATION_COPIES
    assert walla.seed_bytes(PAPER, CFG, on_device=True) == 228_126_732 * 24 + activations
    diag = build(walla.Config, {"diagnostics": True}, "test")
    assert walla.seed_bytes(PAPER, diag, on_device=False) == 3 * 228_126_732 * 24


def test_seeds_per_chunk_from_free_memory():
    host, device = walla.seed_bytes(PAPER, CFG, False), walla.seed_bytes(PAPER, CFG, True)
    assert seeds_per_chunk(host, None) == 1  # 5.1 GiB per seed > the 3 GiB host budget: one seed
    assert seeds_per_chunk(device, 79 * GIB) == 11  # an idle H100: 0.75 * 79 GiB / 5.26 GiB
    assert seeds_per_chunk(device, 20 * GIB) == 2
    assert seeds_per_chunk(device, 1 * GIB) == 1  # never 0: a seed too large still trains (and may OOM)
    assert seeds_per_chunk(1000, None) == PARAM_BUDGET_BYTES // 1000


def test_chunks_follow_the_free_memory_before_each_chunk(monkeypatch):
    seeds = [18, 19, 20, 21, 22]
    cpu, cuda = TrainEnv(), TrainEnv(device="cuda")  # (TrainEnv does not check the device)
    assert list(walla._seed_chunks(PAPER, CFG, seeds, cpu)) == [[s] for s in seeds]  # host: as before
    monkeypatch.setattr(walla, "free_device_bytes", lambda device: 79 * GIB)
    assert list(walla._seed_chunks(PAPER, CFG, seeds, cuda)) == [seeds]  # one batched fit
    double = TrainEnv(device="cuda", precision="64-true")  # 8 bytes a value: 5 seeds per chunk
    assert list(walla._seed_chunks(PAPER, CFG, seeds + [23], double)) == [seeds, [23]]
    free = iter([20 * GIB, 10 * GIB, 79 * GIB])  # earlier chunks' states hold memory: read again each time
    monkeypatch.setattr(walla, "free_device_bytes", lambda device: next(free))
    assert list(walla._seed_chunks(PAPER, CFG, seeds, cuda)) == [[18, 19], [20], [21, 22]]


def test_free_device_bytes_is_none_off_cuda():
    assert free_device_bytes("cpu") is None and free_device_bytes("meta") is None


@pytest.mark.gpu
def test_free_device_bytes_counts_the_allocator_cache():
    before = free_device_bytes("cuda")
    x = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")  # 256 MiB
    held = free_device_bytes("cuda")
    del x  # back in torch's cache: still free for the next fit
    assert held <= before - 256 * 2**20 + 2**20 and free_device_bytes("cuda") >= before - 2**20


@pytest.mark.gpu
def test_five_paper_sized_seeds_train_as_one_batched_fit_on_a_gpu(monkeypatch):
    """12 agents x H = 4096 with the reference's 4096 projection: 5 seeds, one train_heads call, and the
    states it hands back stay on the GPU (saved from the host later)."""
    need = 5 * walla.seed_bytes(PAPER, CFG, True) / DEVICE_MEMORY_SHARE
    free = free_device_bytes("cuda")
    if free < need:
        pytest.skip(
            f"needs {need / GIB:.0f} GiB free on the GPU for 5 paper-sized seeds, has {free / GIB:.0f}"
        )
    data = make_private_context_scenario(n=200, m=12, k=2, h=4096, seed=0)
    chunks, real = [], walla.train_heads
    monkeypatch.setattr(
        walla,
        "train_heads",
        lambda d, c, seeds, *a, **kw: chunks.append(seeds) or real(d, c, seeds, *a, **kw),
    )
    cfg = build(walla.Config, {"epochs": 1, "lr": 1e-5}, "test")
    states = walla.fit(data, cfg, [18, 19, 20, 21, 22], TrainEnv(device="cuda"), [None] * 5)
    assert chunks == [[18, 19, 20, 21, 22]]
    assert {t.device.type for st in states for t in st["params"]} == {"cuda"}
    assert states[4]["params"][0].shape == (12, 4096, 4096)
