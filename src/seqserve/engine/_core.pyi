"""Typed surface of the compiled core (csrc/, built by setup.py). Checked by mypy.stubtest.

Only the engine imports this module. Element types are numpy dtypes from the engine's one
dtype table (``engine/tensors.py``); an object dtype means BYTES. Times are microseconds.
"""

import enum
from collections.abc import Callable
from typing import Any, TypeAlias, final

import numpy as np

class _Pybind11Type(type):
    """pybind11's metaclass (pybind11_builtins.pybind11_type) of every class below."""

class Strategy(enum.IntEnum):
    """How a model's requests are batched."""

    STATELESS = 0
    DIRECT = 1
    OLDEST = 2
    DYNAMIC = 3

class ControlKind(enum.IntEnum):
    """What a sequence control tensor carries."""

    START = 0
    READY = 1
    END = 2
    CORRID = 3

class Code(enum.IntEnum):
    """Why a request failed or was refused: the one status vocabulary (engine.errors re-exports it)."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

class InputSpec(metaclass=_Pybind11Type):
    """A model input as the core gathers it into batches."""

    def __init__(
        self,
        *,
        name: str,
        dtype: np.dtype[Any],
        must_match: bool = False,
        default_shape: list[int] = ...,
        ragged: bool = False,
    ) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> np.dtype[Any]: ...
    @property
    def must_match(self) -> bool:
        """Variable dims without ragged batching: a batch's requests must have equal shapes."""
    @property
    def default_shape(self) -> list[int]:
        """Item dims with -1 -> 1: the shape of zero-filled rows when no request fixes one."""
    @property
    def ragged(self) -> bool:
        """allow_ragged_batch on a batched model: the batch holds every request's elements end
        to end (1-D) and each request's shape."""

class ControlSpec(metaclass=_Pybind11Type):
    """A sequence control tensor the core fills per batch row. START/END/READY hold
    ``true_value`` or ``false_value`` in a numeric dtype; CORRID holds the sequence id, in an
    integer dtype (its low bytes) or object (BYTES, string ids)."""

    def __init__(
        self,
        *,
        name: str,
        kind: ControlKind,
        dtype: np.dtype[Any],
        false_value: float = 0.0,
        true_value: float = 1.0,
    ) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> ControlKind: ...
    @property
    def dtype(self) -> np.dtype[Any]: ...
    @property
    def false_value(self) -> float: ...
    @property
    def true_value(self) -> float: ...

class StateSpec(metaclass=_Pybind11Type):
    """An implicit state the core keeps per sequence slot. ``initial`` is one sequence's starting
    value (BYTES: serialized) of shape ``initial_dims``; a dim of -1 in ``dims`` makes it
    variable-shaped."""

    def __init__(
        self,
        *,
        input_name: str,
        output_name: str,
        dtype: np.dtype[Any],
        dims: list[int],
        initial: bytes,
        initial_dims: list[int],
        same_buffer: bool = False,
    ) -> None: ...
    @property
    def input_name(self) -> str: ...
    @property
    def output_name(self) -> str: ...
    @property
    def dtype(self) -> np.dtype[Any]: ...
    @property
    def dims(self) -> list[int]: ...
    @property
    def initial(self) -> bytes: ...
    @property
    def initial_dims(self) -> list[int]: ...
    @property
    def same_buffer(self) -> bool:
        """``use_same_buffer_for_input_output``: the input state is writable and is the next state."""

class QueuePolicy(metaclass=_Pybind11Type):
    """The dynamic batcher's policy for one priority level."""

    def __init__(
        self,
        *,
        delay_on_timeout: bool = False,
        default_timeout_us: int = 0,
        allow_override: bool = False,
        max_queue_size: int = 0,
    ) -> None: ...
    @property
    def delay_on_timeout(self) -> bool:
        """A timed-out request waits behind its level (DELAY) instead of failing (REJECT)."""
    @property
    def default_timeout_us(self) -> int: ...
    @property
    def allow_override(self) -> bool: ...
    @property
    def max_queue_size(self) -> int:
        """0: unlimited."""

