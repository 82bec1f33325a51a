// BlockIndex: the store's key -> (extent, slot) index, compact and growing
// without stalls.
//
// An open-addressing table (linear probing, power-of-two capacity, load at
// most 4/5) of 8-byte entries: an 8-bit tag (the hash's top byte, never 0),
// a 28-bit extent handle and a 28-bit slot. The table holds no key: the one
// copy of a block's key lives in its extent's slot, and a probe whose tag
// matches asks the caller's `key_of(ref)` for it. So an indexed block costs
// 8 bytes / load (10-20 bytes) here plus its 16-byte key in the extent.
//
// Erase uses backward-shift deletion, so the table never fills with
// tombstones (only an erase from the retiring table, below, leaves one). Growth is incremental: when an insert would pass the load
// limit, the table becomes the *retiring* table and a new one of twice the
// capacity takes inserts; every insert then moves the entries of the next
// kMigrateStep buckets of the retiring table, in bucket order, until it is
// empty and freed. No insert moves more than kMigrateStep entries, and
// since the new table takes at least 4/5 of the old capacity in inserts
// before it is full, a migration always ends long before the next one
// starts. Find looks in the new table, then in the retiring one, where a
// probe skips the buckets already migrated (an entry still there sits at or
// after the cursor, and every bucket its probe crossed before the cursor
// was occupied). So those buckets' pages are handed back to the kernel as
// the cursor passes them (madvise, a 64 KiB run at a time) and freeing the
// retiring table at the end unmaps almost nothing: no stall there either
// (freeing a touched 128 MiB table at once took 5-77 ms). Tables come
// zeroed from the kernel (calloc, or an anonymous mapping from 2 MiB up),
// so a large one costs no zeroing under the caller's lock; a mapping is 2
// MiB aligned and asks for transparent huge pages (MADV_HUGEPAGE), so a
// lookup in a table of millions of entries walks no 4 KiB page tables.
//
// `key_of(Ref) -> BlockKey` must return the key of every ref in the table
// (and of the ref being inserted). Not thread-safe: the store calls it
// under its mutex.
#pragma once

#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>

#include "flatkv/keys.h"

namespace flatkv {

class BlockIndex {
 public:
  struct Ref {
    uint32_t handle = 0;  // < kMaxHandles
    uint32_t slot = 0;    // < kMaxSlots
    bool operator==(const Ref&) const = default;
  };
  static constexpr uint32_t kMaxHandles = (1u << 28) - 1;  // all ones is kept free (no tombstone clash)
  static constexpr uint32_t kMaxSlots = 1u << 28;
  static constexpr uint32_t kMigrateStep = 16;  // retiring-table buckets moved per insert
  static constexpr uint64_t kMinCapacity = 64;

  BlockIndex() = default;
  BlockIndex(const BlockIndex&) = delete;
  BlockIndex& operator=(const BlockIndex&) = delete;

  static uint64_t Hash(const BlockKey& k) {
    uint64_t h = k.lo ^ (k.hi * 0x9E3779B97F4A7C15ull);
    h ^= h >> 32;
    h *= 0xD6E8FEB86659FD93ull;
    h ^= h >> 32;
    return h;
  }

  template <typename KeyOf>
  std::optional<Ref> Find(const BlockKey& key, const KeyOf& key_of) const {
    const uint64_t h = Hash(key);
    if (auto pos = Probe(cur_, 0, key, h, key_of)) return RefOf(cur_.slots[*pos]);
    if (auto pos = Probe(old_, cursor_, key, h, key_of)) return RefOf(old_.slots[*pos]);
    return std::nullopt;
  }

  // Starts loading the bucket `key`'s probe begins at (a caller about to
  // Find or Insert many keys issues these a few keys ahead).
  void Prefetch(const BlockKey& key) const {
    if (cur_.cap != 0) __builtin_prefetch(&cur_.slots[Hash(key) & (cur_.cap - 1)], 1);
  }

  template <typename KeyOf>
  bool Contains(const BlockKey& key, const KeyOf& key_of) const {
    return Find(key, key_of).has_value();
  }

  // Adds key -> ref. The caller has checked that key is absent; key_of(ref)
  // already returns key. Moves at most kMigrateStep entries.
  template <typename KeyOf>
  void Insert(const BlockKey& key, Ref ref, const KeyOf& key_of) {
    last_moved_ = 0;
    if (old_.cap != 0) MigrateSome(key_of);
    if ((cur_.live + 1) * 5 > cur_.cap * 4) {
      if (old_.cap != 0) FinishMigration(key_of);  // unreachable (see above); keeps the invariant regardless
      Grow();
      MigrateSome(key_of);
    }
    Place(&cur_, Hash(key), Entry(Hash(key), ref));
  }

