"""The bus API the roles use, in one import: `from broker import client`."""

from broker.connection import BrokerUnreachable, connect, connect_to, wait_for_broker
from broker.episodes import EpisodeStore
from broker.policy import PolicyStore
from broker.prompts import PromptPuller, ReceivedPrompt, publish_prompts
from broker.streams import StreamLimits, ensure_streams, ensure_streams_fresh_consumer
from broker.trajectories import ReceivedTrajectory, TrajectoryConsumer, TrajectoryPublisher

__all__ = [
    "BrokerUnreachable",
    "EpisodeStore",
    "PolicyStore",
    "PromptPuller",
    "ReceivedPrompt",
    "ReceivedTrajectory",
    "StreamLimits",
    "TrajectoryConsumer",
    "TrajectoryPublisher",
    "connect",
    "connect_to",
    "ensure_streams",
    "ensure_streams_fresh_consumer",
    "publish_prompts",
    "wait_for_broker",
]
