"""seqserve's `triton_python_backend_utils`: what Triton-style Python models import as `pb_utils`.

The python backend installs this module as ``sys.modules["triton_python_backend_utils"]``
before it imports a model.py, so an unchanged Triton Python model (a class
``TritonPythonModel`` with ``initialize(args)``, ``execute(requests)``, ``finalize()``) loads
as it is. The names and behaviour follow Triton's python_backend (``Tensor``,
``InferenceRequest``, ``InferenceResponse``, ``TritonError``, ``TritonModelException``, the
flag constants and the helper functions of ``triton_python_backend_utils.py``).

Custom metrics (``MetricFamily``, ``Metric``) appear on ``/metrics`` (``triton_metrics``).
BLS (``InferenceRequest.exec``/``async_exec``) calls other models (``triton_bls``). Not
provided: GPU tensors, ``auto_complete_config``. Response senders work as in Triton (decoupled
models stream any number of responses; see ``seqserve.engine.backends.triton_adapter``), and so
does request rescheduling (``set_release_flags``) in iterative sequence models.
"""

from __future__ import annotations

import json
import logging
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from seqserve._proto.model_config_pb2 import TYPE_BOOL
from seqserve.engine.backends import triton_metrics
from seqserve.engine.backends.bls import TRITON_EXEC
from seqserve.engine.device.arrays import is_device_array
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.responses import Responder
from seqserve.engine.tensors import DATA_TYPES, of_numpy

__all__ = [
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "Logger",
    "Metric",
    "MetricFamily",
    "ModelConfig",
    "PreferredMemory",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "using_decoupled_model_transaction_policy",
]

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_GPU = 0
TRITONSERVER_MEMORY_CPU = 1

# Triton's pb_utils tables, derived from the engine's one datatype table (BF16 has no numpy type).
TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    d.config_name: (bool if d.config == TYPE_BOOL else d.numpy.type) for d in DATA_TYPES if d.numpy is not None
}
_TRITON_TO_NUMPY: dict[int, Any] = {d.config: d.numpy.type for d in DATA_TYPES if d.numpy is not None}

_log = logging.getLogger("seqserve.model")
_sender_lock = threading.Lock()


# ------------------------------------------------------------------------------ errors


class TritonError:
    """An error a model attaches to a response; it fails that request alone."""

    UNKNOWN = Code.UNKNOWN
    INTERNAL = Code.INTERNAL
    NOT_FOUND = Code.NOT_FOUND
    INVALID_ARG = Code.INVALID_ARG
    UNAVAILABLE = Code.UNAVAILABLE
    UNSUPPORTED = Code.UNSUPPORTED
    ALREADY_EXISTS = Code.ALREADY_EXISTS
    CANCELLED = Code.CANCELLED

    __slots__ = ("_code", "_message")

    def __init__(self, message: str, code: int = Code.INTERNAL) -> None:
        if message is None:
            raise TypeError("TritonError: message must not be None")
        self._message = str(message)
        self._code = Code(int(code))

    def code(self) -> Code:
        return self._code

    def message(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code.name})"


class TritonModelException(Exception):
    """Raised by models (and by this module) for failures; in execute it fails the batch."""


class MetricFamily(triton_metrics.MetricFamily):
    error = TritonModelException


Metric = triton_metrics.TritonMetric


# ------------------------------------------------------------------------------ tensors


