// Trace reading: files and gzip, format detection, the JSONL field readers
// the Mooncake and generic parsers share, and merging. The format parsers
// live in trace_claude_code.cc, trace_mooncake.cc and trace_generic.cc.
#include "replay/trace.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>

#include "replay/trace_internal.h"
#include "io/posix_file.h"

namespace flatkv::replay {
namespace internal {

using json = nlohmann::json;

LineCol LocateOffset(std::string_view text, uint64_t offset) {
  LineCol lc;
  const size_t end = static_cast<size_t>(std::min<uint64_t>(offset, text.size()));
  size_t line_start = 0;
  for (size_t i = 0; i < end; ++i) {
    if (text[i] == '\n') {
      ++lc.line;
      line_start = i + 1;
    }
  }
  lc.column = end - line_start + 1;
  return lc;
}

std::string JsonErrorDescription(std::string_view what) {
  // "[json.exception.parse_error.101] parse error at line 1, column 2: syntax error ..."
  size_t colon = what.find(": ");
  if (what.substr(0, 1) == "[" && colon != std::string_view::npos) what.remove_prefix(colon + 2);
  return std::string(what);
}

void SortByArrival(std::vector<Request>* requests) {
  std::stable_sort(requests->begin(), requests->end(),
                   [](const Request& a, const Request& b) { return a.arrival_s < b.arrival_s; });
}

Result<std::string> Gunzip(std::string_view bytes, const std::string& name, uint64_t limit) {
  z_stream zs{};
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) return Status::IoError(name + ": zlib inflateInit2 failed");
  std::string out;
  out.resize(static_cast<size_t>(std::min<uint64_t>(std::max<uint64_t>(bytes.size() * 8, 1 << 16), limit + 1)));
  size_t in_pos = 0;
  size_t out_pos = 0;
  Status error;
  for (;;) {
    if (out_pos == out.size()) {
      if (out.size() > limit) {
        error = Status::InvalidArgument(name + ": decompresses to more than " + std::to_string(limit) +
                                        " bytes; refusing it");
        break;
      }
      out.resize(static_cast<size_t>(std::min<uint64_t>(uint64_t{out.size()} * 2, limit + 1)));
    }
    const size_t in_chunk = std::min<size_t>(bytes.size() - in_pos, std::numeric_limits<uInt>::max());
    const size_t out_chunk = std::min<size_t>(out.size() - out_pos, std::numeric_limits<uInt>::max());
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data() + in_pos));
    zs.avail_in = static_cast<uInt>(in_chunk);
    zs.next_out = reinterpret_cast<Bytef*>(out.data() + out_pos);
    zs.avail_out = static_cast<uInt>(out_chunk);
    int rc = inflate(&zs, Z_NO_FLUSH);
    in_pos += in_chunk - zs.avail_in;
    out_pos += out_chunk - zs.avail_out;
    if (rc == Z_STREAM_END) {
      if (in_pos == bytes.size()) break;
      // Another gzip member follows (as `cat a.gz b.gz` makes), or garbage.
      if (bytes.size() - in_pos >= 2 && static_cast<unsigned char>(bytes[in_pos]) == 0x1f &&
          static_cast<unsigned char>(bytes[in_pos + 1]) == 0x8b) {
        inflateReset(&zs);
        continue;
      }
      error = Status::InvalidArgument(name + ": " + std::to_string(bytes.size() - in_pos) +
                                      " trailing bytes after the gzip stream at byte " + std::to_string(in_pos));
      break;
    }
    if (rc == Z_OK || rc == Z_BUF_ERROR) {
      if (out_pos == out.size()) continue;  // output full: grow and go on
      if (in_pos == bytes.size()) {
        error = Status::InvalidArgument(name + ": truncated gzip stream (input ends at byte " +
                                        std::to_string(bytes.size()) + " before the end of the data)");
        break;
      }
      if (rc == Z_OK) continue;
    }
    if (rc != Z_OK) {
      error = Status::InvalidArgument(name + ": corrupt gzip data near compressed byte " + std::to_string(in_pos) +
                                      ": " + (zs.msg != nullptr ? zs.msg : "inflate error " + std::to_string(rc)));
      break;
    }
  }
  inflateEnd(&zs);
  if (error.ok() && out_pos > limit) {
    error =
        Status::InvalidArgument(name + ": decompresses to more than " + std::to_string(limit) + " bytes; refusing it");
  }
  if (!error.ok()) return error;
  out.resize(out_pos);
  return out;
}

