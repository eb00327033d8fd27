from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChatMessage(_message.Message):
    __slots__ = ("role", "content", "name")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    name: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class ToolSpec(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...

class EnvInfo(_message.Message):
    __slots__ = ("name", "description")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ...) -> None: ...

class ListEnvsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListEnvsResponse(_message.Message):
    __slots__ = ("envs",)
    ENVS_FIELD_NUMBER: _ClassVar[int]
    envs: _containers.RepeatedCompositeFieldContainer[EnvInfo]
    def __init__(self, envs: _Optional[_Iterable[_Union[EnvInfo, _Mapping]]] = ...) -> None: ...

class ResetRequest(_message.Message):
    __slots__ = ("env_class", "task_json", "session_id", "tool_format")
    ENV_CLASS_FIELD_NUMBER: _ClassVar[int]
    TASK_JSON_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FORMAT_FIELD_NUMBER: _ClassVar[int]
    env_class: str
    task_json: str
    session_id: str
    tool_format: str
    def __init__(self, env_class: _Optional[str] = ..., task_json: _Optional[str] = ..., session_id: _Optional[str] = ..., tool_format: _Optional[str] = ...) -> None: ...

class ResetResponse(_message.Message):
    __slots__ = ("session_id", "messages", "tools", "metadata_json", "kind")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    METADATA_JSON_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    tools: _containers.RepeatedCompositeFieldContainer[ToolSpec]
    metadata_json: str
    kind: str
    def __init__(self, session_id: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., tools: _Optional[_Iterable[_Union[ToolSpec, _Mapping]]] = ..., metadata_json: _Optional[str] = ..., kind: _Optional[str] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("session_id", "action", "seq")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    action: str
    seq: int
    def __init__(self, session_id: _Optional[str] = ..., action: _Optional[str] = ..., seq: _Optional[int] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("observations", "reward", "done", "metadata_json")
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    METADATA_JSON_FIELD_NUMBER: _ClassVar[int]
    observations: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    reward: float
    done: bool
    metadata_json: str
    def __init__(self, observations: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., reward: _Optional[float] = ..., done: _Optional[bool] = ..., metadata_json: _Optional[str] = ...) -> None: ...

class CloseRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RunWorkflowRequest(_message.Message):
    __slots__ = ("session_id", "base_url", "api_key")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BASE_URL_FIELD_NUMBER: _ClassVar[int]
    API_KEY_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    base_url: str
    api_key: str
    def __init__(self, session_id: _Optional[str] = ..., base_url: _Optional[str] = ..., api_key: _Optional[str] = ...) -> None: ...

class RunWorkflowResponse(_message.Message):
    __slots__ = ("reward", "metadata_json", "error")
    REWARD_FIELD_NUMBER: _ClassVar[int]
    METADATA_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    reward: float
    metadata_json: str
    error: str
    def __init__(self, reward: _Optional[float] = ..., metadata_json: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...
