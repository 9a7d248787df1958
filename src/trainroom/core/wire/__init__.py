"""The wire: the protocol's messages, their framing, the salvage of a bad frame and the error chain."""
