// The real SmolLM2-135M-Instruct file for the tests that run on it (flatkv_smollm2_tests: the
// Release build only, ctest label smollm2). One load per test binary, shared by every suite.
//
// Where: $FLATKV_SMOLLM2 if set, else <source>/build/models/SmolLM2-135M-Instruct.Q4_1.gguf
// (`scripts/install-deps.sh models` puts it there). Missing, a test skips naming the file and
// that command; with CI=true it fails instead. A file that does not load always fails.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "model/model.h"

namespace flatkv::testing {

inline std::string SmolLm2Path() {
  const char* env = std::getenv("FLATKV_SMOLLM2");
  return env != nullptr && *env != '\0' ? std::string(env)
                                         : std::string(FLATKV_SOURCE_DIR) + "/build/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

inline bool InCi() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::string(ci) == "true";
}

struct LoadedSmolLm2 {
  std::unique_ptr<model::Model> model;  // null when missing or unloadable
  std::string error;
  bool missing = false;
};

// Loaded on first use; never freed (tests share it until exit).
inline const LoadedSmolLm2& SmolLm2() {
  static const LoadedSmolLm2* loaded = [] {
    auto* l = new LoadedSmolLm2;
    const std::string path = SmolLm2Path();
    if (!std::filesystem::exists(path)) {
      l->missing = true;
      l->error = "SmolLM2 model not found: " + path + " (scripts/install-deps.sh models installs it)";
      return l;
    }
    auto m = model::LoadGguf(path);
    if (!m.ok()) {
      l->error = path + ": " + m.status().ToString();
      return l;
    }
    l->model = std::make_unique<model::Model>(std::move(m).value());
    return l;
  }();
  return *loaded;
}

}  // namespace flatkv::testing

// Declares `const model::Model* NAME` in a test body or SetUp: skips when the file is missing
// (fails under CI=true), fails when it does not load.
#define FLATKV_REQUIRE_SMOLLM2(NAME)                                                            \
  const ::flatkv::testing::LoadedSmolLm2& NAME##_loaded_ = ::flatkv::testing::SmolLm2();        \
  if (NAME##_loaded_.model == nullptr) {                                                        \
    if (!NAME##_loaded_.missing || ::flatkv::testing::InCi()) FAIL() << NAME##_loaded_.error;   \
    GTEST_SKIP() << NAME##_loaded_.error;                                                       \
  }                                                                                             \
  const ::flatkv::model::Model* NAME = NAME##_loaded_.model.get()
