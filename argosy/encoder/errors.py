"""Errors for inputs the encoder cannot take; the server maps them to 400/413 (and TEI's shape on /rerank)."""

from __future__ import annotations


class EncoderInputError(ValueError):
    """An input the encoder cannot run as given; `param` names the request field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class InputTooLongError(EncoderInputError):
    def __init__(self, index: int, length: int, limit: int, param: str = "input"):
        super().__init__(f"{param}[{index}] has {length} tokens, over this model's limit of {limit} tokens "
                         "(special tokens included); shorten it or send \"truncate\": true", param)
        self.index, self.length, self.limit = index, length, limit


class BatchTooLargeError(EncoderInputError):
    """More inputs in one request than the server takes (TEI: max_client_batch_size; 413)."""

    def __init__(self, count: int, limit: int, param: str = "input"):
        super().__init__(f"{count} inputs in one request, over this server's limit of {limit}; "
                         "split the request", param)
        self.count, self.limit = count, limit