class Tensor:
    """A named array: numpy on the CPU, or a device array (DLPack on a GPU: a torch or cupy
    CUDA tensor, or a device state the engine hands over) that stays where it is."""

    __slots__ = ("_array", "_device", "_name")

    def __init__(self, name: str, array: Any) -> None:
        if not isinstance(name, str):
            raise TypeError(f"Tensor name must be a str, not {type(name).__name__}")
        self._name = name
        self._device: Any = None
        if not isinstance(array, np.ndarray) and is_device_array(array):  # numpy: the common case
            self._device = array
            self._array: np.ndarray | None = None
            return
        arr = np.asarray(array)
        if arr.dtype.kind == "U":  # Triton stores string tensors as bytes objects
            arr = np.char.encode(arr, "utf-8").astype(np.object_)
        self._array = arr

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        if self._array is None:
            raise TritonModelException(
                f"tensor '{self._name}' is on the GPU: as_numpy() needs a CPU tensor (use to_dlpack(), or copy it)"
            )
        return self._array

    def shape(self) -> list[int]:
        if self._array is None:
            return [int(d) for d in _device_shape(self._device)]
        return list(self._array.shape)

    def triton_dtype(self) -> int:
        if self._array is None:
            return numpy_to_triton_type(np.dtype(_device_dtype(self._device))) or 0
        return numpy_to_triton_type(self._array.dtype) or 0

    def is_cpu(self) -> bool:
        return self._array is not None

    def to_dlpack(self) -> Any:
        return self.__dlpack__()

    def __dlpack__(self, stream: Any = None) -> Any:
        if self._array is None:
            return self._device.__dlpack__(stream=stream)
        return self._array.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        if self._array is None:
            return tuple(self._device.__dlpack_device__())  # type: ignore[return-value]
        return self._array.__dlpack_device__()  # type: ignore[no-any-return]

    @property
    def device_array(self) -> Any:
        """The array itself: numpy, or the device array (seqserve's, for the engine)."""
        return self._device if self._array is None else self._array

    @staticmethod
    def from_dlpack(name: str, dlpack_object: Any) -> Tensor:
        """A tensor from an object with ``__dlpack__``: CPU memory becomes numpy (no copy), GPU
        memory is kept as the object itself (no copy)."""
        if not hasattr(dlpack_object, "__dlpack__"):
            raise TritonModelException(
                "Tensor.from_dlpack: seqserve accepts objects that implement __dlpack__ (not raw capsules)"
            )
        if is_device_array(dlpack_object):
            return Tensor(name, dlpack_object)
        return Tensor(name, np.from_dlpack(dlpack_object))

    def __repr__(self) -> str:
        where = "cpu" if self._array is not None else "gpu"
        return f"Tensor({self._name!r}, shape={self.shape()}, {where})"


def _device_shape(value: Any) -> tuple[int, ...]:
    shape = getattr(value, "shape", None)
    if shape is None:
        shape = value.__cuda_array_interface__["shape"]
    return tuple(shape)


def _device_dtype(value: Any) -> Any:
    iface = getattr(value, "__cuda_array_interface__", None)
    if iface is not None:
        return iface["typestr"]
    dtype = getattr(value, "dtype", "")
    return str(dtype).removeprefix("torch.")


# ---------------------------------------------------------------------------- requests


