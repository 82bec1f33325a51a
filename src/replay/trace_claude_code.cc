// The Claude Code session reader (kv-cache-tester traces): one JSON object
// per session, sub-agents nested in the request list. Parsed with
// nlohmann's SAX interface straight into a small typed tree, so the
// hash_ids arrays (most of the bytes) never become JSON values and are moved,
// not copied, into the Requests. Format: docs/format_trace.md.
#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "replay/trace_internal.h"

namespace flatkv::replay::internal {
namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxBlockTokens = uint64_t{1} << 20;
constexpr int kMaxSubagentDepth = 64;  // bounds recursion and the tree's destructor

// One element of a "requests" array: an LLM call or a sub-agent.
struct Entry {
  double t = 0;
  bool has_t = false;
  std::string type;
  bool has_type = false;
  uint64_t in = 0, out = 0;
  bool has_in = false, has_out = false;
  std::vector<uint64_t> hash_ids;
  bool has_hash_ids = false;
  std::vector<Entry> children;  // a sub-agent's requests
  bool has_requests = false;
};

// SAX handler: a stack of frames mirrors the JSON nesting that matters;
// anything else is skipped. Stops at the first error with a JSON path.
class Handler {
 public:
  Handler() = default;

  bool null() { return Scalar("null"); }
  bool boolean(bool) { return Scalar("a boolean"); }
  bool string(std::string& s) {
    Frame* f = Top();
    if (f != nullptr && f->kind == Kind::kRoot && f->key == "hash_id_scope") {
      scope_ = s;
      return true;
    }
    if (f != nullptr && f->kind == Kind::kEntry && f->key == "type") {
      f->entry->type = s;
      f->entry->has_type = true;
      return true;
    }
    return Scalar("a string");
  }
  bool binary(json::binary_t&) { return Scalar("binary"); }
  bool number_unsigned(json::number_unsigned_t v) { return Number(static_cast<double>(v), v, false, true); }
  bool number_integer(json::number_integer_t v) { return Number(static_cast<double>(v), 0, v < 0, true); }
  bool number_float(json::number_float_t v, const std::string&) { return Number(v, 0, v < 0, false); }

  bool start_object(std::size_t) {
    Frame* f = Top();
    if (f == nullptr) {
      stack_.push_back(Frame(Kind::kRoot));
      return true;
    }
    switch (f->kind) {
      case Kind::kSkip:
        ++f->skip_depth;
        return true;
      case Kind::kRequests: {
        ++f->count;
        f->list->emplace_back();
        Frame e{Kind::kEntry};
        e.entry = &f->list->back();
        e.depth = f->depth;
        stack_.push_back(std::move(e));
        return true;
      }
      case Kind::kHashIds:
        ++f->count;
        return Fail("expected a non-negative integer, got an object");
      case Kind::kRoot:
      case Kind::kEntry:
        if (IsKnownKey(*f)) return Fail("expected " + Expected(*f) + ", got an object");
        return Skip();
    }
    return true;
  }

  bool start_array(std::size_t) {
    Frame* f = Top();
    if (f == nullptr) return Fail("expected a JSON object at the top level, got an array");
    switch (f->kind) {
      case Kind::kSkip:
        ++f->skip_depth;
        return true;
      case Kind::kRequests:
        ++f->count;
        return Fail("expected an object, got an array");
      case Kind::kHashIds:
        ++f->count;
        return Fail("expected a non-negative integer, got an array");
      case Kind::kRoot:
        if (f->key == "requests") {
          has_requests_ = true;
          roots_.clear();
          Frame r{Kind::kRequests};
          r.list = &roots_;
          stack_.push_back(std::move(r));
          return true;
        }
        if (IsKnownKey(*f)) return Fail("expected " + Expected(*f) + ", got an array");
        return Skip();
      case Kind::kEntry:
        if (f->key == "hash_ids") {
          f->entry->hash_ids.clear();
          f->entry->has_hash_ids = true;
          Frame h{Kind::kHashIds};
          h.ids = &f->entry->hash_ids;
          stack_.push_back(std::move(h));
          return true;
        }
        if (f->key == "requests") {
          if (f->depth >= kMaxSubagentDepth) {
            return Fail("sub-agents nested deeper than " + std::to_string(kMaxSubagentDepth));
          }
          f->entry->children.clear();
          f->entry->has_requests = true;
          Frame r{Kind::kRequests};
          r.list = &f->entry->children;
          r.depth = f->depth + 1;
          stack_.push_back(std::move(r));
          return true;
        }
        if (IsKnownKey(*f)) return Fail("expected " + Expected(*f) + ", got an array");
        return Skip();
    }
    return true;
  }

