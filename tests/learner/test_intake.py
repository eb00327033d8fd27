"""learner/intake.py on a fake consumer: every message held until a checkpoint acks it (eval
ones included), redelivered copies acked without effect, and handled ids forgotten one
checkpoint after their ack, so the set does not grow with the run."""

from __future__ import annotations

import dataclasses

import msgspec

from broker.trajectories import ReceivedTrajectory
from learner.batching import GroupAssembler
from learner.intake import Intake
from tests.learner.builders import trajectory


class _Msg:
    def __init__(self, log: list[str], trajectory_id: str) -> None:
        self.log, self.trajectory_id = log, trajectory_id

    async def ack(self) -> None:
        self.log.append(f"ack {self.trajectory_id}")

    async def ack_sync(self) -> None:
        self.log.append(f"ack {self.trajectory_id}")

    async def term(self) -> None:
        self.log.append(f"term {self.trajectory_id}")


@dataclasses.dataclass
class _Consumer:
    num_corrupt: int = 0


def _intake(**fields) -> tuple[Intake, list[str], list]:
    log: list[str] = []
    eval_groups: list = []
    intake = Intake(_Consumer(), on_eval_group=eval_groups.append, **fields)
    return intake, log, eval_groups


def _received(log: list[str], **fields) -> ReceivedTrajectory:
    t = trajectory(**fields)
    return ReceivedTrajectory(
        trajectory=t, msg=_Msg(log, t.trajectory_id), claim=None, consumer=None
    )


async def test_training_messages_are_acked_only_when_a_checkpoint_covers_them():
    intake, log, _ = _intake()
    await intake._add(_received(log, trajectory_id="g0/0", sample_index=0))
    await intake._add(_received(log, trajectory_id="g0/1", sample_index=1))
    assert log == [] and intake.num_held == 2
    assert [t.trajectory_id for t in intake.groups.get_nowait().trajectories] == ["g0/0", "g0/1"]
    assert await intake.ack(["g0/0", "g0/1"]) == []
    assert log == ["ack g0/0", "ack g0/1"] and intake.num_held == 0


async def test_eval_messages_are_held_and_counted_with_the_checkpoint():
    intake, log, eval_groups = _intake()
    for i in range(2):
        received = _received(log, trajectory_id=f"e/{i}", group_id="e", sample_index=i)
        received.trajectory = msgspec.structs.replace(received.trajectory, is_eval=True)
        await intake._add(received)
    assert [g.group_id for g in eval_groups] == ["e"]
    assert log == []  # a crash now: both come back to the next learner, which counts them
    assert intake.take_eval_ids() == ["e/0", "e/1"] and intake.take_eval_ids() == []
    await intake.ack(["e/0", "e/1"])
    assert log == ["ack e/0", "ack e/1"]


async def test_handled_ids_are_forgotten_one_checkpoint_after_their_ack():
    intake, log, _ = _intake(covered_ids={"old/0"})
    # A copy of an id the restored checkpoint covers: acked again, nothing else.
    await intake._add(_received(log, trajectory_id="old/0", group_id="old"))
    assert log == ["ack old/0"] and intake.num_held == 0 and intake.num_redelivered == 1
    await intake._add(_received(log, trajectory_id="g1/0", group_id="g1", sample_index=0))
    await intake._add(_received(log, trajectory_id="g1/1", group_id="g1", sample_index=1))
    await intake.ack(["g1/0", "g1/1"])  # checkpoint k: the covered ids are forgotten now
    assert intake.train.seen_ids == {"g1/0", "g1/1"}
    # A copy still in flight when checkpoint k acked g1 arrives: acked, not trained again.
    await intake._add(_received(log, trajectory_id="g1/1", group_id="g1", sample_index=1))
    assert log[-1] == "ack g1/1" and intake.groups.qsize() == 1
    await intake.ack([])  # checkpoint k + 1: g1 can no longer come back
    assert intake.train.seen_ids == set() and intake.evals.seen_ids == set()


async def test_a_second_trajectory_for_a_filled_slot_is_malformed():
    intake, log, _ = _intake()
    await intake._add(_received(log, trajectory_id="a", sample_index=0))
    await intake._add(_received(log, trajectory_id="a-again", sample_index=0))
    assert log == ["ack a-again"] and intake.num_malformed == 1


def test_assembler_forgets_what_it_is_told():
    assembler = GroupAssembler(seen_ids={"a", "b", "c"})
    assembler.forget(["a", "c", "unknown"])
    assert assembler.seen_ids == {"b"}


async def test_another_runs_stragglers_are_terminated_and_counted_not_trained(caplog):
    """A fresh learner took the namespace over while an earlier run's actor still worked: what
    that actor sends is not this run's (its task ids carry the other run id)."""
    intake, log, eval_groups = _intake(run_id="ns-b2")
    for i in range(2):
        await intake._add(_received(log, trajectory_id=f"old/{i}", group_id="ns-a1-7",
                                    sample_index=i))  # fmt: skip
    evaluated = msgspec.structs.replace(
        trajectory(trajectory_id="olde/0", group_id="ns-a1-eval3-0"), is_eval=True
    )
    await intake._add(
        ReceivedTrajectory(trajectory=evaluated, msg=_Msg(log, "olde/0"), claim=None, consumer=None)
    )
    assert log == ["term old/0", "term old/1", "term olde/0"]
    assert intake.num_other_run == 3 and intake.num_malformed == 3
    assert intake.num_held == 0 and intake.groups.empty() and not eval_groups
    assert sum("not of this run (ns-b2)" in r.message for r in caplog.records) == 1  # per run

    await intake._add(_received(log, trajectory_id="new/0", group_id="ns-b2-0", sample_index=0))
    await intake._add(_received(log, trajectory_id="new/1", group_id="ns-b2-0", sample_index=1))
    assert intake.num_held == 2 and not intake.groups.empty()
