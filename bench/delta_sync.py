"""Weight updates as bf16 deltas at the 0.5B shape: bytes on the wire per update
over the full bf16 bytes, encode and decode seconds, and bit-exactness along a chain.

    model:    the random-init Qwen2 of Qwen2-0.5B's shape of demo/random_model.py
              (494 M parameters, tied embeddings, vocabulary 151,936), fp32 master weights.
    updates:  `--updates` real AdamW steps (betas 0.9/0.999, no weight decay) on random
              token batches (`--tokens`), at lr 1e-6 (RL fine-tuning of a large model) and at
              the demo's 1e-4 (configs/demo.toml); after each, the weights cast to bf16 are
              the version a learner sends.
    codec:    weights/shared/delta.py, per tensor: `xor` (bit patterns XORed with the previous
              version's, zstd) and `sparse` (changed positions and values, zstd), each
              decoded by a receiver that holds only what it decoded before (the first
              version a keyframe): every version must come out bit for bit.
    wire:     the same versions through the real broadcast (`WeightSender` with
              `weight_sync.delta`, `keyframe_interval` above the updates; gloo over
              loopback) to a receiver process that follows every round with a
              `WeightChannel`, as an engine worker does: what went on the wire per round over
              the whole bf16 version (`BroadcastReport.num_bytes / raw_bytes`), the sender's
              transfer seconds of a delta round against the keyframe's, and whether the
              receiver's rebuilt version equals the sender's (its float64 checksum).

Writes bench/results/delta_sync.json (`--small`: a 4-layer model, to try it quickly). The
encode and decode seconds are one thread's (numpy and zstd), on this machine's CPU.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from bench.common import Benchmark, load_average, report
from demo.random_model import QWEN2_0_5B, SMALL, build_model

BENCHMARK = Benchmark(
    measures="weight updates as bf16 deltas at the 0.5B shape",
    target="by hand",
    minutes=3,
)

ENCODINGS = ("xor", "sparse")
LEARNING_RATES = {"rl": 1e-6, "demo": 1e-4}


def _follow_rounds(address: tuple[str, int], rounds: int, queue) -> None:
    """A receiver process: an engine worker's channel following `rounds` rounds; puts the
    checksum of each rebuilt version on `queue`."""
    from weights.actor_side.subscription import WeightSubscription
    from weights.engine_side.receiver import WeightChannel
    from weights.shared.tensors import checksum

    subscription, channel = WeightSubscription(*address), WeightChannel()
    queue.put("ready")
    version = -1
    for _ in range(rounds):
        ticket = subscription.wait_round(version, 600)
        if ticket is None:
            break
        version = ticket.version
        queue.put((version, checksum(channel.receive(ticket))))
    channel.close()
    subscription.leave()


class Wire:
    """The real broadcast with deltas, to one receiver process."""

    def __init__(self, rounds: int) -> None:
        import multiprocessing

        from weights.config import WeightSyncConfig
        from weights.learner_side.sender import WeightSender

        self.sender = WeightSender(
            WeightSyncConfig(
                store_port=0,
                backend="gloo",
                transfer_timeout_s=600,
                delta=True,
                keyframe_interval=rounds + 1,
            )  # fmt: skip
        )
        context = multiprocessing.get_context("spawn")
        self.queue = context.Queue()
        address = (self.sender.config.store_host, self.sender.config.store_port)
        self.process = context.Process(target=_follow_rounds, args=(address, rounds, self.queue))
        self.process.start()
        assert self.queue.get(timeout=120) == "ready"
        while not self.sender.members():
            time.sleep(0.05)
        self.version = 0

    def send(self, named: dict) -> tuple[object, bool]:
        """One round of `named`; (its report, whether the receiver rebuilt it exactly)."""
        from weights.shared.tensors import checksum

        self.version += 1
        report = self.sender.broadcast(self.version, named.items())
        version, got = self.queue.get(timeout=600)
        return report, report.ok and version == self.version and got == checksum(named.items())

    def close(self) -> None:
        self.process.join(timeout=60)
        self.sender.close()


def run_updates(model_dir: Path, *, lr: float, updates: int, tokens: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from weights.shared.delta import bits, decode, encode

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    params = [(name, p) for name, p in model.named_parameters()]
    optimizer = torch.optim.AdamW([p for _, p in params], lr=lr, weight_decay=0.0)
    previous = {name: p.detach().to(torch.bfloat16) for name, p in params}
    full = sum(t.numel() * t.element_size() for t in previous.values())
    keyframe = sum(encode(t, None).num_bytes for t in previous.values())
    held = {encoding: dict(previous) for encoding in ENCODINGS}  # each receiver's copy
    per_update: dict[str, list[float]] = {}
    exact = True
    wire = Wire(updates + 1)
    keyframe_report, wire_exact = wire.send(previous)
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    for _ in range(updates):
        ids = torch.randint(0, vocab, (1, tokens), generator=generator)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        current = {name: p.detach().to(torch.bfloat16) for name, p in params}
        changed = sum(int((bits(current[n]) != bits(previous[n])).sum()) for n in current)
        per_update.setdefault("changed_fraction", []).append(changed / (full / 2))
        for encoding in ENCODINGS:
            started = time.perf_counter()
            payloads = {n: encode(current[n], previous[n], encoding) for n in current}
            encoded = time.perf_counter()
            for name, payload in payloads.items():
                held[encoding][name] = decode(payload, held[encoding][name], current[name])
            decoded = time.perf_counter()
            exact &= all((bits(held[encoding][n]) == bits(current[n])).all() for n in current)
            size = sum(p.num_bytes for p in payloads.values())
            per_update.setdefault(f"{encoding}_ratio", []).append(size / full)
            per_update.setdefault(f"{encoding}_encode_s", []).append(encoded - started)
            per_update.setdefault(f"{encoding}_decode_s", []).append(decoded - encoded)
        sent, rebuilt = wire.send(current)
        wire_exact &= rebuilt and not sent.keyframe
        per_update.setdefault("wire_ratio", []).append(sent.num_bytes / sent.raw_bytes)
        per_update.setdefault("wire_transfer_s", []).append(sent.transfer_s)
        previous = current
    wire.close()
    figures: dict[str, float | int | bool] = {
        "full_bf16_mb": full / 1e6,
        "keyframe_ratio": keyframe / full,
        "bit_exact": exact,
        "wire_bit_exact": wire_exact,
        "wire_keyframe_transfer_s": keyframe_report.transfer_s,
    }
    for key, values in per_update.items():
        figures[f"{key}_median"] = statistics.median(values)
        figures[f"{key}_max"] = max(values)
    figures["ratio_first"] = per_update["xor_ratio"][0]
    figures["ratio_last"] = per_update["xor_ratio"][-1]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=64, help="tokens per training batch")
    parser.add_argument("--small", action="store_true", help=f"the {SMALL} model")
    args = parser.parse_args()
    shape = SMALL if args.small else QWEN2_0_5B
    model_dir = build_model(shape)
    figures: dict[str, float | int | str | bool] = {
        "model": shape,
        "updates": args.updates,
        "tokens_per_batch": args.tokens,
    }
    with load_average() as loads:
        for label, lr in LEARNING_RATES.items():
            figures[f"{label}_lr"] = lr
            results = run_updates(model_dir, lr=lr, updates=args.updates, tokens=args.tokens)
            figures.update({f"{label}_{key}": value for key, value in results.items()})
    figures.update(loads)
    report("delta_sync", "bf16 delta weight updates at the 0.5B shape", figures)


if __name__ == "__main__":
    main()
