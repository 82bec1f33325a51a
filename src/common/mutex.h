// Mutex, MutexLock and CondVar: std::mutex and std::condition_variable with
// clang thread-safety annotations, so that members marked
// FLATKV_GUARDED_BY(mu_) are checked at compile time by -Wthread-safety
// (libstdc++'s std::mutex carries no annotations, so it cannot be checked).
// Under other compilers the annotations expand to nothing.
//
// Waits are written as explicit loops (`while (!cond) cv.Wait(&mu);`): the
// analysis cannot see that a predicate lambda runs with the lock held.
//
// Thread-safety: Mutex and CondVar are for use by many threads; a MutexLock
// belongs to the thread that made it.
#pragma once

#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define FLATKV_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define FLATKV_THREAD_ANNOTATION(x)
#endif

#define FLATKV_CAPABILITY(x) FLATKV_THREAD_ANNOTATION(capability(x))
#define FLATKV_SCOPED_CAPABILITY FLATKV_THREAD_ANNOTATION(scoped_lockable)
#define FLATKV_GUARDED_BY(x) FLATKV_THREAD_ANNOTATION(guarded_by(x))
#define FLATKV_REQUIRES(...) FLATKV_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define FLATKV_ACQUIRE(...) FLATKV_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define FLATKV_RELEASE(...) FLATKV_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define FLATKV_EXCLUDES(...) FLATKV_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))

namespace flatkv {

class FLATKV_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() FLATKV_ACQUIRE() { mu_.lock(); }
  void Unlock() FLATKV_RELEASE() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` for the lifetime of the object.
class FLATKV_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) FLATKV_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() FLATKV_RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

class CondVar {
 public:
  // Atomically releases `mu` and sleeps until signalled (or spuriously),
  // then reacquires `mu` before returning.
  void Wait(Mutex* mu) FLATKV_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // still held; ownership stays with the caller
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace flatkv
