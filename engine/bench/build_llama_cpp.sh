#!/usr/bin/env bash
# Build llama.cpp's llama-server and llama-bench natively for this CPU: the fair llama.cpp baseline.
#
# Why not the llama-cpp-python wheel: pip's build of it decoded SmolLM2 Q4_1 at 4.7 tokens/s on a
# 2-core AVX2 EPYC (256-token cold prompt + 64, 2 threads), far below llama.cpp built for the CPU it
# runs on. The sources are the ones llama-cpp-python's sdist carries (vendor/llama.cpp), at the
# version pinned below, so the baseline is the llama.cpp our dev extra also links.
#
# The build is cached per CPU (GGML_NATIVE compiles for the host's instruction set: a binary built on
# an AMX Xeon dies with SIGILL on an AVX2 laptop), under $MEMOSIGHT_CACHE, else
# $XDG_CACHE_HOME/memosight, else ~/.cache/memosight. ~20 min on 2 cores the first time; then instant.
#
# Usage: build_llama_cpp.sh [--check]  prints the folder holding llama-server and llama-bench;
#        --check: only if it is built already (exit 1 otherwise, building nothing)
set -euo pipefail

VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

cache="${MEMOSIGHT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/memosight}"
# the CPU's model name and instruction-set flags: what -march=native compiled for
cpu_key=$( (grep -m1 '^model name' /proc/cpuinfo; grep -m1 '^flags' /proc/cpuinfo) 2>/dev/null | sha256sum | cut -c1-12)
root="$cache/llama.cpp-$VERSION-$cpu_key"
bin="$root/build/bin"

if [[ -x "$bin/llama-server" && -x "$bin/llama-bench" ]]; then
    echo "$bin"
    exit 0
fi
if [[ "${1:-}" == "--check" ]]; then
    echo "llama.cpp $VERSION is not built for this CPU yet: run $0" >&2
    exit 1
fi

mkdir -p "$root"
sdist="$root/llama_cpp_python-$VERSION.tar.gz"
if [[ ! -f "$sdist" ]]; then
    echo "downloading llama-cpp-python $VERSION's sources (pip download)" >&2
    python3 -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$root" >&2
fi
echo "$SHA256  $sdist" | sha256sum --check --status || {
    echo "error: $sdist does not have the pinned sha256 $SHA256; delete it and run again" >&2
    exit 1
}
if [[ ! -f "$root/src/CMakeLists.txt" ]]; then
    rm -rf "$root/src" && mkdir -p "$root/src"
    tar -xzf "$sdist" -C "$root/src" --strip-components=3 "llama_cpp_python-$VERSION/vendor/llama.cpp"
fi

echo "building llama-server and llama-bench for this CPU in $root/build (about 20 min on 2 cores)" >&2
cmake -S "$root/src" -B "$root/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >&2
cmake --build "$root/build" --config Release -j "$(nproc)" --target llama-server llama-bench >&2
echo "$bin"
