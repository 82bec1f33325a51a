// The standard headers nearly every source includes, precompiled once per library and
// executable (flatkv_precompile in cmake/FlatkvComponent.cmake; option FLATKV_PCH). Parsing
// them took a third of a typical source's compile, and CI's builds are mostly compiling.
// Sources still include what they use: a build with -DFLATKV_PCH=OFF checks that.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <variant>
#include <vector>