class ModelSpec(metaclass=_Pybind11Type):
    """Everything the core needs to schedule one model (read-only once built)."""

    def __init__(
        self,
        *,
        name: str,
        strategy: Strategy = ...,
        max_batch_size: int = 0,
        instance_count: int = 1,
        slots_per_instance: int = 1,
        idle_us: int = 1000000,
        max_queue_delay_us: int = 0,
        min_slot_utilization: float = 0.0,
        inputs: list[InputSpec] = ...,
        controls: list[ControlSpec] = ...,
        states: list[StateSpec] = ...,
        delay_requests: int = 0,
        delay_backlog_requests: int = 0,
        preferred_batch_sizes: list[int] = ...,
        batch_delay_us: int = 0,
        priority_levels: int = 1,
        default_priority: int = 1,
        queue_policies: list[QueuePolicy] = ...,
        timeout_complete: bool = False,
        tombstone_us: int = 3600000000,
        max_tombstones: int = 10000,
        latency_buckets_ms: list[float] = ...,
        max_backlog_sequences: int = 0,
        max_tombstones_per_client: int = 0,
    ) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def strategy(self) -> Strategy: ...
    @property
    def max_batch_size(self) -> int: ...
    @property
    def instance_count(self) -> int: ...
    @property
    def slots_per_instance(self) -> int: ...
    @property
    def idle_us(self) -> int: ...
    @property
    def max_queue_delay_us(self) -> int: ...
    @property
    def min_slot_utilization(self) -> float: ...
    @property
    def inputs(self) -> list[InputSpec]: ...
    @property
    def controls(self) -> list[ControlSpec]: ...
    @property
    def states(self) -> list[StateSpec]: ...
    @property
    def delay_requests(self) -> int: ...
    @property
    def delay_backlog_requests(self) -> int: ...
    @property
    def preferred_batch_sizes(self) -> list[int]: ...
    @property
    def batch_delay_us(self) -> int: ...
    @property
    def priority_levels(self) -> int: ...
    @property
    def default_priority(self) -> int: ...
    @property
    def queue_policies(self) -> list[QueuePolicy]: ...
    @property
    def timeout_complete(self) -> bool: ...
    @property
    def tombstone_us(self) -> int:
        """How long an ended or expired session is remembered (0: not at all)."""
    @property
    def max_tombstones(self) -> int:
        """How many ended or expired sessions are remembered at most (least recently used
        dropped first)."""
    @property
    def latency_buckets_ms(self) -> list[float]:
        """Upper bounds of the request latency histogram's buckets, ascending (+Inf implied)."""
    @property
    def max_backlog_sequences(self) -> int:
        """Sequences: how many may wait in the backlog; a START beyond it is refused (0: no bound)."""
    @property
    def max_tombstones_per_client(self) -> int:
        """How many of them one client holds at most (0: no bound but max_tombstones)."""

@final
class RequestHeader:
    """A request's scalars for ``Scheduler.submit``, by name; its tensors go apart. A fixed
    layout in the core, so that it can cross a process boundary as a ring record's head. A
    plain CPython type (built once per request: a cheap constructor), not a pybind11 class."""

    def __new__(
        cls,
        *,
        handle: int,
        sequence_id: int | str = 0,
        start: bool = False,
        end: bool = False,
        session: bool = False,
        timeout_us: int = 0,
        rows: int = 1,
        priority: int = 0,
        client: int = 0,
    ) -> RequestHeader: ...
    @property
    def handle(self) -> int:
        """The caller's name for the request: answers and cancel() use it."""
    @property
    def sequence_id(self) -> int | str:
        """Its sequence's id (0: none)."""
    @property
    def start(self) -> bool: ...
    @property
    def end(self) -> bool: ...
    @property
    def session(self) -> bool:
        """Named by a session: START is implied when the sequence is not live, unless it is a
        session that ended or expired."""
    @property
    def timeout_us(self) -> int:
        """Queue timeout (0: the queue policy's default)."""
    @property
    def rows(self) -> int:
        """Batch rows the request occupies."""
    @property
    def priority(self) -> int:
        """Priority level (0: the model's default)."""
    @property
    def client(self) -> int:
        """The client a session's tombstones count against (0: the shared key)."""

