"""`learner merge-adapter`: a LoRA checkpoint (DCP: the adapter only) or an adapter snapshot
merged into its base model gives a full HF directory whose logits equal the base with the
adapter (PEFT) on; the command parses before it imports torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from learner.cli import main
from learner.trainer.checkpoint import TrainingState
from learner.trainer.model_init import load_model
from learner.trainer.trainer import Trainer
from tests.learner.builders import learner_config, random_samples
from weights.formats.adapter import AdapterSnapshotWriter

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "demo" / "tiny_model"


def _peft_logits(adapter: dict, adapter_config: dict, ids: torch.Tensor) -> torch.Tensor:
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    config = LoraConfig(**{k: v for k, v in adapter_config.items() if k != "peft_type"})
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32), config)
    set_peft_model_state_dict(model, adapter)
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits


def test_merge_adapter_from_a_checkpoint_and_from_a_snapshot(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = learner_config(model_path=str(BASE), finetune={"mode": "lora", "rank": 4, "alpha": 8})
    model = load_model(BASE, device=torch.device("cpu"), finetune=config.finetune)
    trainer = Trainer(model, config)
    trainer.train_step(random_samples(num_samples=4, seed=1))  # B leaves zero
    checkpoint = trainer.save(tmp_path / "checkpoints", TrainingState())
    adapter = dict(trainer.full_weights())
    assert any(t.abs().max() > 0 for n, t in adapter.items() if "lora_B" in n)

    assert (
        main(["merge-adapter", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "a")]) == 0
    )
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "a", dtype=torch.float32).eval()
    ids = torch.tensor([[5, 17, 33, 40, 41, 99, 7, 260]])
    with torch.no_grad():
        got = merged(input_ids=ids).logits
    # Merged W + BA and PEFT's W x + B(A x) sum in different orders: float32 rounding, which
    # grows with the logit (measured up to 1.3e-6 relative, 1.2e-5 absolute at logits ~10,
    # depending on the thread count): a relative bound with a margin.
    torch.testing.assert_close(got, _peft_logits(adapter, trainer.adapter_config, ids),
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    assert not any("lora" in name for name in merged.state_dict())
    assert AutoTokenizer.from_pretrained(tmp_path / "a").encode(
        "1 + 2"
    ) == AutoTokenizer.from_pretrained(BASE).encode("1 + 2")

    writer = AdapterSnapshotWriter(tmp_path / "snapshots", 1, trainer.adapter_config)
    for name, tensor in adapter.items():
        writer.add(name, tensor)
    snapshot = writer.finish()
    assert main(["merge-adapter", "--checkpoint", str(snapshot), "--out", str(tmp_path / "b")]) == 0
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "b", dtype=torch.float32)
    for name, tensor in merged.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name

    assert main(["merge-adapter", "--checkpoint", str(tmp_path), "--out", str(tmp_path / "c")]) == 2
    assert "not a LoRA checkpoint" in capsys.readouterr().err


def test_merge_adapter_help_imports_no_torch():
    code = (
        "import sys\nfrom learner.cli import main\n"
        "try:\n    main(['merge-adapter', '--help'])\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert "--checkpoint" in out.stdout and out.stdout.strip().endswith("False")
