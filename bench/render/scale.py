"""Renderer of bench/scale.py: the same short run at growing model sizes over a real
151k-token vocabulary, each cost over what the machine gives for the same work."""

from __future__ import annotations

from bench.render.markdown import Figures, check, count, fixed, join, provenance, table

TOP = "0.5B"


def _sizes(f: Figures) -> list[str]:
    sizes = {key.split("/")[0] for key in f if "/" in key}
    return sorted(sizes, key=lambda size: (f.get(f"{size}/params", 0), size))


def scale(f: Figures) -> str:
    setup = (
        "`make bench-scale`: `python -m deploy.local` (every role, a real broker, engine and"
        " env server), 3 steps of 2 prompts x 4 samples, a checkpoint after every step, an"
        " eval on a snapshot at the end, at random Qwen2 models over Qwen's 151,643-token"
        " BPE (151,936 embedding rows, tied), in fp32 and, marked `@bf16` (by default only"
        " on a CPU that multiplies bf16 natively), with the engine in bf16 and the learner"
        " computing in bf16 over fp32 master weights. Each ratio"
        " divides by the machine's own figure for the same work, measured in the same run:"
        f" one loopback TCP stream ({count(f.get('loopback_mb_per_s'))} MB/s), fsynced disk"
        f" writes ({count(f.get('disk_write_mb_per_s'))} MB/s), reads from the disk, the page"
        f" cache evicted ({count(f.get('disk_read_mb_per_s'))} MB/s: what a restarted learner"
        " reads),"
        " and a bare torch loop"
        " (forward and backward over the run's own step of tokens in the same 1,024-token"
        " micro-batches, plain head, one AdamW step, one thread). Flat lines as the model"
        " grows: nothing grows faster than the model. The broadcast is given twice: on the"
        " wire (the bytes over the engine's time waiting for the round's messages: the"
        " broadcast's own speed) and for the whole round as the sender saw it, which in a"
        " streamed round also holds the engine's load of each bucket before it takes the"
        " next (vLLM on CPU repacks every linear layer it loads; on 2 cores the loopback"
        " stream itself keeps both busy, so the loads cannot hide behind it)."
    )
    rows = []
    for size in _sizes(f):
        g = {key.split("/", 1)[1]: value for key, value in f.items() if key.startswith(f"{size}/")}
        rows.append([
            size,
            fixed(g.get("weights_gb")),
            f"{count(g.get('learner_tokens_per_s'))} ({fixed(g.get('learner_vs_bare'))}x)",
            f"{fixed(g.get('learner_peak_gb'), 1)} ({fixed(g.get('learner_rss_x_state'))}x)",
            f"{fixed(g.get('actor_peak_gb'), 1)} ({fixed(g.get('actor_rss_x_weights'), 1)}x)",
            f"{count(g.get('broadcast_wire_mb_per_s'))} ({fixed(g.get('wire_of_loopback'))})"
            f" · {count(g.get('broadcast_mb_per_s'))} ({fixed(g.get('broadcast_of_loopback'))})",
            f"{fixed(g.get('checkpoint_gb'))} GB in {fixed(g.get('checkpoint_s'), 1)} s"
            f" ({fixed(g.get('checkpoint_x_disk'))}x), step waited"
            f" {fixed(g.get('checkpoint_wait_s'), 1)} s",
            f"{fixed(g.get('resume_s'), 1)} s ({fixed(g.get('resume_x_disk'))}x)",
            fixed(g.get("update_stall_s")),
        ])  # fmt: skip
    header = ["model", "fp32 weights, GB", "learner tokens/s (x bare loop)",
              "learner peak GB (x training state)", "actor peak GB (x weights)",
              "broadcast MB/s (of loopback): on the wire · the round, loads included",
              "checkpoint (x disk time), the next step's wait",
              "resume from it (x disk read time)", "engine stall per update, s"]  # fmt: skip
    top = {key.split("/", 1)[1]: v for key, v in f.items() if key.startswith(f"{TOP}/")}
    state_gb = 4 * top["weights_gb"] if "weights_gb" in top else None
    allowance = None
    if state_gb is not None and "bare_activation_gb" in top:
        allowance = top["learner_peak_gb"] / (1.3 * state_gb + top["bare_activation_gb"])
    targets = "\n".join([
        check(f"{TOP}: the broadcast on the wire over loopback bandwidth",
              top.get("wire_of_loopback"), 0.5, ">=", fixed),
        check(f"{TOP}: learner peak over (1.3 x training state + the bare loop's activations)",
              allowance, 1.0, "<=", fixed),
    ])  # fmt: skip
    return join(setup, table(header, rows), targets, provenance(f))
