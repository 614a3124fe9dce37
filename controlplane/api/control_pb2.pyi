from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class LoadRequest(_message.Message):
    __slots__ = ("model", "digest", "force", "wait", "host", "tag", "models")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    model: str
    digest: str
    force: bool
    wait: bool
    host: str
    tag: str
    models: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model: _Optional[str] = ..., digest: _Optional[str] = ..., force: _Optional[bool] = ..., wait: _Optional[bool] = ..., host: _Optional[str] = ..., tag: _Optional[str] = ..., models: _Optional[_Iterable[str]] = ...) -> None: ...

class RollbackRequest(_message.Message):
    __slots__ = ("model", "to_digest", "host", "force", "to_tag")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TO_DIGEST_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    TO_TAG_FIELD_NUMBER: _ClassVar[int]
    model: str
    to_digest: str
    host: str
    force: bool
    to_tag: str
    def __init__(self, model: _Optional[str] = ..., to_digest: _Optional[str] = ..., host: _Optional[str] = ..., force: _Optional[bool] = ..., to_tag: _Optional[str] = ...) -> None: ...

class UnloadRequest(_message.Message):
    __slots__ = ("model", "dependents", "host", "force")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DEPENDENTS_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    model: str
    dependents: bool
    host: str
    force: bool
    def __init__(self, model: _Optional[str] = ..., dependents: _Optional[bool] = ..., host: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, models: _Optional[_Iterable[str]] = ...) -> None: ...

class PolicyRequest(_message.Message):
    __slots__ = ("model", "policy", "host")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    model: str
    policy: str
    host: str
    def __init__(self, model: _Optional[str] = ..., policy: _Optional[str] = ..., host: _Optional[str] = ...) -> None: ...

class PinRequest(_message.Message):
    __slots__ = ("model", "pinned", "host")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    model: str
    pinned: bool
    host: str
    def __init__(self, model: _Optional[str] = ..., pinned: _Optional[bool] = ..., host: _Optional[str] = ...) -> None: ...

class GcRequest(_message.Message):
    __slots__ = ("keep",)
    KEEP_FIELD_NUMBER: _ClassVar[int]
    keep: int
    def __init__(self, keep: _Optional[int] = ...) -> None: ...

class PingRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TagRequest(_message.Message):
    __slots__ = ("model", "name", "digest", "delete")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    model: str
    name: str
    digest: str
    delete: bool
    def __init__(self, model: _Optional[str] = ..., name: _Optional[str] = ..., digest: _Optional[str] = ..., delete: _Optional[bool] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("model", "step", "state", "message", "digest", "final", "outcome", "result_json")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    model: str
    step: str
    state: str
    message: str
    digest: str
    final: bool
    outcome: str
    result_json: str
    def __init__(self, model: _Optional[str] = ..., step: _Optional[str] = ..., state: _Optional[str] = ..., message: _Optional[str] = ..., digest: _Optional[str] = ..., final: _Optional[bool] = ..., outcome: _Optional[str] = ..., result_json: _Optional[str] = ...) -> None: ...

class JsonReply(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...
