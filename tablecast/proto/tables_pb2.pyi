from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Row(_message.Message):
    __slots__ = ("key", "value", "partition", "offset", "timestamp")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    partition: int
    offset: int
    timestamp: int
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., timestamp: _Optional[int] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("table", "key", "max_lag")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    MAX_LAG_FIELD_NUMBER: _ClassVar[int]
    table: str
    key: str
    max_lag: int
    def __init__(self, table: _Optional[str] = ..., key: _Optional[str] = ..., max_lag: _Optional[int] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("found", "row", "position", "node", "lag")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    ROW_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    found: bool
    row: Row
    position: str
    node: str
    lag: int
    def __init__(self, found: _Optional[bool] = ..., row: _Optional[_Union[Row, _Mapping]] = ..., position: _Optional[str] = ..., node: _Optional[str] = ..., lag: _Optional[int] = ...) -> None: ...

class BatchGetRequest(_message.Message):
    __slots__ = ("table", "keys", "max_lag")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    MAX_LAG_FIELD_NUMBER: _ClassVar[int]
    table: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    max_lag: int
    def __init__(self, table: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., max_lag: _Optional[int] = ...) -> None: ...

class BatchGetResult(_message.Message):
    __slots__ = ("key", "found", "value", "forbidden")
    KEY_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    FORBIDDEN_FIELD_NUMBER: _ClassVar[int]
    key: str
    found: bool
    value: str
    forbidden: bool
    def __init__(self, key: _Optional[str] = ..., found: _Optional[bool] = ..., value: _Optional[str] = ..., forbidden: _Optional[bool] = ...) -> None: ...

class BatchGetResponse(_message.Message):
    __slots__ = ("results", "position", "node", "lag")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[BatchGetResult]
    position: str
    node: str
    lag: int
    def __init__(self, results: _Optional[_Iterable[_Union[BatchGetResult, _Mapping]]] = ..., position: _Optional[str] = ..., node: _Optional[str] = ..., lag: _Optional[int] = ...) -> None: ...

class RangeRequest(_message.Message):
    __slots__ = ("table", "start", "end", "prefix", "limit", "cursor")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    table: str
    start: str
    end: str
    prefix: str
    limit: int
    cursor: str
    def __init__(self, table: _Optional[str] = ..., start: _Optional[str] = ..., end: _Optional[str] = ..., prefix: _Optional[str] = ..., limit: _Optional[int] = ..., cursor: _Optional[str] = ...) -> None: ...

class RangeItem(_message.Message):
    __slots__ = ("key", "value", "partition", "offset", "timestamp")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    partition: int
    offset: int
    timestamp: int
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., timestamp: _Optional[int] = ...) -> None: ...

class RangeResponse(_message.Message):
    __slots__ = ("items", "next_cursor", "position", "node", "lag")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[RangeItem]
    next_cursor: str
    position: str
    node: str
    lag: int
    def __init__(self, items: _Optional[_Iterable[_Union[RangeItem, _Mapping]]] = ..., next_cursor: _Optional[str] = ..., position: _Optional[str] = ..., node: _Optional[str] = ..., lag: _Optional[int] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("table", "keys", "prefix", "start", "end", "no_snapshot", "since")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    NO_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    table: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    prefix: str
    start: str
    end: str
    no_snapshot: bool
    since: str
    def __init__(self, table: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., prefix: _Optional[str] = ..., start: _Optional[str] = ..., end: _Optional[str] = ..., no_snapshot: _Optional[bool] = ..., since: _Optional[str] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("event", "id", "row", "rows")
    EVENT_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    ROW_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    event: str
    id: str
    row: Row
    rows: int
    def __init__(self, event: _Optional[str] = ..., id: _Optional[str] = ..., row: _Optional[_Union[Row, _Mapping]] = ..., rows: _Optional[int] = ...) -> None: ...
