"""Generated protobuf modules (``make protos`` regenerates them from protos/)."""

from __future__ import annotations

from google.protobuf import descriptor_pool

# Our messages live in their own pool, not protobuf's default one: they share
# Triton's file and message names (package ``inference``), so registering them
# in the default pool would clash with tritonclient's generated modules when
# both are imported into one process.
POOL = descriptor_pool.DescriptorPool()
