"""The bus API the roles use, in one import: `from broker import client`."""

from broker.connection import connect
from broker.policy import PolicyStore
from broker.prompts import PromptPuller, ReceivedPrompt, publish_prompts
from broker.streams import StreamLimits, ensure_streams, ensure_streams_fresh_consumer
from broker.trajectories import ReceivedTrajectory, TrajectoryConsumer, TrajectoryPublisher

__all__ = [
    "PolicyStore",
    "PromptPuller",
    "ReceivedPrompt",
    "ReceivedTrajectory",
    "StreamLimits",
    "TrajectoryConsumer",
    "TrajectoryPublisher",
    "connect",
    "ensure_streams",
    "ensure_streams_fresh_consumer",
    "publish_prompts",
]
