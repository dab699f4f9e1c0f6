"""Shared fixtures of the training tests."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny heads and tensors: intra-op threads only add OpenMP waits when other jobs share the 2 cores
    (measured ~4x slower under load), so every training test module runs single-threaded."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
