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
