"""What bench/scale.py measures around a run, kept apart from the run itself: the bare torch
loop the learner is compared with, the machine's disk bandwidth, and the peak resident
memory of each role's processes. (The ladder of model shapes and their random models:
demo/random_model.py.)"""

from __future__ import annotations

import os
import time
from pathlib import Path

from bench.common import CHUNK
from common.proc_memory import status_mib


def bare_loop_tokens_per_s(model_dir: Path, *, step_tokens: int, micro_tokens: int) -> float:
    """What torch alone does with the learner's work: forward and backward over `step_tokens`
    tokens in micro-batches of `micro_tokens` (one sequence each), then one AdamW step, on one
    thread as the learner runs; tokens per second of the best of two steps after a warm-up."""
    import torch
    from transformers import Qwen2ForCausalLM

    torch.set_num_threads(1)
    model = Qwen2ForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    sizes = [micro_tokens] * (step_tokens // micro_tokens) + [step_tokens % micro_tokens]
    batches = [torch.randint(vocab, (1, n), generator=generator) for n in sizes if n > 1]

    def step() -> float:
        started = time.perf_counter()
        for ids in batches:
            logits = model(input_ids=ids).logits.float()
            loss = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:])
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - started

    step()  # allocates the optimizer's state
    return step_tokens / min(step() for _ in range(2))


def evict(path: Path) -> None:
    """Drop a file's (or a directory's files') clean pages from the page cache, so that the
    next read comes from the disk, as after a restart (POSIX_FADV_DONTNEED; no root)."""
    for file in [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]:
        with file.open("rb") as handle:
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def disk_bytes_per_s(directory: Path, nbytes: int = 1024 * 2**20) -> dict[str, float]:
    """Writing `nbytes` to a new file in `directory` and fsyncing it, then reading it back
    from the disk (its pages evicted first, as a restarted learner finds its checkpoint):
    bytes per second each."""
    path = directory / "scale-disk-probe.bin"
    payload = os.urandom(CHUNK)
    started = time.perf_counter()
    with path.open("wb") as out:
        for offset in range(0, nbytes, CHUNK):
            out.write(payload[: min(CHUNK, nbytes - offset)])
        out.flush()
        os.fsync(out.fileno())
    write_s = time.perf_counter() - started
    evict(path)
    started = time.perf_counter()
    with path.open("rb") as source:
        while source.read(CHUNK):
            pass
    read_s = time.perf_counter() - started
    path.unlink()
    return {"write": nbytes / write_s, "read": nbytes / read_s}


def resume_seconds(trainer_json: str, checkpoint: Path) -> float:
    """Seconds a learner (one rank, fresh: the run's trainer config, the model built from
    its model_path, AdamW, the schedule) takes to restore `checkpoint` as the learner
    resumes (`Trainer.load`: DCP reads model, optimizer and scheduler state), its files
    evicted from the page cache first: read from the disk, as after a restart."""
    import torch
    from transformers import AutoModelForCausalLM

    from learner.trainer.config import TrainerConfig
    from learner.trainer.trainer import Trainer

    torch.set_num_threads(1)
    config = TrainerConfig.model_validate_json(trainer_json)
    model = AutoModelForCausalLM.from_pretrained(config.model_path, dtype=torch.float32)
    trainer = Trainer(model, config, device=torch.device("cpu"))
    evict(checkpoint)
    started = time.perf_counter()
    trainer.load(checkpoint)
    return time.perf_counter() - started


# ---- the roles' memory ------------------------------------------------------------------------

ROLES = {"learner": "learner.cli", "actor": "actors.cli", "envserver": "envservers.cli"}
"""Role name -> the module its top process runs (deploy/local.py's services)."""


def _peak_bytes(pid: int) -> int:
    """Process `pid`'s resident high-water mark; 0 once it is gone (or a zombie: no memory)."""
    try:
        return int(status_mib("VmHWM", pid) * 2**20)
    except (OSError, RuntimeError):
        return 0


def role_of(command: str) -> str | None:
    """The role a launcher's child runs, from its command line (None: not a role's)."""
    return next((role for role, module in ROLES.items() if f"-m {module}" in command), None)


class RolePeaks:
    """Each role's peak resident memory: the sum, over the processes of the role's tree (its
    top process under the launcher and their descendants: an actor's engine cores too), of
    each process's high-water mark (VmHWM), kept across polls so a process that exited still
    counts. Poll it while the run goes (`poll(launcher_pid)`)."""

    def __init__(self) -> None:
        self.peak_bytes: dict[tuple[str, int], int] = {}

    def poll(self, launcher_pid: int) -> None:
        from deploy.proctree import descendants, processes

        table = processes()
        for top in (p for p in table.values() if p.ppid == launcher_pid):
            if (role := role_of(top.command)) is None:
                continue
            for process in [top, *descendants(top.pid, table)]:
                key = (role, process.pid)
                self.peak_bytes[key] = max(self.peak_bytes.get(key, 0), _peak_bytes(process.pid))

    def bytes_by_role(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for (role, _), peak in self.peak_bytes.items():
            totals[role] = totals.get(role, 0) + peak
        return totals