class Refusal(metaclass=_Pybind11Type):
    """Why submit() did not queue a request. NOT_FOUND: a session request whose session ended
    or expired (the message says which)."""

    @property
    def code(self) -> Code: ...
    @property
    def message(self) -> str: ...
    @property
    def backlog_full(self) -> bool:
        """Admission control refused a START, or no slot was free for a restore: the backlog
        held its bound (worth retrying later)."""
    @property
    def retry_after_ms(self) -> int:
        """A refusal that lasts this long (0: none said): a client's new sessions while its
        evicted tombstones fill its share of the filter."""
    @property
    def busy(self) -> bool:
        """checkpoint_sequence: the sequence has a request queued or running, or waits in the
        backlog (retry after its step)."""
    @property
    def released(self) -> bool:
        """A non-START request for a sequence checkpointed and released from here (the message
        is Triton's START error): it moved."""

class ExpiredSequence(metaclass=_Pybind11Type):
    """A sequence the idle reaper expired (stateful_model_policy DESCRIBE)."""

    @property
    def sequence_id(self) -> int | str: ...
    @property
    def age_s(self) -> float: ...
    @property
    def idle_s(self) -> float: ...
    @property
    def steps(self) -> int: ...
    @property
    def state_bytes(self) -> int: ...
    @property
    def instance(self) -> int: ...
    @property
    def slot(self) -> int: ...

class Duration(metaclass=_Pybind11Type):
    """How many, and how long in total (ns)."""

    @property
    def count(self) -> int: ...
    @property
    def ns(self) -> int: ...

class BatchStats(metaclass=_Pybind11Type):
    """Compute times of the batches of one size."""

    @property
    def compute_input(self) -> Duration: ...
    @property
    def compute_infer(self) -> Duration: ...
    @property
    def compute_output(self) -> Duration: ...

class Stats(metaclass=_Pybind11Type):
    """A model's statistics, as Triton counts them."""

    @property
    def inference_count(self) -> int: ...
    @property
    def execution_count(self) -> int: ...
    @property
    def last_inference_ms(self) -> int:
        """Wall-clock time of the last batch, ms since the epoch."""
    @property
    def success(self) -> Duration: ...
    @property
    def fail(self) -> Duration: ...
    @property
    def queue(self) -> Duration: ...
    @property
    def compute_input(self) -> Duration: ...
    @property
    def compute_infer(self) -> Duration: ...
    @property
    def compute_output(self) -> Duration: ...
    @property
    def batches(self) -> dict[int, BatchStats]:
        """Keyed by batch size."""
    @property
    def fail_rejected(self) -> int:
        """Failed by a queue or backlog timeout (Triton's reason REJECTED)."""
    @property
    def fail_backend(self) -> int:
        """Failed because the model failed their batch (BACKEND)."""
    @property
    def fail_canceled(self) -> int:
        """Cancelled (CANCELED): dropped from the queues because their client went away, their
        sequence was cancelled, or it was ended (sequence API, end_owned_sequence) while they waited."""
    @property
    def sequences_started(self) -> int:
        """START requests accepted, implied ones included."""
    @property
    def sequences_ended(self) -> int:
        """END requests accepted, plus sequences ended otherwise: through the sequence API, by
        cancellation, by end_owned_sequence."""
    @property
    def sequences_expired(self) -> int:
        """Sequences the idle reaper expired."""
    @property
    def sequences_released(self) -> int:
        """Sequences checkpointed and released from their slot (they moved: neither ended nor expired)."""
    @property
    def sequences_restored(self) -> int:
        """Sequences restored into a slot from a checkpoint."""
    @property
    def latency_counts(self) -> list[int]:
        """Successful requests per latency bucket (spec.latency_buckets_ms, then +Inf); the
        latency runs from arrival to the end of the request's batch."""
    @property
    def latency_sum_ms(self) -> float: ...
    @property
    def pending_requests(self) -> int:
        """Requests waiting: queued for a batch or backlogged (a snapshot)."""
    @property
    def sequence_slots(self) -> int:
        """Sequence slots of all instances (0 for other models)."""
    @property
    def sequences_active(self) -> int:
        """Slots held by a sequence."""
    @property
    def sequences_backlogged(self) -> int: ...
    @property
    def state_bytes(self) -> int:
        """Implicit state held by the sequences in slots."""
    @property
    def backlog_full(self) -> int:
        """STARTs refused because the backlog held max_backlog_sequences sequences."""
    @property
    def tombstones_evicted(self) -> int:
        """Session tombstones the count cap dropped before their time (their ids are then refused
        an implied START until the tombstone would have expired)."""
    @property
    def tombstones_evicted_client_cap(self) -> int:
        """... of them because their client held max_tombstones_per_client."""
    @property
    def tombstones_evicted_global_cap(self) -> int:
        """... of them at max_tombstones, from the client holding the most."""
    @property
    def session_starts_refused(self) -> int:
        """New sessions refused because their client had too many tombstones evicted lately."""

