"""Verbose request lines, as Triton's --log-verbose gives them: at level 1 one line per request
a batch answered (model, version, request id, sequence id, START/END, batch row, batch size,
status, time), at level 2 one line per batch (instance, size, the sequences in its rows). Off
unless the ``seqserve.requests`` logger is verbose: the executor then asks one cached
``isEnabledFor`` per batch."""

from __future__ import annotations

import logging
import time

import numpy as np

from seqserve.engine.model.delivery import Pending

log = logging.getLogger("seqserve.requests")

#: Triton's verbose levels as logging levels (seqserve.api.logs maps --log-verbose N to 11 - N)
VERBOSE_1 = logging.DEBUG
VERBOSE_2 = logging.DEBUG - 1


class RequestLog:
    """One model version's verbose request lines (executor threads or the loop)."""

    def __init__(self, name: str, version: str, *, is_sequence: bool, strategy: str) -> None:
        self.name = name
        self.version = version
        self.is_sequence = is_sequence
        # the Direct strategy gives each sequence the batch row of its slot
        self.row_word = "slot" if strategy == "direct" else "row"

    @staticmethod
    def enabled() -> bool:
        return log.isEnabledFor(VERBOSE_1)

    def batch(
        self, instance: int, size: int, recs: list[Pending | None], corrid: np.ndarray, ok: bool, started: float
    ) -> None:
        """A batch has been answered (``ok``: by the model; else it failed), ``started`` at
        that time.perf_counter()."""
        elapsed_us = (time.perf_counter() - started) * 1e6
        status = "OK" if ok else "FAILED"
        if log.isEnabledFor(VERBOSE_2):
            ids = [str(corrid[row]) if rec is not None else "-" for row, rec in enumerate(recs)]
            log.log(
                VERBOSE_2,
                "model '%s' version %s instance %d: batch of %d (%d requests)%s: %s in %.0f us",
                self.name,
                self.version,
                instance,
                size,
                sum(r is not None for r in recs),
                f", sequences by {self.row_word}: {' '.join(ids)}" if self.is_sequence else "",
                status,
                elapsed_us,
            )
        for row, rec in enumerate(recs):
            if rec is None:
                continue
            request = rec.checked.request
            flags = [f for f, on in (("START", request.sequence_start), ("END", request.sequence_end)) if on]
            sequence = (
                f" sequence {rec.checked.corrid}{' ' + '|'.join(flags) if flags else ''} {self.row_word} {row}"
                if self.is_sequence
                else ""
            )
            log.log(
                VERBOSE_1,
                "[request id: %s] model '%s' version %s%s batch size %d: %s in %.0f us",
                request.id or "<id_unknown>",
                self.name,
                self.version,
                sequence,
                size,
                status,
                elapsed_us,
                extra={
                    "fields": {
                        "model": self.name,
                        "version": self.version,
                        "request_id": request.id,
                        "sequence_id": rec.checked.corrid if self.is_sequence else None,
                        "start": request.sequence_start,
                        "end": request.sequence_end,
                        self.row_word: row,
                        "batch_size": size,
                        "status": status,
                        "time_us": round(elapsed_us),
                    }
                },
            )
