// KeyArena: where extents keep their blocks' keys, in transparent huge
// pages (docs/architecture.md, "The index").
//
// The index holds no key: a lookup's second dependent load is the key in
// its extent's slot. At 10M blocks the keys are 160 MB; in 4 KiB pages
// nearly every such load also misses the TLB, and on a VM (nested paging)
// a TLB miss walks both the guest's and the host's page tables. So key
// arrays of kMinBytes and more are carved from 2 MiB chunks mapped with
// MADV_HUGEPAGE, one power-of-two size class per array (a vector grows by
// doubling, so the rounding costs little), each class with a free list;
// arrays above a chunk get a mapping of their own. Smaller arrays (short
// extents) come from malloc. Chunks are never unmapped, only recycled:
// memory handed back to the host costs a fault to touch again
// (../shared/MACHINE.md). Heap statistics see none of it: UsedBytes()
// counts the arrays handed out (their size classes), as a heap's in-use
// figure would, MappedBytes() the chunks.
//
// Thread-safe: one mutex, taken per allocation and free (extents' key
// arrays are allocated when an extent is created or grows).
#pragma once

#include <sys/mman.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

#include "common/mutex.h"

namespace flatkv {

class KeyArena {
 public:
  static constexpr size_t kMinBytes = 4096;         // below: malloc
  static constexpr size_t kChunkBytes = 2u << 20;   // a huge page
  static constexpr int kClasses = 10;               // 4 KiB .. 2 MiB

  static void* Allocate(size_t bytes) {
    if (bytes < kMinBytes) {
      void* p = std::malloc(bytes ? bytes : 1);
      if (!p) throw std::bad_alloc();
      return p;
    }
    if (bytes > kChunkBytes) {
      const size_t n = (bytes + kChunkBytes - 1) & ~(kChunkBytes - 1);
      Used().fetch_add(n, std::memory_order_relaxed);
      return Map(n);
    }
    Used().fetch_add(kMinBytes << ClassOf(bytes), std::memory_order_relaxed);
    return Get().Take(ClassOf(bytes));
  }
  static void Free(void* p, size_t bytes) {
    if (!p) return;
    if (bytes < kMinBytes) {
      std::free(p);
    } else if (bytes > kChunkBytes) {
      const size_t n = (bytes + kChunkBytes - 1) & ~(kChunkBytes - 1);
      ::munmap(p, n);
      Mapped().fetch_sub(n, std::memory_order_relaxed);
      Used().fetch_sub(n, std::memory_order_relaxed);
    } else {
      Used().fetch_sub(kMinBytes << ClassOf(bytes), std::memory_order_relaxed);
      Get().Give(ClassOf(bytes), p);
    }
  }
  // Bytes mapped for key arrays (free ones included).
  static uint64_t MappedBytes() { return Mapped().load(std::memory_order_relaxed); }
  // Bytes of the key arrays in use (of kMinBytes and more: malloc holds the rest).
  static uint64_t UsedBytes() { return Used().load(std::memory_order_relaxed); }

 private:
  struct FreeNode {
    FreeNode* next;
  };
  static int ClassOf(size_t bytes) {
    int c = 0;
    while ((kMinBytes << c) < bytes) ++c;
    return c;
  }
  static std::atomic<uint64_t>& Mapped() {
    static std::atomic<uint64_t> bytes{0};
    return bytes;
  }
  static std::atomic<uint64_t>& Used() {
    static std::atomic<uint64_t> bytes{0};
    return bytes;
  }
  static KeyArena& Get() {
    static KeyArena* arena = new KeyArena;  // never destroyed: arrays may be freed during static destruction
    return *arena;
  }
  // A 2 MiB-aligned mapping of `bytes` (a multiple of 2 MiB) in huge pages.
  static void* Map(size_t bytes) {
    void* m = ::mmap(nullptr, bytes + kChunkBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    const uintptr_t base = reinterpret_cast<uintptr_t>(m);
    const uintptr_t aligned = (base + kChunkBytes - 1) & ~uintptr_t{kChunkBytes - 1};
    if (aligned > base) ::munmap(m, aligned - base);
    const uintptr_t end = base + bytes + kChunkBytes;
    if (aligned + bytes < end) ::munmap(reinterpret_cast<void*>(aligned + bytes), end - aligned - bytes);
    ::madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE);  // a hint: refused, 4 KiB pages
    Mapped().fetch_add(bytes, std::memory_order_relaxed);
    return reinterpret_cast<void*>(aligned);
  }
  void* Take(int c) {
    MutexLock lock(&mu_);
    if (!free_[c]) {  // a fresh chunk, cut into arrays of this class
      auto* chunk = static_cast<char*>(Map(kChunkBytes));
      const size_t size = kMinBytes << c;
      for (size_t off = kChunkBytes; off >= size; off -= size) {
        auto* n = reinterpret_cast<FreeNode*>(chunk + off - size);
        n->next = free_[c];
        free_[c] = n;
      }
    }
    FreeNode* n = free_[c];
    free_[c] = n->next;
    return n;
  }
  void Give(int c, void* p) {
    MutexLock lock(&mu_);
    auto* n = static_cast<FreeNode*>(p);
    n->next = free_[c];
    free_[c] = n;
  }

  Mutex mu_;
  FreeNode* free_[kClasses + 1] FLATKV_GUARDED_BY(mu_) = {};
};

// A std allocator over KeyArena (Extent::keys).
template <typename T>
struct KeyArenaAllocator {
  using value_type = T;
  KeyArenaAllocator() = default;
  template <typename U>
  KeyArenaAllocator(const KeyArenaAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(KeyArena::Allocate(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { KeyArena::Free(p, n * sizeof(T)); }
  template <typename U>
  bool operator==(const KeyArenaAllocator<U>&) const { return true; }
};

}  // namespace flatkv