  // Removes key -> ref; false if the index does not map key to ref.
  template <typename KeyOf>
  bool Erase(const BlockKey& key, Ref ref, const KeyOf& key_of) {
    const uint64_t h = Hash(key), want = Entry(h, ref);
    if (auto pos = ProbeExact(cur_, 0, h, want)) {
      ShiftDelete(*pos, key_of);
      return true;
    }
    if (auto pos = ProbeExact(old_, cursor_, h, want)) {
      old_.slots[*pos] = kTombstone;
      old_.live--;
      return true;
    }
    return false;
  }

  // Sizes an empty index for `n` entries at once (recovery knows how many
  // it will insert), so no growth or migration runs while they go in.
  void Reserve(uint64_t n) {
    if (size() != 0 || old_.cap != 0) return;
    uint64_t cap = kMinCapacity;
    while (cap * 4 < n * 5) cap *= 2;
    if (cap > cur_.cap) cur_ = Allocate(cap);
  }

  uint64_t size() const { return cur_.live + old_.live; }
  uint64_t capacity() const { return cur_.cap; }
  bool migrating() const { return old_.cap != 0; }
  // Bytes of the tables (both during a migration).
  uint64_t MemoryBytes() const { return (cur_.cap + old_.cap) * sizeof(uint64_t); }
  // Bytes of the tables of every index in the process that are mapped
  // rather than malloc'ed (so heap statistics do not see them).
  static uint64_t MappedBytes() { return Mapped().load(std::memory_order_relaxed); }
  // Entries the last Insert moved from the retiring table.
  uint32_t last_moved() const { return last_moved_; }

 private:
  static constexpr uint64_t kEmpty = 0;
  static constexpr uint64_t kTombstone = ~uint64_t{0} >> 8;  // tag 0: never a live entry
  static constexpr uint64_t kReleaseBytes = 64 << 10;          // retiring-table memory handed back at once

  static constexpr uint64_t kHugeBytes = 2ull << 20;  // tables this large are mapped, in huge pages
  struct Free {
    uint64_t bytes;  // of a mapping; 0: calloc'ed (value-initialized by unique_ptr)
    void operator()(uint64_t* p) const {
      if (bytes) {
        ::munmap(p, bytes);
        Mapped().fetch_sub(bytes, std::memory_order_relaxed);
      } else {
        std::free(p);
      }
    }
  };
  static std::atomic<uint64_t>& Mapped() {
    static std::atomic<uint64_t> bytes{0};
    return bytes;
  }
  struct Table {
    std::unique_ptr<uint64_t[], Free> slots;
    uint64_t cap = 0;  // 0 or a power of two
    uint64_t live = 0;
  };

  static uint64_t Tag(uint64_t h) {
    const uint64_t t = h >> 56;
    return t == 0 ? 1 : t;
  }
  static uint64_t Entry(uint64_t h, Ref r) {
    return Tag(h) << 56 | uint64_t{r.handle} << 28 | r.slot;
  }
  static Ref RefOf(uint64_t v) {
    return Ref{static_cast<uint32_t>(v >> 28) & kMaxHandles, static_cast<uint32_t>(v) & (kMaxSlots - 1)};
  }
  static bool Live(uint64_t v) { return (v >> 56) != 0; }

