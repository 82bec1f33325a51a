#!/usr/bin/env bash
# flatkv installed as a library, used the way C++ users take one: `cmake --install` of this build's
# `library` install component (the component libraries, include/flatkv/, the CMake package and
# flatkv.pc; the tool and its files are the rest of `cmake --install`) into a temporary prefix; a separate project (tests/install/CMakeLists.txt) finds it with
# find_package(flatkv), builds the README's C++ quick start (examples/quickstart.cc) against
# flatkv::core and runs it; the same file built with flatkv.pc's flags (pkg-config) runs too.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR CXX_COMPILER
set -euo pipefail
build=$1 src=$2 cxx=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

cmake --install "$build" --prefix "$prefix" --component library >/dev/null
for f in include/flatkv/store.h include/flatkv/flatkv.h lib*/cmake/flatkv/flatkvConfig.cmake \
         lib*/cmake/flatkv/flatkvConfigVersion.cmake lib*/pkgconfig/flatkv.pc lib*/libflatkv_core.a; do
  compgen -G "$prefix/$f" >/dev/null || { echo "FAIL: not installed: $f"; exit 1; }
done

echo "--- find_package(flatkv) in a separate project"
cmake -S "$src/tests/install" -B "$tmp/user" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_PREFIX_PATH="$prefix" -DQUICKSTART_SOURCE="$src/examples/quickstart.cc" >"$tmp/configure.log" ||
  { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/user" -j 2
"$tmp/user/quickstart" "$tmp/store-cmake"

echo "--- pkg-config flatkv"
export PKG_CONFIG_PATH=$(dirname "$(compgen -G "$prefix/lib*/pkgconfig/flatkv.pc")")
echo "flags: $(pkg-config --cflags --libs flatkv)"
"$cxx" -std=c++20 -O1 -o "$tmp/quickstart-pc" "$src/examples/quickstart.cc" $(pkg-config --cflags --libs flatkv)
"$tmp/quickstart-pc" "$tmp/store-pc"
