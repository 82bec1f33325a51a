// Scoped setters of the transformer's attention hook and query sink, for the
// engine's compacted runs (engine_compact.cc, engine_chain.cc): whatever
// returns, the transformer is left with neither.
#pragma once

#include <utility>

#include "model/transformer.h"

namespace flatkv::engine {

class HookGuard {
 public:
  HookGuard(model::Transformer& t, model::Transformer::AttentionHook hook) : t_(t) { t_.set_attention_hook(std::move(hook)); }
  ~HookGuard() { t_.set_attention_hook(nullptr); }
  HookGuard(const HookGuard&) = delete;
  HookGuard& operator=(const HookGuard&) = delete;

 private:
  model::Transformer& t_;
};

class QuerySinkGuard {
 public:
  QuerySinkGuard(model::Transformer& t, model::Transformer::QuerySink sink) : t_(t) { t_.set_query_sink(std::move(sink)); }
  ~QuerySinkGuard() { t_.set_query_sink(nullptr); }
  QuerySinkGuard(const QuerySinkGuard&) = delete;
  QuerySinkGuard& operator=(const QuerySinkGuard&) = delete;

 private:
  model::Transformer& t_;
};

}  // namespace flatkv::engine