class SequenceInfo(metaclass=_Pybind11Type):
    """One live sequence, as the sequence API shows it."""

    @property
    def sequence_id(self) -> int | str: ...
    @property
    def backlogged(self) -> bool:
        """Waiting for a slot (instance and slot are -1)."""
    @property
    def session(self) -> bool:
        """Named by a session: START may be implied, and its end or expiry is remembered."""
    @property
    def instance(self) -> int: ...
    @property
    def slot(self) -> int: ...
    @property
    def age_s(self) -> float:
        """Since its START arrived."""
    @property
    def idle_s(self) -> float:
        """Since its last request arrived."""
    @property
    def steps(self) -> int:
        """Steps handed to the model."""
    @property
    def state_bytes(self) -> int: ...
    @property
    def queued(self) -> int:
        """Requests waiting in its slot's queue or in the backlog."""

def serialize_bytes(array: np.ndarray) -> bytes:
    """Serialize a BYTES tensor (object array) to the 4-byte-length-prefixed wire format."""

def deserialize_bytes(data: Any, shape: list[int] | tuple[int, ...]) -> np.ndarray:
    """Parse wire-format BYTES data into an object array of bytes."""

class Batch(metaclass=_Pybind11Type):
    """One batch formed by the scheduler; valid only during the runner call."""

    @property
    def size(self) -> int: ...
    @property
    def instance(self) -> int: ...
    @property
    def inline(self) -> bool:
        """True when this batch runs inline on the event loop (the thread that called Scheduler.run_ready_inline)."""
    @property
    def handles(self) -> list[int]:
        """The request handle of every row; 0 for padding rows."""
    @property
    def request_rows(self) -> list[int]:
        """The batch rows each entry of handles occupies (1 for padding)."""
    def inputs(self) -> dict[str, np.ndarray]: ...
    def ragged(self) -> dict[str, list[tuple[int, ...]]]:
        """Ragged inputs: each request's shape (batch dim included), in request order; the
        input's array holds their elements end to end."""
    def controls(self) -> dict[str, np.ndarray]: ...
    @property
    def slots(self) -> np.ndarray:
        """The sequence slot of every row (a copy; padding rows too, -1 past the formed rows).
        Device state tables index their per-slot rows with it."""
    def states(self) -> dict[str, np.ndarray]:
        """Implicit state keyed by state input name (read-only views)."""
    @property
    def start(self) -> np.ndarray: ...
    @property
    def end(self) -> np.ndarray: ...
    @property
    def ready(self) -> np.ndarray: ...
    @property
    def corrid(self) -> np.ndarray: ...
    def state(self, name: str) -> np.ndarray:
        """The state whose input name is `name`, as states() has it; an out-of-order Oldest batch
        gathers it on this first access."""
    def next_state(self, name: str) -> np.ndarray | None:
        """A writable buffer for the next value of state `name` (its input name), valid during the
        runner call; handed back through set_state it becomes the state without a copy where the
        layout allows. None for variable-shape and BYTES states."""
    def set_state(self, index: int, value: np.ndarray) -> None:
        """Store output state `index` for every real row of the batch."""
    def mark_executed(self) -> None: ...
    def finish(self, ok: bool) -> None:
        """Record this batch's statistics now, before its replies are sent."""

