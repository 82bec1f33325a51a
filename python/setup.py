"""Builds the flatkv module through the project's CMake (python/README.md, Install).

  pip install --no-build-isolation --no-index ./python

configures the repository in a build directory of its own (the library and the module
only: no tests, tools or benchmarks) and builds the target flatkv_python. With
FLATKV_CMAKE_BUILD_DIR naming an already configured tree (absolute, or relative to the
repository: e.g. build/release), it builds
that tree's flatkv_python target instead (a no-op when it is up to date) and packages its
module, so CI installs what it just tested without compiling the library again.
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent  # the repository: CMakeLists.txt builds the module as flatkv_python


def version():
    m = re.search(r"project\(flatkv VERSION ([0-9.]+)", (ROOT / "CMakeLists.txt").read_text())
    if not m:
        sys.exit(f"setup.py: no 'project(flatkv VERSION ...)' in {ROOT / 'CMakeLists.txt'}")
    return m.group(1)


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        tree = os.environ.get("FLATKV_CMAKE_BUILD_DIR")
        if tree:
            tree = (ROOT / tree).resolve()  # pip runs this in python/: relative means to the repository
            if not (tree / "CMakeCache.txt").exists():
                sys.exit(f"setup.py: FLATKV_CMAKE_BUILD_DIR={tree} is not a configured CMake build tree")
        else:
            tree = pathlib.Path(self.build_temp).resolve() / "cmake"
            tree.mkdir(parents=True, exist_ok=True)
            cfg = ["cmake", "-S", str(ROOT), "-B", str(tree), "-DCMAKE_BUILD_TYPE=Release",
                   f"-DPython_EXECUTABLE={sys.executable}", "-DFLATKV_BUILD_PYTHON=ON",
                   "-DFLATKV_BUILD_TESTS=OFF", "-DFLATKV_BUILD_TOOLS=OFF", "-DFLATKV_BUILD_BENCH=OFF"]
            if shutil.which("ninja"):
                cfg += ["-G", "Ninja"]
            subprocess.run(cfg, check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        subprocess.run(["cmake", "--build", str(tree), "--target", "flatkv_python", "-j", jobs], check=True)
        built = sorted((tree / "python" / "flatkv").glob("_flatkv*.so"))
        if not built:
            sys.exit(f"setup.py: {tree}/python/flatkv has no _flatkv*.so: is pybind11-dev installed? "
                     "(CMake says so in its output: 'the Python module is not built')")
        dest = pathlib.Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[-1], dest)


setup(
    version=version(),
    # The package flatkv: the C extension flatkv._flatkv, and flatkv.vllm, flatkv's vLLM KV
    # connector (kv_connector_module_path "flatkv.vllm"; docs/vllm.md), which imports vllm only
    # when imported, so installing it costs nothing where vLLM is absent.
    packages=["flatkv"],
    ext_modules=[Extension("flatkv._flatkv", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
