"""A model load reads weights: the self-check and the GEMM row probe run once per model/machine, then are cached."""

from __future__ import annotations

import pytest
import torch
from tiny_model import save_tiny_checkpoint, spy_from_pretrained, tiny_model, tiny_tokenizer
from walla.extract.backends.hf import HFBackend, load_hf_backend
from walla.extract.backends.hf import _packed as hf_packed
from walla.extract.backends.hf import _probes as hf_checks
from walla.extract.models import ResolvedModel


@pytest.fixture
def local_tiny(tmp_path, monkeypatch) -> ResolvedModel:
    monkeypatch.setenv("WALLA_CACHE", str(tmp_path / "cache"))
    mdir = save_tiny_checkpoint(tmp_path / "tiny", seed=5)
    return ResolvedModel("tiny", str(mdir), None, None, {"source": "local", "files_sha256": "abc"})


def test_self_check_runs_once_per_model_and_load_times_say_where_time_went(local_tiny, monkeypatch):
    first = load_hf_backend(local_tiny, dtype="float32", device="cpu", batch_tokens=64)
    assert list(first.load_times) == ["dtype", "tokenizer", "weights", "self-check"]
    assert all(v >= 0 for v in first.load_times.values())

    def never(self, *a, **k):
        raise AssertionError("a model that passed its self-check here is not checked again")

    monkeypatch.setattr(HFBackend, "self_check", never)
    second = load_hf_backend(local_tiny, dtype="float32", device="cpu", batch_tokens=64)
    assert "self-check (cached)" in second.load_times
    # another dtype (or model, device, torch/transformers version) is another check
    with pytest.raises(AssertionError, match="not checked again"):
        load_hf_backend(local_tiny, dtype="bfloat16", device="cpu", batch_tokens=64)


def test_invariance_probes_have_their_own_seconds_on_the_load_line(local_tiny, monkeypatch):
    """Batch-invariant loads run the row and packed probes before the self-check, timed apart (a cold cache's
    '10.7 s self-check' of a tiny model was these probes); cached, they take no time."""
    first = load_hf_backend(local_tiny, dtype="bfloat16", device="cpu", batch_tokens=64)
    assert first.batch_invariant and first.rows_invariant is not None
    assert list(first.load_times) == ["dtype", "tokenizer", "weights", "invariance probes", "self-check"]
    probed = {"rows": 0, "packed": 0}
    monkeypatch.setattr(
        hf_packed, "linear_rows_invariant", lambda *a, **k: probed.update(rows=1) or (True, 1, "")
    )
    monkeypatch.setattr(hf_checks, "probe_packed", lambda *a: probed.update(packed=1) or (True, ""))
    second = load_hf_backend(local_tiny, dtype="bfloat16", device="cpu", batch_tokens=64)
    assert probed == {"rows": 0, "packed": 0}  # both read from $WALLA_CACHE/hf-checks
    assert (second.min_rows, second.attention_batched) == (first.min_rows, first.attention_batched)
    assert "self-check (cached)" in second.load_times and "invariance probes" in second.load_times


def test_a_failed_self_check_is_never_cached(local_tiny, monkeypatch):
    def broken(self, *a, **k):
        raise RuntimeError("self-check failed: option log-probs differ")

    monkeypatch.setattr(HFBackend, "self_check", broken)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="self-check failed"):
            load_hf_backend(local_tiny, dtype="float32", device="cpu", batch_tokens=64)
    assert not list(hf_checks.cache_dir().glob("self-check-*.json"))