class InlineStats(metaclass=_Pybind11Type):
    """Inline execution of one model: its policy and counters."""

    @property
    def max_batch_us(self) -> float:
        """A batch costing more is not cheap (0: never inline)."""
    @property
    def promote_after(self) -> int: ...
    @property
    def active(self) -> bool:
        """Inline mode now: submit wakes no executor, run_ready_inline runs batches."""
    @property
    def inline_batches(self) -> int: ...
    @property
    def thread_batches(self) -> int: ...
    @property
    def promotions(self) -> int: ...
    @property
    def demotions(self) -> int: ...
    @property
    def slow_batches(self) -> int:
        """Batches over the bound in inline mode; a few in a window (or one far over) demote."""
    @property
    def last_batch_us(self) -> float:
        """What the latest batch cost (gather, runner, reply split)."""

#: One input of submit(): a C-contiguous array, or BYTES as (serialized data, shape).
_InputArg: TypeAlias = np.ndarray | tuple[bytes | np.ndarray, tuple[int, ...] | list[int]]

class Scheduler(metaclass=_Pybind11Type):
    """Scheduler and executor threads of one model."""

    def __init__(
        self,
        spec: ModelSpec,
        *,
        runner: Callable[[Batch], bool],
        on_fail: Callable[[list[int], Code, str], None],
        on_warning: Callable[[str], None],
        on_expire: Callable[[ExpiredSequence], None] | None = None,
    ) -> None: ...
    def start(self) -> None: ...
    def submit(self, header: RequestHeader, inputs: tuple[_InputArg, ...]) -> int | Refusal:
        """Queue a request: its header and one buffer per configured input. Returns its cancel() token
        (an int) when accepted, else the Refusal."""
    def requeue_front(self, header: RequestHeader, inputs: tuple[_InputArg, ...]) -> int | Refusal:
        """Queue an iterative sequence's rescheduled request as its sequence's next step, at the front of
        its slot queue. Returns its cancel() token (an int) when accepted, else the Refusal (the START
        error when the sequence is no longer live)."""
    def cancel(self, token: int, handle: int) -> bool:
        """Drop a queued request whose client is gone (a sequence's takes its sequence); it is answered
        CANCELLED. False when it is no longer queued or running."""
    def end_owned_sequence(self, corrid: int | str, owner: int = 0, reason: str = "") -> bool:
        """End a live sequence now, as idle expiry does, if its latest START had handle `owner` (0: any);
        its queued requests are answered CANCELLED with `reason`."""
    def slot_of(self, corrid: int | str) -> int:
        """The global slot of a live sequence, -1 while it is backlogged, -2 when it is unknown."""
    def configure_inline(self, max_batch_us: float, promote_after: int = 8) -> None:
        """Inline execution: once promote_after batches in a row each cost at most max_batch_us (0: never),
        run_ready_inline runs batches on its caller's thread and submit wakes no executor; a batch over
        the bound ends that at once."""
    def run_ready_inline(self) -> tuple[int, bool]:
        """Event loop, GIL held: run on this thread the batches idle instances can form now (inline mode
        only). Returns (how many ran, whether it stopped at its time budget with work left: call again
        soon)."""
    def inline_stats(self) -> InlineStats:
        """Inline execution's policy and counters."""
    def stop_accepting(self) -> None: ...
    def inflight_sequences(self) -> int: ...
    def pending_requests(self) -> int: ...
    def free_slots(self) -> int: ...
    def backlog_sequences(self) -> int: ...
    def sequences(self) -> list[tuple[str, int]]:
        """(sequence id, global slot) of every live sequence; slot -1 while backlogged."""
    def stats(self) -> Stats: ...
    def list_sequences(self, limit: int) -> tuple[int, list[SequenceInfo]]:
        """(how many live sequences, up to `limit` of them in no particular order)."""
    def find_sequence(self, corrid: int | str) -> SequenceInfo | None:
        """The live sequence `corrid`, or None."""
    def end_sequence(self, corrid: int | str) -> SequenceInfo | None:
        """End the live sequence `corrid` as idle expiry does; None when it is not live. Returns it as it was."""
    def session_gone(self, corrid: int | str) -> str | None:
        """Why a session that is not live would be refused, or None."""
    def checkpoint_sequence(
        self, corrid: int | str, *, release: bool
    ) -> tuple[int, bool, list[tuple[bytes, list[int]]]] | Refusal | None:
        """Copy the live sequence's implicit state out: (steps, session, [(bytes, shape) per state]); None
        when it is not live; a Refusal while it is busy (UNAVAILABLE, busy) or for a model without
        implicit state (UNSUPPORTED). release: it then leaves its slot without an END step (it moved)."""
    def restore_sequence(
        self,
        corrid: int | str,
        *,
        session: bool,
        steps: int,
        states: list[tuple[Any, list[int]]],
    ) -> Refusal | None:
        """Claim a free slot for the sequence, holding `states` ([(data, shape)] in spec order) and `steps`;
        its next non-START request continues from there. None, or the Refusal."""
    def close(self, force: bool = False, *, timeout_s: float | None = None) -> list[int]:
        """Stop the executors once queues drain (force: now); unanswered requests fail UNAVAILABLE.
        Waits up to timeout_s (None: without limit) for the executor threads; returns the indices
        of the instances whose executor was still running then (left behind, never joined)."""

