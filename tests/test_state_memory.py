"""State memory: 6 float32 words per matrix entry at mu = 0 when blocks are full (the reference keeps 8)."""

import pytest
import torch

import dash_fn


def words_per_entry(shape, **config):
    param = torch.empty(shape, device="meta")
    state = dash_fn.init({"w": param}, dash_fn.DashConfig(block_size=256, solver="eigh", **config))
    nbytes = sum(
        v.numel() * v.element_size()
        for v in state.values(include_nested=True, leaves_only=True)
        if isinstance(v, torch.Tensor)
    )
    return nbytes / param.numel() / 4


@pytest.mark.parametrize("shape", [(1024, 1024), (512, 2048), (256, 256, 3, 3)])
def test_full_blocks_cost_six_words(shape):
    # factors 2 + roots 2 + gradient EMA 1 + grafting moment 1, plus a few scalars
    assert 6.0 <= words_per_entry(shape) < 6.001


def test_momentum_adds_one_word_and_no_gradient_ema_removes_one():
    assert 7.0 <= words_per_entry((512, 512), mu=0.9) < 7.001
    assert 5.0 <= words_per_entry((512, 512), beta_G=0.0) < 5.001
