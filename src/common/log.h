// Minimal leveled logging to stderr. Thread-safe (one write per line).
#pragma once

#include <string_view>

namespace flatkv {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Messages below this level are dropped. Default kWarning; FLATKV_LOG=debug|info|warning|error.
void SetLogLevel(LogLevel level);
void Log(LogLevel level, std::string_view message);

inline void LogWarning(std::string_view m) { Log(LogLevel::kWarning, m); }
inline void LogInfo(std::string_view m) { Log(LogLevel::kInfo, m); }

}  // namespace flatkv