class DLPackView(metaclass=_Pybind11Type):
    """A view of memory the engine owns, exported through DLPack without a copy. The owner
    object is kept alive by the view and by every export of it."""

    def __init__(
        self, address: int, shape: list[int], dtype: str, device_type: int, device_id: int, owner: object
    ) -> None: ...
    def __dlpack__(
        self,
        *,
        stream: object | None = None,
        max_version: object | None = None,
        dl_device: object | None = None,
        copy: object | None = None,
    ) -> object: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    @property
    def address(self) -> int: ...
    @property
    def shape(self) -> list[int]: ...
    @property
    def dtype(self) -> str: ...

#: A tensor in a slab block, as a ring record names it: (input or output index, region
#: offset, nbytes, shape).
_SlabTensor: TypeAlias = tuple[int, int, int, tuple[int, ...]]
_SlabTensorArg: TypeAlias = tuple[int, int, int, list[int] | tuple[int, ...]]

#: Reply flags (ShmRegion.pop_replies): an error; the last reply of its request; a refusal by
#: admission control (retry later); a refusal of a sequence checkpointed and released from here;
#: the shift of a refusal's retry time in ms.
REPLY_ERROR: int
REPLY_FINAL: int
REPLY_BACKLOG_FULL: int
REPLY_RELEASED: int
REPLY_RETRY_SHIFT: int

