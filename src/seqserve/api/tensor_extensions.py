"""What one infer request asks of the tensor extensions, on either front-end: inputs read from
and outputs written into shared-memory regions (``shared_memory``), and outputs returned as
their top classes (``classification``). The codecs collect it (``TensorExtensions``) while they
decode; the front-end fills the inputs before the request is queued (``prepare``) and places
the outputs once it is answered (``finish``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from seqserve.api import classification
from seqserve.api.kserve import bad, clip, wire_datatype
from seqserve.api.shared_memory import SharedMemoryRegistry, TensorPlace
from seqserve.engine import InferRequest, InferResult, Server, tensors


@dataclass(frozen=True, slots=True)
class PlacedOutput:
    """An output written into a region: what its reply entry says instead of its data."""

    datatype: str
    shape: list[int]
    place: TensorPlace
    byte_size: int  # the bytes written


@dataclass(slots=True)
class TensorExtensions:
    """The shared-memory inputs and outputs and the class counts of one request."""

    #: input name -> (datatype, shape, where its bytes are)
    inputs: dict[str, tuple[str, list[int], TensorPlace]] = field(default_factory=dict)
    #: output name -> where its bytes go
    outputs: dict[str, TensorPlace] = field(default_factory=dict)
    #: output name -> class count (> 0)
    classes: dict[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.inputs or self.outputs or self.classes)

    def prepare(self, server: Server, request: InferRequest, registry: SharedMemoryRegistry) -> None:
        """Before the request is queued: its shared-memory inputs copied in, its class counts
        checked against the model's outputs (a refusal here runs nothing)."""
        registry.check_input_bytes([place for _, _, place in self.inputs.values()])
        for name, (datatype, shape, place) in self.inputs.items():
            request.inputs[name] = registry.read_input(name, datatype, shape, place)
        if self.classes:
            classification.check_classifiable(server, request.model, request.version, self.classes)
        for place in self.outputs.values():
            registry.region(place.region)  # a region that is not registered: refused now
        if self.outputs:
            self._check_output_room(server, request)

    def _check_output_room(self, server: Server, request: InferRequest) -> None:
        """Refuse, before the request runs, a shared-memory output too small for what the config
        says the output will be (fixed dims and a fixed-size datatype; the batch from the first
        input). Other outputs are checked when written."""
        cfg = server.model_config(request.model, request.version)
        batch = 1
        if cfg.max_batch_size > 0:
            first = next(iter(request.inputs.values()), None)
            if first is None or not first.ndim:
                return
            batch = int(first.shape[0])
        configured = {o.name: o for o in cfg.output}
        for name, place in self.outputs.items():
            out = configured.get(name)
            datatype = None if out is None else tensors.BY_CONFIG.get(out.data_type)
            if out is None or datatype is None or not datatype.itemsize or name in self.classes:
                continue
            if any(d < 0 for d in out.dims):
                continue
            need = batch * datatype.itemsize * int(np.prod(list(out.dims), dtype=np.int64))
            if place.byte_size < need:
                raise bad(
                    f"shared memory size specified with the request for output '{clip(name)}' "
                    f"({place.byte_size} bytes) should be at least {need} bytes to hold the results"
                )

    def finish(self, server: Server, result: InferResult, registry: SharedMemoryRegistry) -> dict[str, PlacedOutput]:
        """Once answered: outputs classified, then the shared-memory outputs written into their
        regions and taken out of ``result`` (their reply entries carry no data)."""
        if self.classes:
            classification.classify(server, result, self.classes)
        placed: dict[str, PlacedOutput] = {}
        for name, place in self.outputs.items():
            arr = result.outputs.pop(name, None)
            if arr is None:
                continue
            size = registry.write_output(name, arr, place)
            placed[name] = PlacedOutput(wire_datatype(arr), list(arr.shape), place, size)
        return placed
