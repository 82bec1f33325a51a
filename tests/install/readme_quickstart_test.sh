#!/usr/bin/env bash
# The README's C++ quick start ("Using the store") is examples/quickstart.cc, which
# install_test.sh builds against an installed flatkv and example_quickstart runs: the two
# texts must stay identical.
# Usage: readme_quickstart_test.sh SOURCE_DIR
set -euo pipefail
src=$1
readme=$(awk '/^## Using the store/{s=1} s&&/^```cpp$/{c=1;next} c&&/^```$/{exit} c' "$src/README.md")
if ! diff -u <(printf '%s\n' "$readme") "$src/examples/quickstart.cc"; then
  echo "FAIL: README.md's C++ quick start differs from examples/quickstart.cc (above: - README, + file)"
  exit 1
fi
echo "README.md's quick start is examples/quickstart.cc ($(wc -l <"$src/examples/quickstart.cc") lines)"