class ShmRegion(metaclass=_Pybind11Type):
    """The shared-memory transport between front-end workers and the engine: per worker a request
    ring, a reply ring and two slab pools, in one memfd; eventfds wake a sleeping side. The engine
    drains request rings in C++; these methods serve tests and the workers' event loops."""

    def __init__(
        self,
        *,
        workers: int,
        request_slots: int = 1024,
        request_record_bytes: int = 1008,
        reply_slots: int = 1024,
        reply_record_bytes: int = 1008,
        slab_classes: list[tuple[int, int]] = ...,
    ) -> None: ...
    @staticmethod
    def attach(fd: int, engine_eventfd: int, worker_eventfds: list[int]) -> ShmRegion:
        """Maps a region another process created, from its descriptors (inherited, or received with SCM_RIGHTS)."""
    @property
    def fd(self) -> int:
        """The region's memfd, to hand to a worker process."""
    @property
    def engine_eventfd(self) -> int: ...
    @property
    def worker_eventfds(self) -> list[int]: ...
    @property
    def workers(self) -> int: ...
    @property
    def size(self) -> int:
        """Bytes mapped."""
    def alloc(self, worker: int, to_engine: bool, nbytes: int) -> int:
        """A slab block of at least nbytes, by its offset; 0 when none is free."""
    def free(self, worker: int, to_engine: bool, offset: int) -> bool:
        """Returns a block; False when offset is not an allocated block of that pool."""
    def free_blocks(self, worker: int, to_engine: bool) -> int: ...
    def buffer(self, offset: int, nbytes: int) -> memoryview:
        """A writable view of region bytes (a slab block's)."""
    def write(self, offset: int, data: Any) -> None:
        """Copies a C-contiguous buffer (bytes, an array) into region bytes at offset (a slab
        block's); a buffer that is not C-contiguous is refused (BufferError; numpy's ValueError)."""
    def read(self, offset: int, nbytes: int) -> bytearray:
        """A copy of region bytes (a slab block's), as a bytearray."""
    def push_request(
        self,
        worker: int,
        target: int,
        header: RequestHeader,
        inputs: list[_SlabTensorArg] = ...,
        *,
        cancel: bool = False,
        client: int = 0,
        slow: bool = False,
        wake: bool = True,
    ) -> bool:
        """Worker side: publish a request; False when the ring is full (back-pressure). client: the key its
        session's tombstones count against (0: the header's); slow: the engine must take it through its
        Python path (RingFeeder.take_slow) even when the model's target is on the compiled path; wake:
        False leaves the engine asleep until wake_engine() (one wake-up for a burst of requests)."""
    def wake_engine(self) -> None:
        """Worker side: ring the engine if it sleeps (after requests pushed with wake=False)."""
    def pop_request(self, worker: int) -> tuple[int, bool, RequestHeader, list[_SlabTensor]] | None:
        """Engine side, for tests: the oldest request of one worker as (target, cancel, header, inputs), or None."""
    def push_reply(
        self,
        worker: int,
        handle: int,
        outputs: list[_SlabTensorArg] = ...,
        *,
        code: int = 0,
        error: str = "",
        final: bool = True,
    ) -> bool:
        """Engine side: publish a reply (an error when code or error is set); False when the ring is full."""
    def pop_reply(self, worker: int) -> tuple[int, bool, int, str | None, list[_SlabTensor]] | None:
        """Worker side: the oldest reply as (handle, final, code, error or None, outputs), or None."""
    def pop_replies(self, worker: int, max: int = 64) -> list[tuple[int, int, int, str | None, list[_SlabTensor]]]:
        """Worker side: up to max replies, oldest first, as (handle, flags, code, error or None, outputs).
        flags: REPLY_FINAL, REPLY_ERROR, and for refusals REPLY_BACKLOG_FULL, REPLY_RELEASED and in bits
        8..31 how long the refusal lasts in ms (flags >> REPLY_RETRY_SHIFT; 0: not said)."""
    def wait_requests(self, timeout: float) -> bool:
        """Engine side: sleep until a worker publishes a request (at once if one is there); False on timeout."""
    def wait_replies(self, worker: int, timeout: float) -> bool:
        """Worker side: sleep until the engine publishes a reply; False on timeout."""
    def arm_reply_wakeup(self, worker: int) -> bool:
        """Worker side, for an event loop watching worker_eventfds[worker]: True when replies are already
        there (drain them); False when the eventfd will become readable at the next reply (read it to reset
        it, drain, arm again)."""
    def reset_worker(self, worker: int) -> None:
        """Lay worker w's rings, doorbell and both slab pools out afresh (a dead worker's, before its
        replacement attaches). Only once nothing uses them: the worker process is gone, the engine holds
        none of its requests, and no thread drains its ring (with a RingFeeder, call its reset_worker)."""
    def pending(self, worker: int, requests: bool) -> int:
        """Records waiting on a worker's request (or reply) ring."""
    def counters(self) -> dict[str, int]: ...
    def stress_produce(
        self,
        worker: int,
        producer: int,
        count: int,
        *,
        threads: int = 1,
        tensor_bytes: int = 0,
        burst: int = 0,
        pause_us: int = 0,
    ) -> int:
        """Test/bench: `threads` producers (ids producer..) each push `count` checked records; the sum of their ids."""
    def stress_consume(
        self,
        producers: int,
        expected: int,
        *,
        sleep: bool = True,
        sleep_timeout: float = 1.0,
        limit: float = 60.0,
        spin_us: float = 0.0,
    ) -> dict[str, float]:
        """Test/bench: drain every worker's ring in C++ until `expected` records, checking each; with sleep,
        look for spin_us microseconds after the last record before sleeping on the doorbell."""

