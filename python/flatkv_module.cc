// `flatkv._flatkv`, the C extension of the `flatkv` package (python/flatkv/__init__.py re-exports
// it): a thin pybind11 layer over the C API (include/flatkv/flatkv.h), never the C++ internals.
//
// Bytes move through the buffer protocol: put() reads any C-contiguous
// buffer (bytes, numpy arrays), restore() writes into a caller's writable
// C-contiguous buffer in place. Every call that may wait on I/O releases the
// GIL. C errors become flatkv.Error with the C status message and a `code`
// attribute ("InvalidArgument", "NotFound", ...).
//
// The parts, by role (flatkv_py.h): py_convert.cc (errors, arguments),
// py_options.cc (Store()'s keywords), py_keys.cc (Namespace, Rope),
// py_store.cc (Store, Restore).
#include <pybind11/pybind11.h>

#include "flatkv/flatkv.h"
#include "flatkv_py.h"

namespace py = pybind11;

PYBIND11_MODULE(_flatkv, m) {
  m.doc() = "flatkv: a KV-cache store for LLM serving (DRAM + SSD, embedded or a daemon client)";
  flatkv::python::AddErrorType(m);
  m.attr("DEFAULT_HASH_SEED") = py::int_(FLATKV_DEFAULT_HASH_SEED);
  flatkv::python::BindKeys(m);
  flatkv::python::BindStore(m);
}