class InferenceResponse:
    """The response to one request: output tensors, or an error."""

    __slots__ = ("_error", "_outputs", "_parameters")

    def __init__(
        self,
        output_tensors: Sequence[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        outputs = list(output_tensors or [])
        for t in outputs:
            if not isinstance(t, Tensor):
                raise TritonModelException(
                    f"InferenceResponse output_tensors must be pb_utils.Tensor objects, found '{type(t).__name__}'"
                )
        if error is not None and not isinstance(error, TritonError):
            raise TritonModelException(f"InferenceResponse error must be a pb_utils.TritonError, not {type(error)}")
        self._outputs = outputs
        self._error = error
        self._parameters = json.dumps(parameters or {})

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters


class InferenceResponseSender:
    """Sends one request's responses to the client, from any thread, during or after
    ``execute``: any number then the final flag for decoupled models; exactly one response
    and the final flag for other models (which then return None for that request)."""

    __slots__ = ("_recording", "_responder", "_state_names", "_states")

    def __init__(self, responder: Responder, state_names: tuple[str, ...] = ()) -> None:
        self._responder = responder
        self._recording = bool(state_names)
        self._state_names = state_names
        # implicit-state outputs sent while execute runs; the sequence's next state
        self._states: dict[str, np.ndarray] = {}

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if response is None and flags == 0:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        outcome: Any = None
        if response is not None:
            if not isinstance(response, InferenceResponse):
                raise TritonModelException(
                    f"Expected an 'InferenceResponse' object to send, found type '{type(response).__name__}'"
                )
            err = response.error()
            if err is not None:
                outcome = InferenceError(err.code(), err.message())
            else:
                outcome = {t.name(): t.as_numpy() for t in response.output_tensors()}
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            self._responder.send(outcome, final=final)
        except InferenceError as e:
            raise TritonModelException(e.message) from None
        if self._recording and isinstance(outcome, dict):
            for name in self._state_names:
                if name in outcome:
                    self._states[name] = outcome[name]

    def stop_recording(self) -> dict[str, np.ndarray]:
        """Called when execute returns: the state outputs sent until then (the last of each)."""
        self._recording = False
        return self._states

    def is_cancelled(self) -> bool:
        """True once the client has gone (e.g. its gRPC stream was cancelled)."""
        return self._responder.is_cancelled()


class InferenceRequest:
    """One request of a batch, as Triton's python backend presents it."""

    __slots__ = (
        "_correlation_id",
        "_flags",
        "_inputs",
        "_make_responder",
        "_model_name",
        "_model_version",
        "_parameters",
        "_release_flags",
        "_request_id",
        "_requested",
        "_responder",
        "_sender",
        "_state_names",
        "_timeout",
    )

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: Sequence[Tensor] | None = None,
        requested_output_names: Sequence[str] | None = None,
        model_name: str | None = None,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        parameters: dict[str, Any] | str | None = None,
        **_ignored: Any,
    ) -> None:
        if inputs is None or requested_output_names is None or model_name is None:  # as Triton's constructor
            raise TypeError("InferenceRequest: model_name, inputs and requested_output_names are required")
        if not isinstance(correlation_id, (int, str)):
            raise TritonModelException("Correlation ID must be integer or string")
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._inputs = list(inputs)
        self._requested = list(requested_output_names)
        self._model_name = model_name
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._parameters = parameters if isinstance(parameters, str) else json.dumps(parameters or {})
        self._sender: InferenceResponseSender | None = None
        #: set by seqserve on the requests it passes to execute
        self._make_responder: Callable[[], Responder] | None = None
        self._responder: Responder | None = None
        self._state_names: tuple[str, ...] = ()  # implicit-state outputs a sender records
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        """The sequence id: an unsigned integer, or a string for string ids; 0 outside sequences."""
        return self._correlation_id

    def flags(self) -> int:
        """TRITONSERVER_REQUEST_FLAG_SEQUENCE_START | _END bits."""
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        """The client's request parameters as JSON (forwarded headers among them)."""
        return self._parameters

    def requested_output_names(self) -> list[str]:
        return self._requested

    def get_response_sender(self) -> InferenceResponseSender:
        with _sender_lock:  # models may ask from several threads
            if self._sender is None:
                self._sender = InferenceResponseSender(self._get_responder(), self._state_names)
            return self._sender

    def is_cancelled(self) -> bool:
        """True once the client has gone (e.g. its gRPC stream was cancelled)."""
        responder = self._responder
        if responder is None:
            if self._make_responder is None:
                return False
            with _sender_lock:
                responder = self._get_responder()
        return responder.is_cancelled()

    def _get_responder(self) -> Responder:
        if self._responder is None:
            if self._make_responder is None:
                raise TritonModelException("a response sender exists only for the requests passed to execute")
            self._responder = self._make_responder()
        return self._responder

    def set_release_flags(self, flags: int) -> None:
        """TRITONSERVER_REQUEST_RELEASE_RESCHEDULE: once execute returns, the request runs
        again as its sequence's next step (an iterative sequence model's only; the adapter
        answers other models' rescheduled requests with Triton's error)."""
        if not isinstance(flags, int) or flags & ~(
            TRITONSERVER_REQUEST_RELEASE_ALL | TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
        ):
            raise TritonModelException(f"invalid request release flags: {flags!r}")
        self._release_flags = flags

    def release_flags(self) -> int:
        """What set_release_flags set (TRITONSERVER_REQUEST_RELEASE_ALL by default)."""
        return self._release_flags

    def exec(self, decoupled: bool = False) -> Any:
        """BLS: run this request on ``model_name`` and wait (GIL released) for the response, or
        (``decoupled``) an iterator over the responses; errors come back as the response's
        ``TritonError`` (``seqserve.engine.backends.triton_bls``)."""
        return TRITON_EXEC.runner().execute(self, self._model_name, self._model_version, decoupled)

    def async_exec(self, decoupled: bool = False) -> Any:
        """BLS from an ``async def execute``: an awaitable of what ``exec`` returns."""
        return TRITON_EXEC.runner().execute_async(self, self._model_name, self._model_version, decoupled)


# ------------------------------------------------------------------------------ logging


class Logger:
    """pb_utils.Logger: writes to the server's log ("seqserve.model")."""

    class LogLevel:
        INFO = logging.INFO
        WARNING = logging.WARNING
        ERROR = logging.ERROR
        VERBOSE = logging.DEBUG

    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: int = logging.INFO) -> None:
        _log.log(int(level), "%s", message)

    @staticmethod
    def log_info(message: str) -> None:
        _log.info("%s", message)

    @staticmethod
    def log_warn(message: str) -> None:
        _log.warning("%s", message)

    @staticmethod
    def log_error(message: str) -> None:
        _log.error("%s", message)

    @staticmethod
    def log_verbose(message: str) -> None:
        _log.debug("%s", message)


