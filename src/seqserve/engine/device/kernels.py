"""The one kernel of the device state path: copy rows of a [rows, row_bytes] buffer by index
lists. Gathering a batch's state rows, scattering its next state back into the store and
resetting START rows to the initial value are each one launch of it per batch on the
instance's stream: never a copy per row (64 rows as 64 copies cost 343 us on an H200, one
gather kernel 15 us; ../shared/reference/gpu-device-facts.txt).

Compiled at run time with NVRTC for the device at hand (no CUDA toolkit needed where seqserve
is built); the source is compiled by nvcc in the CPU tests too, so a syntax error cannot wait
for a GPU machine to be found.
"""

from __future__ import annotations

KERNEL_NAME = "seqserve_copy_rows"

#: threads per block; a block copies one row pair, 16 bytes per thread per step when aligned
THREADS = 256

SOURCE = r"""
extern "C" __global__ void seqserve_copy_rows(char* dst, const int* dst_rows, const char* src,
                                              const int* src_rows, int pairs, long long row_bytes) {
  // Grid-stride over the row pairs (gridDim.y is bounded), block-stride over a row's bytes.
  for (int pair = blockIdx.y; pair < pairs; pair += gridDim.y) {
    char* d = dst + (long long)dst_rows[pair] * row_bytes;
    const char* s = src + (long long)src_rows[pair] * row_bytes;
    const unsigned long long misaligned =
        ((unsigned long long)d | (unsigned long long)s | (unsigned long long)row_bytes) & 15ull;
    if (misaligned == 0) {
      const long long n = row_bytes >> 4;
      uint4* d4 = reinterpret_cast<uint4*>(d);
      const uint4* s4 = reinterpret_cast<const uint4*>(s);
      for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
           i += (long long)gridDim.x * blockDim.x)
        d4[i] = s4[i];
    } else {
      for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < row_bytes;
           i += (long long)gridDim.x * blockDim.x)
        d[i] = s[i];
    }
  }
}
"""


def launch_grid(pairs: int, row_bytes: int) -> tuple[int, int]:
    """(blocks along a row, blocks along the pairs) for one launch: enough blocks to cover a row
    in 16-byte steps, at most 64 per row, and at most 65,535 rows of pairs (the grid-stride
    loop covers the rest)."""
    per_row = max(1, min(64, -(-max(1, row_bytes // 16) // THREADS)))
    return per_row, max(1, min(pairs, 65535))
