#!/usr/bin/env bash
# Run the engine tests against a sanitizer build of the core, in a scratch copy of the tree so
# the normal in-place build is untouched.  Usage: tools/sanitize.sh address|thread [pytest args]
set -euo pipefail
kind=${1:?usage: tools/sanitize.sh address|thread [pytest args]}
shift
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$root" && git ls-files -co --exclude-standard | grep -v '\.so$' | tar -cf - -T -) | tar -xf - -C "$work"
cd "$work"
SEQSERVE_SANITIZE=$kind "$py" setup.py -q build_ext --inplace
# The scratch copy's src/ must come before the checkout's editable install on sys.path, or the
# tests would import the normal build.
export PYTHONPATH="$work/src${PYTHONPATH:+:$PYTHONPATH}"
case $kind in
  address)
    # libstdc++ too: python does not link it, and ASan's __cxa_throw interceptor needs it
    # loaded from the start or the first C++ exception aborts.
    export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)"
    export ASAN_OPTIONS=detect_leaks=0  # CPython's own allocations are not ours to report
    runner=() ;;
  thread)
    export LD_PRELOAD=$(gcc -print-file-name=libtsan.so)
    export TSAN_OPTIONS="suppressions=$root/tools/tsan.supp report_signal_unsafe=0 halt_on_error=1"
    runner=(setarch -R) ;;  # TSan needs a fixed address-space layout
  *) echo "unknown sanitizer: $kind" >&2; exit 2 ;;
esac
"${runner[@]}" "$py" -c 'import seqserve.engine._core as c; print("testing", c.__file__)'
"${runner[@]}" "$py" -m pytest -q -p no:cacheprovider tests/engine "$@"
