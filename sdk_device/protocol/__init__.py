"""Wire protocol v2: topics (namespace v1), control messages, task plans and blob encoding
(docs/protocol.md)."""

from .blobs import (
    DEFAULT_CHUNK_BYTES,
    Chunk,
    check_update,
    chunk_count,
    decode_chunk,
    decode_tensors,
    encode_chunk,
    encode_tensors,
    sha256_hex,
)
from .errors import ProtocolError
from .messages import (
    SCHEMA_VERSION,
    Ack,
    BlobRef,
    BlobRequest,
    Error,
    Heartbeat,
    Hello,
    Message,
    Result,
    Task,
    decode,
    encode,
    new_id,
)
from .topics import PROTOCOL_VERSION, FleetTopics

__all__ = [
    "DEFAULT_CHUNK_BYTES", "PROTOCOL_VERSION", "SCHEMA_VERSION", "Ack", "BlobRef",
    "BlobRequest", "Chunk", "Error", "FleetTopics", "Heartbeat", "Hello", "Message",
    "ProtocolError", "Result", "Task", "check_update", "chunk_count", "decode",
    "decode_chunk", "decode_tensors", "encode", "encode_chunk", "encode_tensors", "new_id",
    "sha256_hex",
]
