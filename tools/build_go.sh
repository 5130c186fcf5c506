#!/bin/sh
# Builds a Go program that talks to seqserve over gRPC, offline, from Debian's Go packages: no
# module download, GOPATH mode over /usr/share/gocode, with protoc, protoc-gen-go and
# protoc-gen-go-grpc generating the package seqserve/inference from protos/ into a temporary
# GOPATH. Used by the grpc-go interop tests (tests/interop/go/seqclient) and the bench's load
# generator (bench/golang/seqload).
#
#   tools/build_go.sh SOURCE_DIR OUT_DIR    # builds OUT_DIR/<name of SOURCE_DIR>, prints its path
#
# Exit status 3: the toolchain is missing (stderr says what and the apt-get line); 1: the build
# failed; 2: usage.
set -eu
if [ $# -ne 2 ] || [ ! -d "$1" ]; then
  echo "usage: tools/build_go.sh SOURCE_DIR OUT_DIR" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
source_dir=$(cd "$1" && pwd)
name=$(basename "$source_dir")
mkdir -p "$2"
out=$(cd "$2" && pwd)
gocode=/usr/share/gocode
missing=""
for program in go protoc protoc-gen-go protoc-gen-go-grpc; do
  command -v "$program" > /dev/null 2>&1 || missing="$missing $program"
done
for dir in "$gocode/src/google.golang.org/grpc" "$gocode/src/github.com/golang/protobuf"; do
  [ -e "$dir" ] || missing="$missing $dir"
done
if [ -n "$missing" ]; then
  echo "missing:$missing (apt-get install golang-go golang-google-grpc-dev golang-goprotobuf-dev" \
    "golang-google-protobuf-dev golang-golang-x-net-dev protoc-gen-go-grpc protobuf-compiler)" >&2
  exit 3
fi
gopath=$(mktemp -d "${TMPDIR:-/tmp}/seqserve-go-XXXXXX")
trap 'rm -rf "$gopath"' EXIT
generated="$gopath/src/seqserve/inference"
mkdir -p "$generated"
export GO111MODULE=off GOPATH="$gopath:$gocode" GOFLAGS=
# go keeps its build cache under the user's cache directory; without a home, a temporary one
[ -n "${GOCACHE:-}" ] || [ -n "${HOME:-}" ] || export GOCACHE="$gopath/cache"
cd "$root/protos"
protos=$(ls ./*.proto | sed 's|^\./||' | grep -v '^health\.proto$')
# the protos name no go_package: map each file to the one Go package
mapping=$(for p in $protos; do printf 'M%s=seqserve/inference,' "$p"; done)
mapping=${mapping%,}
protoc -I. "--go_out=$mapping,paths=source_relative:$generated" \
  "--go-grpc_out=$mapping,paths=source_relative:$generated" $protos
cp -R "$source_dir" "$gopath/src/$name"
cd "$gopath"
go build -o "$out/$name" "$name"
echo "$out/$name"
