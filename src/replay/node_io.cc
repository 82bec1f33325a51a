#include "replay/node_io.h"

#include <algorithm>
#include <cmath>

namespace flatkv::replay {

uint32_t NodeIo::Start(double now, std::vector<std::pair<uint32_t, double>> demand, double latency_s) {
  Advance(now);
  const uint32_t id = static_cast<uint32_t>(flows_.size());
  Flow fl;
  for (auto& [r, s] : demand)
    if (s > 0 && r < users_.size()) fl.demand.emplace_back(r, s);
  fl.begin = now + std::max(0.0, latency_s);
  if (fl.demand.empty()) fl.fixed = 1e-12;  // nothing to move: done as it begins
  flows_.push_back(std::move(fl));
  live_.push_back(id);
  if (flows_[id].begin <= now_) Begin(id);
  return id;
}

uint32_t NodeIo::StartFixed(double now, double duration_s) {
  Advance(now);
  const uint32_t id = static_cast<uint32_t>(flows_.size());
  Flow fl;
  fl.begin = now;
  fl.fixed = std::max(duration_s, 1e-12);
  flows_.push_back(std::move(fl));
  live_.push_back(id);
  Begin(id);
  return id;
}

void NodeIo::Begin(uint32_t id) {
  Flow& fl = flows_[id];
  fl.started = true;
  ++active_;
  for (auto& [r, s] : fl.demand) ++users_[r];
}

void NodeIo::Finish(uint32_t id) {
  Flow& fl = flows_[id];
  if (fl.done) return;
  fl.done = true;
  fl.f = 1;
  --active_;
  for (auto& [r, s] : fl.demand) --users_[r];
  completed_.push_back(id);
  if (fl.notify > 0) {
    notified_.push_back(id);
    fl.notify = 0;
  }
}

double NodeIo::Rate(const Flow& fl) const {
  if (fl.fixed > 0) return 1.0 / fl.fixed;
  double rate = kNever;
  for (const auto& [r, s] : fl.demand) rate = std::min(rate, 1.0 / (double(users_[r]) * s));
  return rate;
}

double NodeIo::RemainingSeconds(uint32_t id) const {
  const Flow& fl = flows_[id];
  if (fl.done) return 0;
  const double wait = fl.started ? 0.0 : fl.begin - now_;
  // Not yet started: its rate once begun, with itself counted.
  double rate = fl.fixed > 0 ? 1.0 / fl.fixed : kNever;
  for (const auto& [r, s] : fl.demand) rate = std::min(rate, 1.0 / (double(users_[r] + (fl.started ? 0 : 1)) * s));
  return wait + (1.0 - fl.f) / rate;
}

double NodeIo::NextEvent() const {
  double t = kNever;
  for (uint32_t id : live_) {
    const Flow& fl = flows_[id];
    if (!fl.started) {
      t = std::min(t, fl.begin);
      continue;
    }
    const double rate = Rate(fl);
    t = std::min(t, now_ + (1.0 - fl.f) / rate);
    if (fl.notify > fl.f) t = std::min(t, now_ + (fl.notify - fl.f) / rate);
  }
  // An event within rounding of now is one ulp ahead, so Advance always moves.
  return t == kNever ? t : std::max(t, std::nextafter(now_, kNever));
}

void NodeIo::Advance(double t) {
  while (now_ < t) {
    double next = std::min(t, NextEvent());
    if (next <= now_) next = std::nextafter(now_, kNever);  // an event within rounding: step one ulp
    const double dt = next - now_;
    for (uint32_t id : live_) {
      Flow& fl = flows_[id];
      if (!fl.started) continue;
      fl.f += dt * Rate(fl);
    }
    now_ = next;
    // Rates change only at these boundaries: apply them after moving everyone.
    std::vector<uint32_t> keep;
    keep.reserve(live_.size());
    for (uint32_t id : live_) {
      Flow& fl = flows_[id];
      if (!fl.started && fl.begin <= now_) Begin(id);
      if (fl.started && fl.notify > 0 && fl.f >= fl.notify - 1e-9) {
        notified_.push_back(id);
        fl.notify = 0;
      }
      if (fl.started && !fl.done && fl.f >= 1.0 - 1e-9) Finish(id);
      if (!fl.done) keep.push_back(id);
    }
    live_.swap(keep);
  }
}

std::vector<uint32_t> NodeIo::TakeCompleted() {
  std::vector<uint32_t> out;
  out.swap(completed_);
  return out;
}

std::vector<uint32_t> NodeIo::TakeNotified() {
  std::vector<uint32_t> out;
  out.swap(notified_);
  return out;
}

}  // namespace flatkv::replay
