// NodeIo: the transfer paths one node's serving instances share, as an
// equal-share (processor-sharing) bandwidth model.
//
// Resources: the node's SSD array (reads and writes time-share it), the
// node's host-memory bandwidth, its link to a shared remote tier in each
// direction (a multi-node replay), the store's DRAM copy threads (a restore
// that memcpys DRAM hits into a host window before they cross to the GPU,
// flat's DramQueue), and per instance its host-to-GPU and
// GPU-to-host PCIe directions (the instance's tensor-parallel GPUs' links
// together). A flow is one transfer (a restore, an offload) with a demand on
// each resource it crosses, in seconds of that resource's exclusive use
// (bytes / bandwidth, plus requests / IOPS on the SSD). While n flows are
// active on a resource each gets 1/n of it; a flow advances at the rate of
// its scarcest share, uniformly on all its resources (the transfer is
// pipelined: SSD -> host -> GPU by layer). A flow may start after a fixed
// latency (the SSD's first-request latency), and a kReal restore is a flow
// of fixed duration with no demand (its time was measured).
//
// Not max-min fair: a flow held back by one resource leaves its share of
// the others unused. Simple, and never faster than the hardware.
//
// Thread-safety: none; driven by the simulator thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

namespace flatkv::replay {

class NodeIo {
 public:
  static constexpr double kNever = std::numeric_limits<double>::infinity();
  // Resource indices: kSsd, kDram, kRemoteIn (restores from the remote
  // tier), kRemoteOut (publishes to it), kCopy (the store's DRAM copy
  // threads), then H2d(i), D2h(i) for each instance.
  static constexpr uint32_t kSsd = 0, kDram = 1, kRemoteIn = 2, kRemoteOut = 3, kCopy = 4;
  static uint32_t H2d(uint32_t instance) { return 5 + 2 * instance; }
  static uint32_t D2h(uint32_t instance) { return 6 + 2 * instance; }

  explicit NodeIo(uint32_t instances) : users_(5 + 2 * std::size_t{instances}, 0) {}

  // Starts a flow at `now` that begins moving data at now + latency_s, with
  // `demand` = {resource, seconds of exclusive use}. Returns its id.
  uint32_t Start(double now, std::vector<std::pair<uint32_t, double>> demand, double latency_s);
  // A flow of fixed duration that uses no shared resource.
  uint32_t StartFixed(double now, double duration_s);
  // Notifies when flow `id` reaches `fraction` of its transfer (0 clears).
  void NotifyAt(uint32_t id, double fraction) { flows_[id].notify = fraction; }

  // Moves every flow forward to time `t` (>= now()).
  void Advance(double t);
  // The earliest time a flow starts moving, completes or reaches its
  // notify fraction; kNever when none.
  double NextEvent() const;
  // Flows completed, and flows that reached their notify fraction, since
  // the last call.
  std::vector<uint32_t> TakeCompleted();
  std::vector<uint32_t> TakeNotified();

  bool done(uint32_t id) const { return flows_[id].done; }
  double fraction(uint32_t id) const { return flows_[id].f; }
  // Seconds until `id` completes at the current shares (kNever if stalled).
  double RemainingSeconds(uint32_t id) const;
  uint32_t active() const { return active_; }
  double now() const { return now_; }

 private:
  struct Flow {
    std::vector<std::pair<uint32_t, double>> demand;
    double begin = 0;       // starts moving data
    double f = 0;           // fraction transferred
    double fixed = 0;       // > 0: fixed duration, no demand
    double notify = 0;      // report when f reaches this
    bool started = false, done = false;
  };
  double Rate(const Flow& fl) const;  // fraction per second
  void Begin(uint32_t id);
  void Finish(uint32_t id);

  double now_ = 0;
  std::vector<Flow> flows_;
  std::vector<uint32_t> live_;     // ids not done
  std::vector<uint32_t> users_;    // active flows per resource
  std::vector<uint32_t> completed_, notified_;
  uint32_t active_ = 0;
};

}  // namespace flatkv::replay
