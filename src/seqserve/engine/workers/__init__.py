"""The engine's side of ``seqserve serve --workers N``: the records front-end worker processes
send through the shared-memory rings, and the slow path that runs them on the ``Server``."""