# ------------------------------------------------------------------------------ helpers


def serialize_byte_tensor(input_tensor: np.ndarray) -> Any:
    """Flatten a bytes tensor into 4-byte-length-prefixed elements, in C order."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype == np.object_ or input_tensor.dtype.type == np.bytes_:
        parts = []
        for item in input_tensor.reshape(-1).tolist():
            s = item if isinstance(item, bytes) else str(item).encode("utf-8")
            parts.append(struct.pack("<I", len(s)))
            parts.append(s)
        return b"".join(parts)
    return None


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """The inverse of serialize_byte_tensor: a 1-D object array of bytes."""
    strs = []
    offset = 0
    while offset < len(encoded_tensor):
        (n,) = struct.unpack_from("<I", encoded_tensor, offset)
        offset += 4
        strs.append(bytes(encoded_tensor[offset : offset + n]))
        offset += n
    return np.array(strs, dtype=np.object_)


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for t in inference_request.inputs():
        if t.name() == name:
            return t
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for t in inference_response.output_tensors():
        if t.name() == name:
            return t
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for props in model_config.get("input", []):
        if props["name"] == name:
            return props  # type: ignore[no-any-return]
    return None


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for props in model_config.get("output", []):
        if props["name"] == name:
            return props  # type: ignore[no-any-return]
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    policy = model_config.get("model_transaction_policy")
    return bool(policy and policy.get("decoupled"))


def triton_to_numpy_type(data_type: int) -> Any:
    return _TRITON_TO_NUMPY.get(data_type)


def numpy_to_triton_type(data_type: Any) -> int | None:
    dt = np.dtype(data_type)
    if dt.kind == "U":  # as in Triton: str arrays have no Triton type (bytes and objects do)
        return None
    d = of_numpy(dt)
    return None if d is None else d.config


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


class ModelConfig:
    """The config object of Triton's ``auto_complete_config`` (read access only here:
    seqserve does not call ``auto_complete_config``)."""

    def __init__(self, model_config: str) -> None:
        self._model_config = json.loads(model_config)

    def as_dict(self) -> dict[str, Any]:
        return self._model_config  # type: ignore[no-any-return]


class PreferredMemory:
    """Where a BLS call's outputs should be put (accepted; seqserve returns them in CPU memory)."""

    def __init__(self, preferred_memory_type: int = TRITONSERVER_MEMORY_CPU, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id