#: Set in the core handle of a request that came from a worker's ring (bits 48..62: the worker,
#: bits 0..47: the worker's own handle): the RingFeeder answers it, not Python.
RING_HANDLE_BIT: int

#: A record left to the engine's Python path: (worker, target, cancel, header, inputs, client).
_SlowRecord: TypeAlias = tuple[int, int, bool, RequestHeader, list[_SlabTensor], int]

class RingFeeder(metaclass=_Pybind11Type):
    """The engine's compiled path for the workers' request rings: a drain thread submits the
    records of fast targets to their Scheduler and answers them in C++; every other record
    waits for Python in take_slow()."""

    def __init__(self, region: ShmRegion, *, spin_us: float = 50.0) -> None: ...
    def add_target(
        self, target: int, scheduler: Scheduler | None, *, fast: bool, input_dims: list[list[int]] | None = None
    ) -> None:
        """Route target's records: fast, to `scheduler` in C++ (input_dims: each input's configured dims
        after the batch dim, -1 for any; None: any extent of the configured rank); else to take_slow()."""
    def remove_target(self, target: int) -> None:
        """Stop routing target (its records go to take_slow()); returns once the drain thread is out of
        its scheduler. Call it before the scheduler closes."""
    def take_slow(self) -> list[_SlowRecord]:
        """The records left to Python, oldest first, as (worker, target, cancel, header, inputs, client);
        their input blocks are Python's to free. Resets slow_fd."""
    @property
    def slow_fd(self) -> int:
        """An eventfd that becomes readable when records wait for take_slow() (once per burst)."""
    def reply_rows(
        self,
        handles: list[int],
        first_rows: list[int],
        rows: list[int],
        outputs: list[np.ndarray | None],
        *,
        batched: bool,
    ) -> None:
        """One batch's ring requests answered: handles[i] (a ring handle) owns rows first_rows[i].. of
        every output (config order; None: not produced). Copied into to-worker blocks; replies that
        find no room wait in order and are retried by the drain thread."""
    def reply_batch(self, batch: Batch, outputs: list[np.ndarray | None], *, batched: bool) -> None:
        """reply_rows for every ring request of `batch` (a core Batch, still valid), its rows read in C++."""
    def complete_batch(
        self,
        batch: Batch,
        produced: object,
        states: list[tuple[int, str]],
        outputs: list[tuple[str, np.dtype[Any]]],
        batched: bool,
        /,
    ) -> bool:
        """A ring-only batch after its execute: output states stored (states: (index, name) each),
        statistics recorded, replies sent (outputs: (name, dtype) per configured output), in one call.
        False, with nothing done, when an output is not a C-contiguous array of its dtype with the
        batch's rows, or `produced` is not a dict."""
    @staticmethod
    def ring_handles(batch: Batch) -> list[int]:
        """The ring handles among the batch's requests, in batch order."""
    def fail(self, handles: list[int], code: int, message: str) -> None:
        """Answer these ring handles with an error (others are ignored); their input blocks are freed."""
    def forget_worker(self, worker: int) -> None:
        """A dead worker: its waiting replies are dropped, and so are its replies from now on."""
    def reset_worker(self, worker: int) -> None:
        """ShmRegion.reset_worker out of the drain thread's way; the worker's replies flow again. Only
        once inflight(worker) is 0 and Python holds none of its records."""
    def inflight(self, worker: int) -> int:
        """The worker's fast requests submitted and not yet answered."""
    def queued_replies(self, worker: int) -> int:
        """Replies waiting for room on the worker's reply ring or in its blocks."""
    def refused(self, target: int) -> int:
        """The target's requests refused or malformed: failed requests, as the in-process path counts them."""
    def rejected(self, target: int) -> int:
        """Of the target's refused requests, those refused with UNAVAILABLE (a full queue or
        backlog, a scheduler stopping): REJECTED in the metrics, as the in-process path counts them."""
    def counters(self) -> dict[str, int]: ...
    def close(self) -> None:
        """Stop the drain thread (records stay on the rings)."""