  bool key(std::string& k) {
    Frame* f = Top();
    if (f != nullptr && f->kind != Kind::kSkip) f->key = k;
    return true;
  }
  bool end_object() { return End(); }
  bool end_array() { return End(); }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) {
    syntax_error_ = true;
    syntax_position_ = position;
    syntax_what_ = ex.what();
    return false;
  }

  // Results.
  const std::string& error() const { return error_; }
  bool syntax_error() const { return syntax_error_; }
  std::size_t syntax_position() const { return syntax_position_; }
  const std::string& syntax_what() const { return syntax_what_; }
  std::vector<Entry>& roots() { return roots_; }
  bool has_requests() const { return has_requests_; }
  bool has_block_size() const { return has_block_size_; }
  uint64_t block_size() const { return block_size_; }
  const std::string& scope() const { return scope_; }

 private:
  enum class Kind { kRoot, kRequests, kEntry, kHashIds, kSkip };
  struct Frame {
    explicit Frame(Kind k) : kind(k) {}
    Kind kind;
    std::string key;                       // kRoot, kEntry: the current key
    uint64_t count = 0;                    // kRequests, kHashIds: elements started
    Entry* entry = nullptr;                // kEntry
    std::vector<Entry>* list = nullptr;    // kRequests
    std::vector<uint64_t>* ids = nullptr;  // kHashIds
    int skip_depth = 0;                    // kSkip
    int depth = 0;                         // sub-agent nesting level
  };

  Frame* Top() { return stack_.empty() ? nullptr : &stack_.back(); }

  bool Skip() {
    Frame s{Kind::kSkip};
    s.skip_depth = 1;
    stack_.push_back(std::move(s));
    return true;
  }

  bool End() {
    Frame* f = Top();
    if (f == nullptr) return true;
    if (f->kind == Kind::kSkip && --f->skip_depth > 0) return true;
    stack_.pop_back();
    return true;
  }

  static bool IsKnownKey(const Frame& f) {
    if (f.kind == Kind::kRoot) return f.key == "block_size" || f.key == "hash_id_scope" || f.key == "requests";
    return f.key == "t" || f.key == "type" || f.key == "in" || f.key == "out" || f.key == "hash_ids" ||
           f.key == "requests";
  }
  static std::string Expected(const Frame& f) {
    if (f.key == "hash_id_scope" || f.key == "type") return "a string";
    if (f.key == "requests") return "an array";
    if (f.key == "hash_ids") return "an array of non-negative integers";
    if (f.key == "t") return "a number";
    return "a non-negative integer";
  }

  bool Scalar(const char* what) {
    Frame* f = Top();
    if (f == nullptr) return Fail(std::string("expected a JSON object at the top level, got ") + what);
    switch (f->kind) {
      case Kind::kSkip:
        return true;
      case Kind::kRequests:
        ++f->count;
        return Fail(std::string("expected an object, got ") + what);
      case Kind::kHashIds:
        ++f->count;
        return Fail(std::string("expected a non-negative integer, got ") + what);
      case Kind::kRoot:
      case Kind::kEntry:
        if (IsKnownKey(*f)) return Fail("expected " + Expected(*f) + ", got " + what);
        return true;
    }
    return true;
  }