Status ParseJsonObject(std::string_view line, const std::string& where, json* out) {
  try {
    *out = json::parse(line.begin(), line.end());
  } catch (const json::parse_error& e) {
    const uint64_t pos = e.byte > 0 ? e.byte - 1 : 0;
    return Status::InvalidArgument(where + ":" + std::to_string(pos + 1) +
                                   ": invalid JSON: " + JsonErrorDescription(e.what()));
  } catch (const std::exception& e) {
    return Status::InvalidArgument(where + ": invalid JSON: " + e.what());
  }
  if (!out->is_object()) return Status::InvalidArgument(where + ": expected a JSON object, got " + out->type_name());
  return Status::Ok();
}

namespace {

std::string Describe(const json& v) {
  std::string s = v.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return std::string(v.type_name()) + " " + s;
}

}  // namespace

Status GetUint(const json& obj, const char* key, uint64_t max, const std::string& where, uint64_t* out, bool* present) {
  auto it = obj.find(key);
  if (present != nullptr) *present = it != obj.end();
  if (it == obj.end()) {
    if (present != nullptr) return Status::Ok();
    return Status::InvalidArgument(where + ": missing field " + key);
  }
  const json& v = *it;
  if (v.is_number_integer() && !v.is_number_unsigned()) {  // only negatives land here
    return Status::InvalidArgument(where + ": field " + key + " is negative (" + v.dump() + ")");
  }
  if (v.is_number_float() && v.get<double>() < 0) {
    return Status::InvalidArgument(where + ": field " + key + " is negative (" + v.dump() + ")");
  }
  if (!v.is_number_unsigned()) {
    return Status::InvalidArgument(where + ": field " + key + ": expected a non-negative integer, got " + Describe(v));
  }
  const uint64_t u = v.get<uint64_t>();
  if (u > max) {
    return Status::InvalidArgument(where + ": field " + key + " = " + std::to_string(u) + " exceeds " +
                                   std::to_string(max));
  }
  *out = u;
  return Status::Ok();
}

Status GetTime(const json& obj, const char* key, const std::string& where, double* out) {
  auto it = obj.find(key);
  if (it == obj.end()) return Status::InvalidArgument(where + ": missing field " + key);
  if (!it->is_number()) {
    return Status::InvalidArgument(where + ": field " + key + ": expected a number, got " + Describe(*it));
  }
  const double d = it->get<double>();
  if (!std::isfinite(d)) return Status::InvalidArgument(where + ": field " + key + " is not finite");
  if (d < 0) return Status::InvalidArgument(where + ": field " + key + " is negative (" + it->dump() + ")");
  *out = d;
  return Status::Ok();
}

Status GetBlockIds(const json& obj, const char* key, const std::string& where, std::vector<uint64_t>* out) {
  auto it = obj.find(key);
  if (it == obj.end()) return Status::InvalidArgument(where + ": missing field " + key);
  if (!it->is_array()) {
    return Status::InvalidArgument(where + ": field " + key + ": expected an array, got " + Describe(*it));
  }
  out->clear();
  out->reserve(it->size());
  size_t i = 0;
  for (const json& v : *it) {
    if (!v.is_number_unsigned()) {
      const bool negative = (v.is_number_integer() || v.is_number_float()) && v.get<double>() < 0;
      return Status::InvalidArgument(
          where + ": field " + key + "[" + std::to_string(i) +
          "]: " + (negative ? "negative block id " + v.dump() : "expected a non-negative integer, got " + Describe(v)));
    }
    out->push_back(v.get<uint64_t>());
    ++i;
  }
  return Status::Ok();
}

