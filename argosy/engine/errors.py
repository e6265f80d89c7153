"""Errors the engine raises for bad requests; the server maps them to OpenAI 400 errors."""


class InvalidRequestError(ValueError):
    """A request the engine cannot run as given; `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param