  // `d` is the value as a double; `u` the value when it is a non-negative integer.
  bool Number(double d, uint64_t u, bool negative, bool integer) {
    Frame* f = Top();
    if (f == nullptr) return Fail("expected a JSON object at the top level, got a number");
    switch (f->kind) {
      case Kind::kSkip:
        return true;
      case Kind::kRequests:
        ++f->count;
        return Fail("expected an object, got a number");
      case Kind::kHashIds:
        ++f->count;
        if (negative) return Fail("negative block id " + FormatNumber(d));
        if (!integer) return Fail("block id " + FormatNumber(d) + " is not an integer");
        f->ids->push_back(u);
        return true;
      case Kind::kRoot:
        if (f->key == "block_size") {
          if (!integer || negative || u == 0 || u > kMaxBlockTokens) {
            return Fail("block_size " + FormatNumber(d) + " is not an integer in [1, " +
                        std::to_string(kMaxBlockTokens) + "]");
          }
          block_size_ = u;
          has_block_size_ = true;
          return true;
        }
        if (IsKnownKey(*f)) return Fail("expected " + Expected(*f) + ", got a number");
        return true;
      case Kind::kEntry: {
        Entry* e = f->entry;
        if (f->key == "t") {
          if (!std::isfinite(d) || d < 0) return Fail("time " + FormatNumber(d) + " is negative or not finite");
          e->t = d;
          e->has_t = true;
          return true;
        }
        if (f->key == "in" || f->key == "out") {
          if (negative) return Fail("negative token count " + FormatNumber(d));
          if (!integer) return Fail("token count " + FormatNumber(d) + " is not an integer");
          if (u > std::numeric_limits<uint32_t>::max())
            return Fail("token count " + std::to_string(u) + " exceeds 2^32-1");
          (f->key == "in" ? e->in : e->out) = u;
          (f->key == "in" ? e->has_in : e->has_out) = true;
          return true;
        }
        if (IsKnownKey(*f)) return Fail("expected " + Expected(*f) + ", got a number");
        return true;
      }
    }
    return true;
  }

  static std::string FormatNumber(double d) {
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 1e18) return std::to_string(static_cast<int64_t>(d));
    std::string s = std::to_string(d);
    return s;
  }

  // JSON path of the value being read, e.g. "requests[3].requests[0].in".
  std::string Path() const {
    std::string p;
    for (const Frame& f : stack_) {
      switch (f.kind) {
        case Kind::kRoot:
        case Kind::kEntry:
          if (!f.key.empty()) p += (p.empty() ? "" : ".") + f.key;
          break;
        case Kind::kRequests:
        case Kind::kHashIds:
          if (f.count > 0) p += "[" + std::to_string(f.count - 1) + "]";
          break;
        case Kind::kSkip:
          break;
      }
    }
    return p;
  }

  bool Fail(const std::string& what) {
    std::string path = Path();
    error_ = path.empty() ? what : path + ": " + what;
    return false;
  }

  std::vector<Frame> stack_;
  std::vector<Entry> roots_;
  bool has_requests_ = false;
  bool has_block_size_ = false;
  uint64_t block_size_ = 0;
  std::string scope_;
  std::string error_;
  bool syntax_error_ = false;
  std::size_t syntax_position_ = 0;
  std::string syntax_what_;
};

// Turns the entry tree into Requests. `conversation` is the id of the agent
// whose list `entries` is; sub-agents get the next free ids in file order.
class Flattener {
 public:
  Flattener(const std::string& name, uint64_t block_tokens, std::vector<Request>* out)
      : name_(name), block_tokens_(block_tokens), out_(out) {}

