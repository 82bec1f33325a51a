#include "common/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace flatkv {
namespace {

LogLevel LevelFromEnv() {
  const char* v = std::getenv("FLATKV_LOG");
  if (v == nullptr) return LogLevel::kWarning;
  std::string s(v);
  if (s == "debug") return LogLevel::kDebug;
  if (s == "info") return LogLevel::kInfo;
  if (s == "error") return LogLevel::kError;
  return LogLevel::kWarning;
}

std::atomic<int>& Level() {
  static std::atomic<int> level{static_cast<int>(LevelFromEnv())};
  return level;
}

}  // namespace

void SetLogLevel(LogLevel level) { Level().store(static_cast<int>(level)); }

void Log(LogLevel level, std::string_view message) {
  if (static_cast<int>(level) < Level().load(std::memory_order_relaxed)) return;
  static const char* kNames[] = {"debug", "info", "warning", "error"};
  std::string line = "flatkv " + std::string(kNames[static_cast<int>(level)]) + ": " + std::string(message) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace flatkv
