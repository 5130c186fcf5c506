"""Process isolation for Python models: each instance of an isolated model runs in its own
child process, so a model that crashes, leaks or hangs takes down only itself.

- ``settings``: the ``isolation`` and ``execute_timeout_ms`` model parameters;
- ``slab``: shared memory (anonymous, grown by replacement) that tensors cross through;
- ``channel``: framed messages with descriptors over a Unix socketpair;
- ``protocol``: the messages, and tensors in and out of slabs (no pickling);
- ``proxy``: the server side, ``IsolatedInstance`` (a ``BackendInstance``) and its supervision;
- ``child``: the child's main loop (``python -m seqserve.engine.isolation.child``).

The scheduler, the sequences' slots and their implicit state stay in the server's core; a
child only ever sees one batch at a time. See docs/isolation.md.
"""

from __future__ import annotations

from seqserve.engine.isolation.proxy import IsolatedBackend, IsolatedInstance
from seqserve.engine.isolation.settings import EXECUTE_TIMEOUT_MS, ISOLATION, ExecutionSettings, execution_settings

__all__ = [
    "EXECUTE_TIMEOUT_MS",
    "ISOLATION",
    "ExecutionSettings",
    "IsolatedBackend",
    "IsolatedInstance",
    "execution_settings",
]
