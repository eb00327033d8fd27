"""What a single-machine run trains: its model directory (the demo's tiny model, warm-started
or random, or the user's own: `local.model_dir`) and its rows (the calculator's, generated,
or the user's own: `local.train_data` and `local.eval_data`). Checked before anything starts,
written into the run directory once, so that a run keeps what it started with.
"""

from __future__ import annotations

from pathlib import Path

from deploy.config import LocalRunConfig


def model_dir(local: LocalRunConfig) -> Path:
    """The run's model directory; ValueError for one of the user's that cannot be used."""
    from demo.tinymodel import build_random_tiny_model, shipped_model_dir

    if local.model_dir:
        from common.model_paths import model_dir_problem

        if problem := model_dir_problem(local.model_dir, key="local.model_dir"):
            raise ValueError(problem)
        if not Path(local.model_dir).is_dir():  # a hub id: nothing is downloaded here
            raise ValueError(f"local.model_dir: {local.model_dir} is not a directory")
        return Path(local.model_dir).resolve()
    if local.warm_start:
        return shipped_model_dir()  # the warm start shipped in the repository
    print("building a random-weight tiny model (seconds; cached) ...", flush=True)
    return build_random_tiny_model()


def own_rows(local: LocalRunConfig) -> dict[str, list[dict]] | None:
    """The user's train and eval rows, every row validated (ValueError naming the file, the
    line and the field), or None for the calculator's."""
    if not local.train_data:
        return None
    from learner.data import load_dataset

    return {"train": load_dataset(local.train_data), "eval": load_dataset(local.eval_data)}


def write_data(data_dir: Path, local: LocalRunConfig, own: dict | None) -> None:
    """train.jsonl and eval.jsonl of the run: the user's rows (copied: the run keeps what it
    started with, whatever happens to their files) or the calculator's, generated."""
    if own is None:
        from demo import data as demo_data

        demo_data.write_dataset(
            data_dir,
            num_train=local.num_train_rows,
            num_eval=local.num_eval_rows,
            seed=local.dataset_seed,
        )
        return
    from learner.data import write_dataset

    for split, rows in own.items():
        write_dataset(rows, data_dir / f"{split}.jsonl")