  Status Walk(std::vector<Entry>& entries, uint64_t conversation, uint64_t parent, double start_s,
              const std::string& path) {
    for (size_t i = 0; i < entries.size(); ++i) {
      Entry& e = entries[i];
      const std::string where = path + "[" + std::to_string(i) + "]";
      const bool subagent = e.has_type && e.type == "subagent";
      if (subagent || e.has_requests) {
        if (!subagent) return Error(where, "has \"requests\" but type is not \"subagent\"");
        if (!e.has_t) return Error(where, "missing field t (the sub-agent's spawn time)");
        if (!e.has_requests) return Error(where, "missing field requests");
        const double spawn = start_s + e.t;
        if (!std::isfinite(spawn)) return Error(where, "spawn time overflows");
        const uint64_t child = ++last_conversation_;
        FLATKV_RETURN_IF_ERROR(Walk(e.children, child, conversation, spawn, where + ".requests"));
        continue;
      }
      if (e.has_type && e.type != "s" && e.type != "n") {
        return Error(where, "unknown type \"" + e.type + "\" (expected \"s\", \"n\" or \"subagent\")");
      }
      if (!e.has_t) return Error(where, "missing field t");
      if (!e.has_in) return Error(where, "missing field in");
      if (!e.has_out) return Error(where, "missing field out");
      if (!e.has_hash_ids) return Error(where, "missing field hash_ids");
      if (!BlocksFit(e.hash_ids.size(), e.in, block_tokens_)) {
        return Error(where, "hash_ids has " + std::to_string(e.hash_ids.size()) +
                                " ids but in = " + std::to_string(e.in) + " tokens allows at most " +
                                std::to_string((e.in + block_tokens_ - 1) / block_tokens_));
      }
      Request r;
      r.arrival_s = start_s + e.t;
      if (!std::isfinite(r.arrival_s)) return Error(where, "arrival time overflows");
      r.conversation = conversation;
      r.parent = parent;
      r.input_tokens = static_cast<uint32_t>(e.in);
      r.output_tokens = static_cast<uint32_t>(e.out);
      r.blocks = std::move(e.hash_ids);
      out_->push_back(std::move(r));
    }
    return Status::Ok();
  }

  uint64_t conversations() const { return last_conversation_; }
  void set_first(uint64_t id) { last_conversation_ = id; }

 private:
  Status Error(const std::string& where, const std::string& what) const {
    return Status::InvalidArgument(name_ + ": " + where + ": " + what);
  }

  const std::string& name_;
  uint64_t block_tokens_;
  std::vector<Request>* out_;
  uint64_t last_conversation_ = 0;
};

size_t CountCalls(const std::vector<Entry>& entries) {
  size_t n = 0;
  for (const Entry& e : entries) n += e.has_requests ? CountCalls(e.children) : 1;
  return n;
}

}  // namespace

Result<Trace> ParseClaudeCode(std::string_view text, const std::string& name) {
  Handler handler;
  bool ok = false;
  try {
    ok = json::sax_parse(text.begin(), text.end(), &handler, json::input_format_t::json, /*strict=*/true,
                         /*ignore_comments=*/false);
  } catch (const std::exception& ex) {  // nlohmann reports through the handler; this is a backstop
    return Status::InvalidArgument(name + ": JSON error: " + ex.what());
  }
  if (!ok) {
    if (handler.syntax_error()) {
      const uint64_t pos = handler.syntax_position() > 0 ? handler.syntax_position() - 1 : 0;
      LineCol lc = LocateOffset(text, pos);
      return Status::InvalidArgument(name + ":" + std::to_string(lc.line) + ":" + std::to_string(lc.column) +
                                     ": invalid JSON at byte " + std::to_string(pos) + ": " +
                                     JsonErrorDescription(handler.syntax_what()));
    }
    return Status::InvalidArgument(name + ": " + handler.error());
  }
  if (!handler.has_block_size()) return Status::InvalidArgument(name + ": missing field block_size");
  if (!handler.scope().empty() && handler.scope() != "local") {
    return Status::NotSupported(name + ": hash_id_scope \"" + handler.scope() + "\" is not supported (only \"local\")");
  }
  if (!handler.has_requests()) return Status::InvalidArgument(name + ": missing field requests");

  Trace trace;
  trace.name = name;
  trace.block_tokens = static_cast<uint32_t>(handler.block_size());
  trace.requests.reserve(CountCalls(handler.roots()));
  Flattener flat(name, handler.block_size(), &trace.requests);
  flat.set_first(1);  // the session itself is conversation 1
  FLATKV_RETURN_IF_ERROR(flat.Walk(handler.roots(), 1, 0, 0.0, "requests"));
  trace.conversations = flat.conversations();
  SortByArrival(&trace.requests);
  return trace;
}

}  // namespace flatkv::replay::internal
