"""Process isolation for Python models: each instance of an isolated model runs in its own
child process, so a model that crashes, leaks or hangs takes down only itself.

- ``slab``: shared memory (anonymous, grown by replacement) that tensors cross through;
- ``channel``: framed messages over pipes, descriptors over a Unix socket beside them;
- ``protocol``: the messages' vocabulary (kinds, codes, item tags), and tensors in and out of
  slabs (no pickling);
- ``batches``: a batch written into a slab for the child and read back there;
- ``results``: a batch's results and responder messages written by the child and read back;
- ``proxy``: the server side, ``IsolatedInstance`` (a ``BackendInstance``) and its supervision;
- ``responses``: late responses (through responders) relayed from a child to the engine;
- ``child_process``: starting a child and watching it (``ChildProcess``);
- ``child``: the child's main loop (``python -m seqserve.engine.isolation.child``).

Whether a model runs isolated is a model parameter, ``isolation`` (``engine/model/execution.py``).

The scheduler, the sequences' slots and their implicit state stay in the server's core; a
child only ever sees one batch at a time. See docs/isolation.md.
"""

from __future__ import annotations

from seqserve.engine.isolation.proxy import IsolatedBackend, IsolatedInstance

__all__ = ["IsolatedBackend", "IsolatedInstance"]
