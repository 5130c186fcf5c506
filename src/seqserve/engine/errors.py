"""Error types shared by the engine and mapped to wire status codes by the API."""

from __future__ import annotations

from seqserve.engine._core import Code

__all__ = ["Code", "DecoupledModelError", "InferenceError", "ModelConfigError"]

# ``Code``, the failure category the front-ends map to an HTTP / gRPC status, is defined once,
# in the compiled core (csrc/common.h, an enum.IntEnum in Python): the core's refusals and
# failures carry it as they are.


class InferenceError(Exception):
    """An error with a status code. ``str()`` is the message alone, because
    clients match on the exact text. ``retry_after_s``: the refusal is temporary (a full
    backlog); HTTP answers it with a ``Retry-After`` header."""

    code: Code
    message: str
    retry_after_s: float | None

    def __init__(self, code: Code, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.code = Code(code)
        self.message = message
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code.name}, {self.message!r})"


class ModelConfigError(InferenceError):
    """A model's configuration cannot be loaded (bad file or invalid settings).

    INVALID_ARG by default; parse failures of config.pbtxt use INTERNAL, as
    Triton does.
    """

    def __init__(self, message: str, code: Code = Code.INVALID_ARG) -> None:
        super().__init__(code, message)


class DecoupledModelError(InferenceError):
    """A single-response call (``Server.submit``/``infer``, HTTP infer, gRPC ModelInfer) was
    made to a decoupled model, which may answer a request with any number of responses.

    The front-ends re-word it as Triton does for their endpoint."""

    def __init__(self, model: str) -> None:
        super().__init__(
            Code.UNSUPPORTED,
            f"model '{model}' uses the decoupled transaction policy and may send several responses per request: "
            "use a streaming call (gRPC ModelStreamInfer, or Server.stream)",
        )