namespace {

// Reads the top-level keys of the first JSON value and stops at the first
// one that names a format.
class DetectHandler {
 public:
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const std::string&) { return true; }
  bool string(std::string&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_object(std::size_t) { return ++depth_, true; }
  bool start_array(std::size_t) { return ++depth_, true; }
  bool end_object() { return --depth_, true; }
  bool end_array() { return --depth_, true; }
  bool key(std::string& k) {
    if (depth_ != 1) return true;
    if (k == "requests") format_ = TraceFormat::kClaudeCode;
    if (k == "timestamp") format_ = TraceFormat::kMooncake;
    if (k == "arrival_s" || k == "flatkv_trace") format_ = TraceFormat::kGeneric;
    return format_ == TraceFormat::kAuto;  // false stops the parse
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) { return false; }

  TraceFormat format() const { return format_; }

 private:
  int depth_ = 0;
  TraceFormat format_ = TraceFormat::kAuto;
};

Result<TraceFormat> Detect(std::string_view text, const std::string& name) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return Status::InvalidArgument(name + ": empty trace");
  if (text[first] != '{') {
    return Status::InvalidArgument(name + ": not a trace: expected a JSON object or JSON lines, found byte " +
                                   std::to_string(static_cast<unsigned char>(text[first])) + " at offset " +
                                   std::to_string(first));
  }
  DetectHandler handler;
  try {
    (void)json::sax_parse(text.begin() + first, text.end(), &handler, json::input_format_t::json, false);
  } catch (const std::exception&) {
  }
  if (handler.format() == TraceFormat::kAuto) {
    return Status::InvalidArgument(name +
                                   ": cannot tell the trace format: the first object has no \"requests\" (Claude "
                                   "Code), \"timestamp\" (Mooncake) or \"flatkv_trace\"/\"arrival_s\" (generic)");
  }
  return handler.format();
}

bool IsTraceFileName(const std::string& file) {
  auto ends = [&](std::string_view suffix) {
    return file.size() > suffix.size() && file.compare(file.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends(".json.gz") || ends(".json") || ends(".jsonl");
}

}  // namespace
}  // namespace internal

Result<Trace> ParseTrace(std::string_view bytes, const std::string& name, TraceFormat format) {
  std::string inflated;
  if (bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
      static_cast<unsigned char>(bytes[1]) == 0x8b) {
    FLATKV_ASSIGN_OR_RETURN(inflated, internal::Gunzip(bytes, name));
    bytes = inflated;
  } else if (bytes.size() > internal::kMaxTraceBytes) {
    return Status::InvalidArgument(name + ": larger than the 1 GiB limit for a trace");
  }
  if (format == TraceFormat::kAuto) {
    FLATKV_ASSIGN_OR_RETURN(format, internal::Detect(bytes, name));
  }
  switch (format) {
    case TraceFormat::kClaudeCode:
      return internal::ParseClaudeCode(bytes, name);
    case TraceFormat::kMooncake:
      return internal::ParseMooncake(bytes, name);
    case TraceFormat::kGeneric:
      return internal::ParseGeneric(bytes, name);
    case TraceFormat::kAuto:
      break;
  }
  return Status::InvalidArgument(name + ": unknown trace format");
}

Result<Trace> ReadTrace(const std::string& path, TraceFormat format) {
  FLATKV_ASSIGN_OR_RETURN(std::string bytes, io::ReadWholeFile(path, internal::kMaxTraceBytes));
  return ParseTrace(bytes, path, format);
}