def test_row_invariance_probe_is_cached_per_machine_and_shapes(tmp_path, monkeypatch):
    tok = tiny_tokenizer()
    model = tiny_model(len(tok)).to(torch.bfloat16)
    calls = []
    orig = hf_packed.linear_rows_invariant

    def counted(m, rows, **kw):
        calls.append(rows)
        return orig(m, rows, **kw)

    monkeypatch.setattr(hf_packed, "linear_rows_invariant", counted)
    ok, min_rows, why = hf_checks.rows_invariant(model, 120, tmp_path)
    again, min_again, why2 = hf_checks.rows_invariant(model, 120, tmp_path)
    assert calls == [120] and (again, min_again) == (ok, min_rows)
    assert why2 == f"{why} (cached in {next(tmp_path.glob('rows-*.json'))})"
    hf_checks.rows_invariant(model, 64, tmp_path)  # another row count: measured
    hf_checks.rows_invariant(model.float(), 120, tmp_path)  # another dtype: measured
    hf_checks.rows_invariant(model, 120, tmp_path, head_rows=40)  # LM-head calls of another size: measured
    assert calls == [120, 64, 120, 120]


def test_weights_load_on_the_cpu_without_device_map(local_tiny, monkeypatch):
    seen = spy_from_pretrained(monkeypatch)
    be = load_hf_backend(local_tiny, dtype="bfloat16", device="cpu", batch_tokens=64)
    assert be.device.type == "cpu" and be.dtype == torch.bfloat16
    assert "device_map" not in seen[0] and seen[0]["dtype"] == torch.bfloat16  # CPU: loaded as before


class RowMixing(torch.nn.Module):
    """A projection whose output rows depend on the other rows of its call: a batch-dependent kernel."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x)  # [1, T, d] (a packed stream)
        return y + 0.25 * y.mean(dim=-2, keepdim=True)


def test_the_packed_probe_runs_one_layer_of_each_type_and_still_catches_a_row_mixing_kernel():
    """The probe runs the first probe_depth layers (2 of 4 here), restores the model, and a kernel that mixes
    the rows of its call, as a real one would in every layer of its type, still fails it."""
    tok = tiny_tokenizer()
    model = tiny_model(len(tok), seed=3, num_layers=4).to(torch.bfloat16)
    be = HFBackend(model, tok, batch_tokens=400, batch_invariant=True, fixed_shapes=False)
    be.min_rows = 2
    ok, why = hf_checks.probe_packed(be)
    assert ok and "2 of 4 layers" in why, why
    assert model.config.num_hidden_layers == 4 and len(model.model.layers) == 4
    for layer in model.model.layers:
        layer.mlp.down_proj = RowMixing(layer.mlp.down_proj)
    ok, why = hf_checks.probe_packed(be)
    assert not ok and "packed together" in why, why
    assert model.config.num_hidden_layers == 4


def test_probe_depth_covers_every_layer_type():
    from types import SimpleNamespace

    def depth(**cfg) -> int:
        return hf_checks.probe_depth(SimpleNamespace(decoder=SimpleNamespace(config=SimpleNamespace(**cfg))))

    gemma3 = (["sliding_attention"] * 5 + ["full_attention"]) * 3  # Gemma-3: one full layer in six
    assert depth(num_hidden_layers=18, layer_types=gemma3) == 6
    assert depth(num_hidden_layers=30, layer_types=["full_attention"] * 30) == 2
    assert depth(num_hidden_layers=30) == 2 and depth(num_hidden_layers=1) == 1


def test_the_packed_probe_still_catches_attention_that_a_cached_prefix_changes(monkeypatch):
    """The cached-prefix check scores PREFIX_CHECK_LENGTHS' prompts with the prefix as their own tokens too: a
    blocked attention whose numbers move when keys come from a cached prefix fails it."""
    tok = tiny_tokenizer()
    be = HFBackend(tiny_model(len(tok), seed=3).to(torch.bfloat16), tok, batch_tokens=400, fixed_shapes=False)
    be.min_rows = 2
    assert hf_checks.probe_packed(be)[0]
    orig = hf_packed.blocked_attention

    def moved_by_a_prefix(query, key, value, lengths, prefix=0, *args):
        out = orig(query, key, value, lengths, prefix, *args)
        return out * 1.01 if prefix else out

    monkeypatch.setattr(hf_packed, "blocked_attention", moved_by_a_prefix)
    ok, why = hf_checks.probe_packed(be)
    assert not ok and f"after a cached {hf_checks.PROBE_PREFIX}-token prefix" in why, why
