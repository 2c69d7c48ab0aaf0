"""The one exception type for anything that breaks the wire protocol."""


class ProtocolError(ValueError):
    """A message, chunk or blob that must be rejected.

    ``code`` is a stable machine-readable reason that is sent back to the peer in an
    ``error`` message (see docs/protocol.md for the list); ``str(err)`` is for humans.
    """

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


# A server's rejection of a result with one of these codes says nothing against the device's
# own data (a pull that timed out, or chunks that stayed bad on the way): the device keeps its
# result, offered, and sends the same ``result`` again (docs/protocol.md §9.5). Any other code
# ends the task on the device.
RETRYABLE_RESULT_CODES = frozenset({"checksum_mismatch", "timeout"})


class OwnDataError(ProtocolError):
    """A rejection of a result because of the device's own data: a record pulled from the
    device, which hashes to the id the device named, is not a valid update (bad tensors, NaN,
    a replay). It resolves the device for the round (docs/protocol.md §10.2)."""
