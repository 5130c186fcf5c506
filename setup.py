"""Build of the compiled core, seqserve.engine._core (C++17, pybind11).

Environment switches:
  SEQSERVE_DEBUG=1                  assertions on, -O0 -g
  SEQSERVE_SANITIZE=address|thread  build with that sanitizer (run with LD_PRELOAD of its runtime)
"""

from __future__ import annotations

import os

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

debug = os.environ.get("SEQSERVE_DEBUG") == "1"
sanitize = os.environ.get("SEQSERVE_SANITIZE", "")
if sanitize not in ("", "address", "thread"):
    raise SystemExit(f"SEQSERVE_SANITIZE must be 'address' or 'thread', not {sanitize!r}")

compile_args = ["-O0", "-g"] if debug else ["-O3"]
link_args: list[str] = []
macros = [] if debug or sanitize else [("NDEBUG", "1")]
if sanitize:
    compile_args += [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer", "-g"]
    link_args += [f"-fsanitize={sanitize}"]

# The core (no Python) in csrc/, its binding in csrc/binding/; headers listed so that editing one
# rebuilds.
core = ["batch", "slot_state", "sequence_table", "scheduler", "inline_policy", "executor", "sequence_scheduler", "direct", "oldest", "dynamic", "stateless", "shm_region", "ring_feeder"]
binding = ["module", "bind_spec", "bind_request", "bind_batch", "bind_scheduler", "bind_checkpoint", "bind_dlpack", "bind_rings", "bind_feeder"]
headers = ["common", "spec", "request", "batch", "slot_state", "tombstones", "sequence_table", "inline_policy", "scheduler", "sequence_scheduler", "shm_ring", "shm_region", "ring_feeder", "binding/binding", "binding/ring_objects"]

ext = Pybind11Extension(
    "seqserve.engine._core",
    sources=[f"csrc/{n}.cc" for n in core] + [f"csrc/binding/{n}.cc" for n in binding],
    include_dirs=["csrc"],
    depends=[f"csrc/{n}.h" for n in headers],
    cxx_std=17,
    extra_compile_args=compile_args + ["-Wall", "-Wno-sign-compare"],
    extra_link_args=link_args + ["-pthread"],
    define_macros=macros,
)

setup(ext_modules=[ext], cmdclass={"build_ext": build_ext})
