// StoreStats: a snapshot of a store's counters.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace flatkv {

struct MediumStats {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;       // bytes of allocated extents
  uint64_t extents = 0;          // allocated extents
  uint64_t allocated_bytes = 0;  // bytes of every extent (DRAM: and copy) allocated so far, freed or not
  uint64_t blocks = 0;           // blocks readable from this medium (DRAM: copies and DRAM homes)
  uint64_t hit_blocks = 0;       // blocks restored from this medium
  uint64_t bytes_written = 0;    // payload bytes put
  uint64_t bytes_read = 0;       // bytes read from the medium (SSD: including alignment padding)
  uint64_t bytes_delivered = 0;  // payload bytes placed in restore windows
  uint64_t read_requests = 0;    // coalesced requests issued
  uint64_t evicted_extents = 0;  // DRAM with an SSD tier: copies dropped (no data lost)
  uint64_t evicted_blocks = 0;
  uint64_t queue_depth = 0;      // requests outstanding now
  uint64_t max_queue_depth = 0;  // the most ever outstanding
  // Blocks indexed on this medium: the bytes they occupy there (encoded
  // slices for coded blocks, per-put alignment padding excluded) and their
  // payload before encoding (blocks x BlockBytes()).
  uint64_t stored_bytes = 0;
  uint64_t logical_bytes = 0;
};

// The remote tier (StoreOptions::remote); all zero without one.
struct RemoteStats {
  bool enabled = false;
  uint64_t hit_blocks = 0;        // blocks restores took from the cluster (the local media missed them)
  uint64_t restored_blocks = 0;   // of them, valid in every layer
  uint64_t bytes_read = 0;        // object bytes read (headers included)
  uint64_t lookups = 0;           // index lookups (one pipelined round each)
  uint64_t lookup_errors = 0;     // lookups that failed (then restores skip the tier for RemoteOptions::backoff)
  uint64_t lookups_skipped = 0;   // restores that did not look because of a recent failure
  uint64_t stale_objects = 0;     // objects whose header or checksum did not match: misses, never wrong bytes
  uint64_t missing_objects = 0;   // indexed objects gone (evicted, expired): misses
  uint64_t published_blocks = 0;         // blocks this store wrote to the cluster
  uint64_t already_published_blocks = 0;  // blocks another node (or an earlier put) had published
  uint64_t published_bytes = 0;          // object bytes written
  uint64_t publish_dropped_blocks = 0;   // blocks not published: the publish buffer was full
  uint64_t publish_errors = 0;           // publishes that failed (their blocks stay local only)
  uint64_t publish_queued_blocks = 0;    // blocks waiting to be published now
  uint64_t publish_queued_bytes = 0;     // their bytes (at most RemoteOptions::publish_buffer_bytes)
  uint64_t capacity_bytes = 0;           // RemoteOptions::capacity_bytes (0: no cap)
  uint64_t held_bytes = 0;               // cluster bytes (objects, index entries, names) this store published and keeps
  uint64_t capacity_deleted_blocks = 0;  // published blocks deleted again to stay within capacity_bytes
};

struct StoreStats {
  MediumStats dram;
  MediumStats ssd;
  RemoteStats remote;
  uint64_t sessions = 0;
  uint64_t restores = 0;
  uint64_t lookup_blocks = 0;   // keys asked for across restores
  uint64_t miss_blocks = 0;     // keys asked for that did not hit
  uint64_t put_blocks = 0;      // blocks written
  uint64_t dram_only_blocks = 0;  // indexed blocks with no SSD home written (lost on reclaim or crash)
  uint64_t dram_only_lost_blocks = 0;  // DRAM-only blocks dropped by reclaim (kOnReuse)
  uint64_t readmitted_blocks = 0;  // SSD blocks a restore copied back into DRAM (readmit_on_restore)
  uint64_t prefetches = 0;         // Prefetch calls that started a background read of SSD blocks
  uint64_t prefetches_done = 0;    // of those, the ones whose reads finished (prefetches - prefetches_done run now)
  uint64_t prefetch_skipped = 0;   // Prefetch calls that found SSD blocks but too many prefetches running
  uint64_t truncated_blocks = 0;   // blocks TruncateSession took out of the index
  uint64_t retained_extents = 0;   // extents a Retain keeps from eviction now
  uint64_t retain_refused_blocks = 0;  // blocks a Retain left unretained (retained extents at half a medium)
  // DRAM (copies and DRAM homes) per tenant holding any, by PutOptions::tenant (0: none).
  std::map<uint32_t, uint64_t> tenant_dram_bytes;
  uint64_t ssd_write_waits = 0;    // puts that waited for earlier SSD writes (ssd_write_buffer_bytes)
  uint64_t shared_extents = 0;     // extents other sessions than their owner reference
  uint64_t dedup_blocks = 0;    // blocks put that were already stored
  uint64_t checksum_failures = 0;
  uint64_t decode_failures = 0;   // coded slices that failed to decode (each a miss, like a checksum failure)
  uint64_t io_errors = 0;
  uint64_t dropped_blocks = 0;    // blocks taken out of the index after a failed read, checksum or decode
  uint64_t recovered_blocks = 0;  // SSD blocks found by recovery at Open
  uint64_t lost_blocks = 0;       // SSD blocks recovery dropped (missing or short segment)
  uint64_t manifest_bytes = 0;
  uint64_t manifest_checkpoints = 0;  // online checkpoints done since Open (manifest_checkpoint_bytes)
  bool ssd_direct_io = false;     // every SSD segment is opened with O_DIRECT
  std::string ssd_engine;         // "io_uring", "threadpool", ...
  // Restore latency, from Restore() to the last layer loaded, in microseconds.
  double restore_p50_us = 0, restore_p90_us = 0, restore_p99_us = 0, restore_max_us = 0;

  // SSD read amplification: bytes read from SSD / bytes delivered from SSD
  // (delivered bytes are decoded bytes, so coded blocks bring it below 1).
  double ssd_read_amplification() const {
    return ssd.bytes_delivered ? double(ssd.bytes_read) / double(ssd.bytes_delivered) : 0.0;
  }
  // logical / stored bytes over both media (1 without codecs; 0 when empty).
  double compression_ratio() const {
    const uint64_t stored = dram.stored_bytes + ssd.stored_bytes;
    return stored ? double(dram.logical_bytes + ssd.logical_bytes) / double(stored) : 0.0;
  }
  // Human-readable, one item a line.
  std::string ToString() const;
  // One JSON object.
  std::string ToJson() const;
};

}  // namespace flatkv
