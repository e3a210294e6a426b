"""DASH inside Hugging Face ``Trainer`` and Lightning (examples/hf_trainer.py, examples/lightning_fit.py).

Each framework trains the tiny byte-level Llama with DASH, checkpoints halfway, and a second
run from a fresh model and optimizer resumes from that checkpoint: its final parameters must
equal the uninterrupted run's bit for bit. DASH's validation loss after the same steps must be
below AdamW's (each at its default learning rate in the example). Nothing is downloaded
(``HF_HUB_OFFLINE=1``: models from configs). These tests need the ``integrations`` extra.
"""

import importlib.util
import os

import pytest
import torch

MISSING = [name for name in ("transformers", "accelerate", "lightning") if importlib.util.find_spec(name) is None]
pytestmark = pytest.mark.skipif(
    bool(MISSING),
    reason=f"the integrations extra is not installed ({', '.join(MISSING)} missing): pip install -e '.[integrations]'",
)
os.environ["HF_HUB_OFFLINE"] = "1"


def identical(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


@pytest.fixture(scope="module")
def hf_dash(tmp_path_factory):
    from examples import hf_trainer

    out = tmp_path_factory.mktemp("hf_dash")
    return hf_trainer.main(["--optimizer", "dash", "--out", str(out)]), out


def test_hf_trainer_resumes_bit_exact(hf_dash):
    from safetensors.torch import load_file

    from examples import hf_trainer

    run, out = hf_dash
    assert run["resumed_step"] == 60
    assert identical(run["resumed_model"], run["model"])
    halfway = load_file(str(out / "checkpoint-30" / "model.safetensors"))
    trained = dict(run["model"].named_parameters())
    assert not any(torch.equal(halfway[k], trained[k]) for k in halfway)  # the resumed run did train on
    assert not identical(run["model"], hf_trainer.tiny_llama(0))


def test_hf_trainer_dash_ends_below_adamw(hf_dash, tmp_path):
    from examples import hf_trainer

    adamw = hf_trainer.main(["--optimizer", "adamw", "--no-resume", "--out", str(tmp_path)])
    assert len(adamw["train_loss"]) == len(hf_dash[0]["train_loss"]) == 60
    assert hf_dash[0]["eval_loss"] < adamw["eval_loss"]


@pytest.fixture(scope="module")
def lightning_dash(tmp_path_factory):
    from examples import lightning_fit

    return lightning_fit.main(["--optimizer", "dash", "--out", str(tmp_path_factory.mktemp("lightning_dash"))])


def test_lightning_resumes_bit_exact(lightning_dash):
    from examples import lightning_fit

    # Trainer(deterministic=True) sets torch's process-wide flag; fit() puts it back for later tests
    assert not torch.are_deterministic_algorithms_enabled()
    assert lightning_dash["resumed"].trainer.global_step == lightning_dash["module"].trainer.global_step == 60
    assert identical(lightning_dash["resumed"], lightning_dash["module"])
    assert not identical(lightning_dash["module"], lightning_fit.ByteLM("dash", 0.0, 60))


def test_lightning_dash_ends_below_adamw(lightning_dash, tmp_path):
    from examples import lightning_fit

    adamw = lightning_fit.main(["--optimizer", "adamw", "--no-resume", "--out", str(tmp_path)])
    assert adamw["module"].trainer.global_step == 60
    assert lightning_dash["val_loss"] < adamw["val_loss"]