  // The first bucket at or after h's home, in probe order, whose entry
  // `match`es; buckets below `from` (migrated: the retiring table's) are
  // skipped, and a probe that wraps back below it a second time misses.
  template <typename Match>
  static std::optional<uint64_t> ProbeIf(const Table& t, uint64_t from, uint64_t h, const Match& match) {
    if (t.cap == 0) return std::nullopt;
    const uint64_t mask = t.cap - 1;
    bool skipped = false;
    for (uint64_t i = h & mask;; i = (i + 1) & mask) {
      if (i < from) {
        if (skipped) return std::nullopt;
        skipped = true;
        i = from;
      }
      const uint64_t v = t.slots[i];
      if (v == kEmpty) return std::nullopt;
      if (match(v)) return i;
    }
  }
  template <typename KeyOf>
  static std::optional<uint64_t> Probe(const Table& t, uint64_t from, const BlockKey& key, uint64_t h,
                                       const KeyOf& key_of) {
    const uint64_t tag = Tag(h);
    return ProbeIf(t, from, h, [&](uint64_t v) { return (v >> 56) == tag && key_of(RefOf(v)) == key; });
  }
  static std::optional<uint64_t> ProbeExact(const Table& t, uint64_t from, uint64_t h, uint64_t want) {
    return ProbeIf(t, from, h, [want](uint64_t v) { return v == want; });
  }
  static void Place(Table* t, uint64_t h, uint64_t v) {
    const uint64_t mask = t->cap - 1;
    uint64_t i = h & mask;
    while (t->slots[i] != kEmpty) i = (i + 1) & mask;  // the current table holds no tombstones
    t->slots[i] = v;
    t->live++;
  }
  static Table Allocate(uint64_t cap) {
    Table t;
    const uint64_t bytes = cap * sizeof(uint64_t);
    if (bytes >= kHugeBytes) {  // a power of two, so a multiple of 2 MiB: map 2 MiB more and trim to alignment
      void* m = ::mmap(nullptr, bytes + kHugeBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (m == MAP_FAILED) std::abort();  // as operator new would throw: the store cannot index without memory
      const uintptr_t base = reinterpret_cast<uintptr_t>(m);
      const uintptr_t aligned = (base + kHugeBytes - 1) & ~(kHugeBytes - 1);
      if (aligned > base) ::munmap(m, aligned - base);
      if (aligned + bytes < base + bytes + kHugeBytes)
        ::munmap(reinterpret_cast<void*>(aligned + bytes), base + bytes + kHugeBytes - aligned - bytes);
      ::madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE);  // a hint: refused, it stays 4 KiB pages
      t.slots = std::unique_ptr<uint64_t[], Free>(reinterpret_cast<uint64_t*>(aligned), Free{bytes});
      Mapped().fetch_add(bytes, std::memory_order_relaxed);
    } else {
      t.slots.reset(static_cast<uint64_t*>(std::calloc(cap, sizeof(uint64_t))));
      if (!t.slots) std::abort();
    }
    t.cap = cap;
    return t;
  }
  void Grow() {
    old_ = std::move(cur_);
    cursor_ = 0;
    released_ = 0;
    cur_ = Allocate(old_.cap == 0 ? kMinCapacity : old_.cap * 2);
    if (old_.cap == 0) old_ = Table{};
  }
  template <typename KeyOf>
  void MigrateSome(const KeyOf& key_of) {
    for (uint32_t k = 0; k < kMigrateStep && old_.cap != 0; ++k) {
      const uint64_t v = old_.slots[cursor_];
      if (Live(v)) {
        Place(&cur_, Hash(key_of(RefOf(v))), v);
        old_.live--;
        last_moved_++;
      }
      if (++cursor_ == old_.cap || old_.live == 0) {
        old_ = Table{};
        break;
      }
    }
    if (old_.cap != 0) Release();
  }
  // Hands the pages of the migrated buckets back, kReleaseBytes at a time
  // (only whole pages inside the allocation: its heap neighbours are not
  // touched, and they read back as zeros).
  void Release() {
    const uintptr_t base = reinterpret_cast<uintptr_t>(old_.slots.get());
    const uintptr_t done = base + cursor_ * sizeof(uint64_t);
    const uintptr_t start = (base + released_ + kReleaseBytes - 1) & ~(kReleaseBytes - 1);
    if (done < start + kReleaseBytes) return;
    const uintptr_t end = done & ~(kReleaseBytes - 1);
    ::madvise(reinterpret_cast<void*>(start), end - start, MADV_DONTNEED);
    released_ = end - base;
  }
  template <typename KeyOf>
  void FinishMigration(const KeyOf& key_of) {
    while (old_.cap != 0) MigrateSome(key_of);
  }
  // Empties bucket `i` of the current table, moving later entries of its
  // cluster back where their probe sequence allows.
  template <typename KeyOf>
  void ShiftDelete(uint64_t i, const KeyOf& key_of) {
    const uint64_t mask = cur_.cap - 1;
    for (uint64_t j = (i + 1) & mask;; j = (j + 1) & mask) {
      const uint64_t v = cur_.slots[j];
      if (v == kEmpty) break;
      const uint64_t home = Hash(key_of(RefOf(v))) & mask;
      // v may fill the hole at i unless its home lies cyclically in (i, j].
      if (((j - home) & mask) >= ((j - i) & mask)) {
        cur_.slots[i] = v;
        i = j;
      }
    }
    cur_.slots[i] = kEmpty;
    cur_.live--;
  }

  Table cur_, old_;
  uint64_t cursor_ = 0;    // next bucket of old_ to migrate; those below are migrated
  uint64_t released_ = 0;  // bytes of old_ from its start whose pages were handed back
  uint32_t last_moved_ = 0;
};

}  // namespace flatkv