Result<Trace> MergeTraces(std::vector<Trace> traces, double stagger_s) {
  if (traces.empty()) return Status::InvalidArgument("MergeTraces: no traces");
  if (!std::isfinite(stagger_s) || stagger_s < 0) {
    return Status::InvalidArgument("MergeTraces: stagger_s " + std::to_string(stagger_s) +
                                   " is negative or not finite");
  }
  for (size_t i = 1; i < traces.size(); ++i) {
    if (traces[i].block_tokens != traces[0].block_tokens) {
      return Status::InvalidArgument("cannot merge " + traces[0].name + " (block_tokens " +
                                     std::to_string(traces[0].block_tokens) + ") with " + traces[i].name +
                                     " (block_tokens " + std::to_string(traces[i].block_tokens) + ")");
    }
  }
  if (traces.size() == 1) return std::move(traces[0]);

  Trace merged;
  merged.block_tokens = traces[0].block_tokens;
  size_t total = 0;
  for (const Trace& t : traces) total += t.requests.size();
  merged.requests.reserve(total);
  uint64_t next_conversation = 0;  // ids handed out so far
  for (size_t i = 0; i < traces.size(); ++i) {
    Trace& t = traces[i];
    merged.name += (i == 0 ? "" : ",") + t.name;
    // Conversation ids: this trace's distinct ids (parents included), in
    // order, become next_conversation + 1, + 2, ...
    std::vector<uint64_t> ids;
    ids.reserve(t.requests.size());
    for (const Request& r : t.requests) {
      ids.push_back(r.conversation);
      if (r.parent != 0) ids.push_back(r.parent);
    }
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    auto renumber = [&](uint64_t id) {
      return next_conversation + 1 + static_cast<uint64_t>(std::lower_bound(ids.begin(), ids.end(), id) - ids.begin());
    };
    const double shift = static_cast<double>(i) * stagger_s;
    for (Request& r : t.requests) {
      r.arrival_s += shift;
      r.conversation = renumber(r.conversation);
      if (r.parent != 0) r.parent = renumber(r.parent);
      for (uint64_t& b : r.blocks) b = internal::NamespacedId(i, b);
      merged.requests.push_back(std::move(r));
    }
    next_conversation += ids.size();
    merged.conversations += t.conversations;
  }
  internal::SortByArrival(&merged.requests);
  return merged;
}

Result<Trace> ReadTraces(const std::vector<std::string>& paths, double stagger_s, TraceFormat format) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  for (const std::string& p : paths) {
    std::error_code ec;
    fs::file_status st = fs::status(p, ec);
    if (ec || !fs::exists(st)) return Status::NotFound(p + ": no such file or directory");
    if (!fs::is_directory(st)) {
      files.push_back(p);
      continue;
    }
    std::vector<std::string> in_dir;
    for (fs::directory_iterator it(p, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string file = it->path().filename().string();
      if (internal::IsTraceFileName(file) && !it->is_directory()) in_dir.push_back(it->path().string());
    }
    if (ec) return Status::IoError(p + ": listing the directory failed: " + ec.message());
    if (in_dir.empty()) return Status::NotFound(p + ": no *.json.gz, *.json or *.jsonl files in the directory");
    std::sort(in_dir.begin(), in_dir.end());
    files.insert(files.end(), in_dir.begin(), in_dir.end());
  }
  if (files.empty()) return Status::InvalidArgument("ReadTraces: no paths");

  // Files are independent: read them on a few threads, keep file order.
  std::vector<std::optional<Result<Trace>>> results(files.size());
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  auto work = [&] {
    for (size_t i = next++; i < files.size() && !failed.load(); i = next++) {
      results[i].emplace(ReadTrace(files[i], format));
      if (!results[i]->ok()) failed = true;
    }
  };
  const size_t n_threads = std::min<size_t>(files.size(), std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
  std::vector<std::thread> threads;
  for (size_t t = 1; t < n_threads; ++t) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();

  std::vector<Trace> traces;
  traces.reserve(files.size());
  for (auto& r : results) {
    if (!r.has_value()) continue;  // skipped after another file failed
    if (!r->ok()) return r->status();
  }
  for (auto& r : results) traces.push_back(std::move(**r));
  FLATKV_ASSIGN_OR_RETURN(Trace merged, MergeTraces(std::move(traces), stagger_s));
  merged.name.clear();
  for (size_t i = 0; i < paths.size(); ++i) merged.name += (i == 0 ? "" : ",") + paths[i];
  return merged;
}

std::vector<uint64_t> RootConversations(const Trace& t) {
  std::unordered_map<uint64_t, uint64_t> root;
  std::vector<uint64_t> out(t.requests.size());
  for (size_t i = 0; i < t.requests.size(); ++i) {
    const Request& r = t.requests[i];
    uint64_t rt = r.conversation;
    if (r.parent != 0) {
      auto it = root.find(r.parent);
      rt = it != root.end() ? it->second : r.parent;
    }
    root.emplace(r.conversation, rt);
    out[i] = rt;
  }
  return out;
}

}  // namespace flatkv::replay
