// CudaCopyBackend (gpu/copy_backend.h): device memory from cudaMalloc, one
// dedicated non-blocking stream for every copy, host memory pinned with
// cudaHostRegister so cudaMemcpyAsync from it is DMA, cudaEvents as the
// window's per-layer events, and a gather kernel for scatters into an
// engine's paged cache (one launch per layer, never one copy per page),
// and SSD reads straight into device memory by cuFile (GPUDirect Storage,
// or cuFile's compatibility mode where the nvidia-fs driver is not loaded),
// checked there by the checksum kernel, and int8 and kivi slices decoded
// in device memory from their encoded bytes. libcufile.so.0 is loaded at run
// time (dlopen, as RAPIDS kvikio does), so a machine without it still runs
// the backend, SSD hits then going through the pinned host window.
// Built only with -DFLATKV_CUDA=ON (docs/gpu.md).
#include <cuda_runtime.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "codec/codec_internal.h"
#include "gpu/copy_backend.h"
#include "gpu/cuda/cuda_util.h"
#include "gpu/cuda/kernels.h"
#include "store/dram_queue.h"

#if FLATKV_HAVE_CUFILE
#include <cufile.h>
#include <dlfcn.h>
#endif

namespace flatkv::gpu {
namespace {

#if FLATKV_HAVE_CUFILE
// The cuFile entry points flatkv uses, from libcufile.so.0 (PyPI's
// nvidia-cufile; cufile.h from the same wheel at build time).
struct CuFile {
  void* lib = nullptr;
  CUfileError_t (*DriverOpen)() = nullptr;
  CUfileError_t (*DriverClose)() = nullptr;
  CUfileError_t (*DriverGetProperties)(CUfileDrvProps_t*) = nullptr;
  CUfileError_t (*HandleRegister)(CUfileHandle_t*, CUfileDescr_t*) = nullptr;
  void (*HandleDeregister)(CUfileHandle_t) = nullptr;
  CUfileError_t (*BufRegister)(const void*, size_t, int) = nullptr;
  CUfileError_t (*BufDeregister)(const void*) = nullptr;
  ssize_t (*Read)(CUfileHandle_t, void*, size_t, off_t, off_t) = nullptr;

  static std::string Why(const CUfileError_t& e, const std::string& what) {
    std::string s = what + ": " + cufileop_status_error(e.err);
    if (IS_CUDA_ERR(e)) s += " (CUDA driver error " + std::to_string(static_cast<int>(e.cu_err)) + ")";
    return s;
  }
  // Loads the library and opens the driver; an error says why not.
  Status Open() {
    lib = ::dlopen("libcufile.so.0", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr)
      return Status::NotFound(std::string("cuFile: cannot load libcufile.so.0 (") + ::dlerror() +
                              "); it comes with PyPI's nvidia-cufile: scripts/install-deps.sh pyenv:torch, then put "
                              "its nvidia/cu13/lib on LD_LIBRARY_PATH");
    auto sym = [&](const char* name, auto** fn) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(::dlsym(lib, name));
      return *fn != nullptr;
    };
    if (!sym("cuFileDriverOpen", &DriverOpen) || !sym("cuFileDriverClose_v2", &DriverClose) ||
        !sym("cuFileDriverGetProperties", &DriverGetProperties) || !sym("cuFileHandleRegister", &HandleRegister) ||
        !sym("cuFileHandleDeregister", &HandleDeregister) || !sym("cuFileBufRegister", &BufRegister) ||
        !sym("cuFileBufDeregister", &BufDeregister) || !sym("cuFileRead", &Read)) {
      ::dlclose(lib);
      lib = nullptr;
      return Status::NotFound("cuFile: libcufile.so.0 lacks an entry point flatkv uses");
    }
    // With no cufile.json (PyPI's wheel ships none), compatibility mode is
    // allowed, the documented default ("allow_compat_mode": true), so a
    // machine without nvidia-fs still reads by cuFile; a cufile.json in
    // place (CUFILE_ENV_PATH_JSON or /etc/cufile.json) decides for itself.
    CUfileError_t (*set_bool)(CUFileBoolConfigParameter_t, bool) = nullptr;
    if (std::getenv("CUFILE_ENV_PATH_JSON") == nullptr && ::access("/etc/cufile.json", F_OK) != 0 &&
        sym("cuFileSetParameterBool", &set_bool))
      (void)set_bool(CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE, true);
    if (CUfileError_t e = DriverOpen(); e.err != CU_FILE_SUCCESS) {
      ::dlclose(lib);
      lib = nullptr;
      return Status::FailedPrecondition(Why(e, "cuFileDriverOpen"));
    }
    return Status::Ok();
  }
  void Close() {
    if (lib == nullptr) return;
    DriverClose();
    ::dlclose(lib);
    lib = nullptr;
  }

  // The process's cuFile: the driver is opened once and stays open
  // (cuFileDriverClose resets the library under every other user's reads,
  // and a descriptor registered twice is refused,
  // CU_FILE_HANDLE_ALREADY_REGISTERED); `path`
  // is read from its properties: GDS when the nvidia-fs driver answers
  // with a version (kvikio's DriverProperties::is_gds_available reads the
  // same), else its compatibility mode, never counted as GDS.
  static CuFile& Get() {
    static CuFile* process = [] {
      auto* c = new CuFile;  // never destroyed: reader threads may outlive static destruction
      if (Status s = c->Open(); !s.ok()) {
        c->why = s.ToString();
        return c;
      }
      CUfileDrvProps_t props{};
      if (CUfileError_t e = c->DriverGetProperties(&props); e.err != CU_FILE_SUCCESS) {
        c->why = Why(e, "cuFileDriverGetProperties");
        c->Close();
        return c;
      }
      c->path = (props.nvfs.major_version != 0 || props.nvfs.minor_version != 0) ? "gds" : "cufile-compat";
      return c;
    }();
    return *process;
  }
  std::string path;  // "gds", "cufile-compat", or "" (why)
  std::string why;

  // The handle of open file `fd`, registered the first time (or again when
  // the descriptor now names another file: checked by device and inode);
  // *added when this call registered it.
  Result<CUfileHandle_t> Register(int fd, bool* added) {
    *added = false;
    struct stat st;
    if (::fstat(fd, &st) != 0) return Status::FromErrno(errno, "cuFile: fstat of fd " + std::to_string(fd));
    std::lock_guard<std::mutex> lock(mu);
    auto it = files.find(fd);
    if (it != files.end() && it->second.dev == st.st_dev && it->second.ino == st.st_ino) return it->second.handle;
    if (it != files.end()) {
      HandleDeregister(it->second.handle);
      files.erase(it);
    }
    CUfileDescr_t descr{};
    descr.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
    descr.handle.fd = fd;
    CUfileHandle_t handle;
    if (CUfileError_t e = HandleRegister(&handle, &descr); e.err != CU_FILE_SUCCESS)
      return Status::FailedPrecondition(Why(e, "cuFileHandleRegister of fd " + std::to_string(fd)));
    files[fd] = File{handle, st.st_dev, st.st_ino};
    *added = true;
    return handle;
  }
  // The handle Register gave `fd`, if any.
  bool Find(int fd, CUfileHandle_t* handle) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = files.find(fd);
    if (it == files.end()) return false;
    *handle = it->second.handle;
    return true;
  }

 private:
  struct File {
    CUfileHandle_t handle;
    dev_t dev;
    ino_t ino;
  };
  std::mutex mu;
  std::map<int, File> files;
};
#endif

// A launch's page table, passed by value (kernel parameters hold up to
// 32 KiB since CUDA 12.1), so a scatter needs no allocation and no sync.
constexpr uint32_t kPagesPerLaunch = 1024;
struct PageTable {
  PageCopy page[kPagesPerLaunch];
};

// One thread block per page; 16-byte words where both ends allow.
__global__ void GatherPages(const std::byte* slot, const PageTable table, uint32_t n) {
  const uint32_t p = blockIdx.x;
  if (p >= n) return;
  const PageCopy pc = table.page[p];
  const std::byte* src = slot + pc.src;
  std::byte* dst = pc.dst;
  const bool wide = (reinterpret_cast<uintptr_t>(src) % 16 == 0) && (reinterpret_cast<uintptr_t>(dst) % 16 == 0);
  uint64_t i = 0;
  if (wide) {
    const uint64_t words = pc.bytes / 16;
    for (uint64_t w = threadIdx.x; w < words; w += blockDim.x)
      reinterpret_cast<uint4*>(dst)[w] = reinterpret_cast<const uint4*>(src)[w];
    i = words * 16;
  }
  for (uint64_t b = i + threadIdx.x; b < pc.bytes; b += blockDim.x) dst[b] = src[b];
}

class CudaCopyBackend final : public CopyBackend {
 public:
  static Result<std::unique_ptr<CopyBackend>> Open(int device) {
    int count = 0;
    FLATKV_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
    if (device < 0 || device >= count)
      return Status::InvalidArgument("copy backend 'cuda': device " + std::to_string(device) + " of " +
                                     std::to_string(count));
    FLATKV_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
    std::unique_ptr<CudaCopyBackend> b(new CudaCopyBackend(device));
    FLATKV_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&b->stream_, cudaStreamNonBlocking), "cudaStreamCreate"));
    b->OpenFileReads();
    return std::unique_ptr<CopyBackend>(std::move(b));
  }
  ~CudaCopyBackend() override {
    readers_.reset();  // the reads queued run, then the threads join
    cudaSetDevice(device_);
    for (Checker& c : checkers_) {
      cudaStreamDestroy(c.stream);
      cudaFree(c.device);
      cudaFreeHost(c.host);
      cudaFree(c.staging);
    }
#if FLATKV_HAVE_CUFILE
    for (auto& [p, bytes] : buffers_) cufile_->BufDeregister(p);
#endif
    if (stream_) cudaStreamSynchronize(stream_);
    for (auto& [p, raw] : allocations_) cudaFree(raw);  // those never freed
    for (auto& [id, ev] : events_) cudaEventDestroy(ev.event);
    for (auto& [p, bytes] : registered_) cudaHostUnregister(const_cast<std::byte*>(p));
    if (stream_) cudaStreamDestroy(stream_);
  }
  std::string name() const override { return "cuda"; }

  // cudaMalloc aligns to 256 bytes only (small allocations share 2 MiB
  // pages), so each is padded and its first 4 KiB boundary handed out.
  std::byte* AllocateDevice(uint64_t bytes) override {
    cudaSetDevice(device_);
    void* raw = nullptr;
    if (cudaMalloc(&raw, bytes + kDeviceAlign) != cudaSuccess) return nullptr;
    auto* p = reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(raw) + kDeviceAlign - 1) / kDeviceAlign * kDeviceAlign);
    [[maybe_unused]] bool registered = false;
#if FLATKV_HAVE_CUFILE
    // Registered with cuFile, a read lands by DMA from the SSD (GDS) without
    // cuFile's own bounce buffers; where it cannot be (BAR1 space), reads
    // still work through them. Outside the lock: copies queue meanwhile.
    registered = !path_.empty() && bytes >= kRegisterMin && cufile_->BufRegister(p, bytes, 0).err == CU_FILE_SUCCESS;
#endif
    std::lock_guard<std::mutex> lock(mu_);
    allocations_[p] = raw;
#if FLATKV_HAVE_CUFILE
    if (registered) buffers_[p] = bytes;
#endif
    return p;
  }
  void FreeDevice(std::byte* p) override {
    cudaSetDevice(device_);
    void* raw = nullptr;
    [[maybe_unused]] bool registered = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = allocations_.find(p);
      if (it == allocations_.end()) return;  // not ours (or freed already)
      raw = it->second;
      allocations_.erase(it);
#if FLATKV_HAVE_CUFILE
      registered = buffers_.erase(p) > 0;
#endif
    }
#if FLATKV_HAVE_CUFILE
    if (registered) cufile_->BufDeregister(p);
#endif
    cudaFree(raw);
  }
  Status RegisterHost(const std::byte* p, uint64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (registered_.count(p)) return Status::Ok();
    cudaSetDevice(device_);
    const cudaError_t e = cudaHostRegister(const_cast<std::byte*>(p), bytes, cudaHostRegisterPortable);
    if (e == cudaErrorHostMemoryAlreadyRegistered) {  // inside a range pinned before: already DMA
      (void)cudaGetLastError();
      return Status::Ok();
    }
    FLATKV_RETURN_IF_ERROR(CudaStatus(e, "cudaHostRegister of " + std::to_string(bytes) + " bytes"));
    registered_[p] = bytes;
    stats_.registered_bytes += bytes;
    return Status::Ok();
  }
  void UnregisterHost(const std::byte* p) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = registered_.find(p);
    if (it == registered_.end()) return;
    cudaSetDevice(device_);
    cudaHostUnregister(const_cast<std::byte*>(p));
    stats_.registered_bytes -= it->second;
    registered_.erase(it);
  }

  Status EnqueueCopy(std::byte* dst, const std::byte* src, uint64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    cudaSetDevice(device_);
    Status s = CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
    if (!s.ok()) {
      stats_.failed_ops++;
      return s;
    }
    stats_.h2d_bytes += bytes;
    stats_.h2d_copies++;
    return s;
  }
  Status EnqueueScatter(const std::byte* slot, std::span<const PageCopy> pages) override {
    if (pages.empty()) return Status::Ok();
    std::lock_guard<std::mutex> lock(mu_);
    cudaSetDevice(device_);
    for (size_t at = 0; at < pages.size(); at += kPagesPerLaunch) {
      const uint32_t n = static_cast<uint32_t>(std::min<size_t>(kPagesPerLaunch, pages.size() - at));
      PageTable table;
      std::copy(pages.begin() + at, pages.begin() + at + n, table.page);
      GatherPages<<<n, 256, 0, stream_>>>(slot, table, n);
      FLATKV_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "GatherPages launch"));
    }
    stats_.scatter_pages += pages.size();
    return Status::Ok();
  }
  uint64_t Record() override {
    std::lock_guard<std::mutex> lock(mu_);
    cudaSetDevice(device_);
    if (events_.size() >= kMaxEvents)  // retire the events that have passed and nobody waits on
      for (auto it = events_.begin(); it != events_.end();)
        if (it->second.waiters == 0 && cudaEventQuery(it->second.event) == cudaSuccess) {
          cudaEventDestroy(it->second.event);
          it = events_.erase(it);
        } else {
          ++it;
        }
    cudaEvent_t ev;
    if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) return 0;
    cudaEventRecord(ev, stream_);
    const uint64_t id = ++next_event_;
    events_[id] = Event{ev, 0};
    return id;
  }
  // A waited event is retired by its last waiter (a GpuWindow records and
  // waits one per copy): waiters keep Record from destroying it under them.
  Status Wait(uint64_t event) override {
    cudaEvent_t ev;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = events_.find(event);
      if (it == events_.end()) return event == 0 ? Status::IoError("copy backend 'cuda': no event (cudaEventCreate failed)")
                                                 : Status::Ok();  // waited for and retired already
      ev = it->second.event;
      it->second.waiters++;
    }
    cudaSetDevice(device_);
    Status s = CudaStatus(cudaEventSynchronize(ev), "cudaEventSynchronize");
    std::lock_guard<std::mutex> lock(mu_);
    auto it = events_.find(event);
    if (--it->second.waiters == 0 && s.ok()) {
      cudaEventDestroy(ev);
      events_.erase(it);
    }
    return s;
  }
  bool Done(uint64_t event) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = events_.find(event);
    if (it == events_.end()) return true;
    return cudaEventQuery(it->second.event) != cudaErrorNotReady;
  }
  Status CopyToHost(std::byte* dst, const std::byte* src, uint64_t bytes) override {
    cudaSetDevice(device_);
    std::lock_guard<std::mutex> lock(mu_);
    FLATKV_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync D2H"));
    return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  CopyBackendStats Stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  std::string file_read_path() const override { return path_; }
  std::string no_file_reads_why() const override { return why_; }

  Status RegisterFile(int fd) override {
#if FLATKV_HAVE_CUFILE
    if (path_.empty()) return Status::FailedPrecondition("copy backend 'cuda': no file reads: " + why_);
    bool added = false;
    FLATKV_RETURN_IF_ERROR(cufile_->Register(fd, &added).status());
    std::lock_guard<std::mutex> lock(mu_);
    if (added) stats_.registered_files++;
    return Status::Ok();
#else
    return Status::FailedPrecondition("copy backend 'cuda': no file reads: " + why_);
#endif
  }

  void SubmitRead(int fd, uint64_t offset, std::byte* dst, uint64_t bytes, std::function<void(Status)> done) override {
#if FLATKV_HAVE_CUFILE
    CUfileHandle_t handle;
    const std::byte* base = dst;
    const bool known = !path_.empty() && cufile_->Find(fd, &handle);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!known) {
        stats_.failed_file_reads++;
        return done(Status::FailedPrecondition("copy backend 'cuda': a read of fd " + std::to_string(fd) +
                                               ", not registered (RegisterFile)"));
      }
      // A registered buffer is named by its base and an offset (cuFileRead's contract).
      if (auto b = buffers_.upper_bound(dst); b != buffers_.begin()) {
        --b;  // the registered buffer starting at or before dst, if dst is inside it
        if (dst < b->first + b->second) base = b->first;
      }
      if (!readers_) readers_ = std::make_unique<DramQueue>(kReaders);
    }
    readers_->Submit([this, handle, offset, dst, base, bytes, done = std::move(done)] {
      cudaSetDevice(device_);
      const Status s = ReadAll(handle, offset, dst, base, bytes);
      {
        std::lock_guard<std::mutex> lock(mu_);
        CountFileRead(stats_, s.ok(), bytes);
      }
      done(std::move(s));
    });
#else
    done(Status::FailedPrecondition("copy backend 'cuda': no file reads: " + why_));
#endif
  }

  Status Checksums(const std::byte* slices, uint32_t n, uint64_t bytes, uint64_t* out) override {
    if (n == 0) return Status::Ok();
    Checker c = TakeChecker();
    const Status s = RunChecksums(c, slices, n, bytes, out);
    GiveChecker(c);
    return s;
  }

  bool DecodesCodec(const Codec& codec, const SliceLayout& layout) const override {
    const DType dt = layout.shape.dtype;
    return (codec.id() == 1 || codec.id() == 2) && (dt == DType::kF32 || dt == DType::kF16 || dt == DType::kBF16);
  }
  Status DecodeSlices(const SliceLayout& layout, std::span<const std::span<const std::byte>> slices,
                      std::span<std::byte* const> dst) override {
    if (slices.empty()) return Status::Ok();
    Checker c = TakeChecker();
    const Status s = RunDecodes(c, layout, slices, dst);
    GiveChecker(c);
    std::lock_guard<std::mutex> lock(mu_);
    if (s.ok()) {
      stats_.decoded_slices += slices.size();
      stats_.decode_in_bytes += uint64_t(slices.back().data() + slices.back().size() - slices.front().data());
    } else {
      stats_.failed_ops++;
    }
    return s;
  }

 private:
  static constexpr size_t kMaxEvents = 4096;
  // Reader threads: synchronous cuFileReads in flight at once (the
  // restore keeps up to ssd_layers_in_flight layers' requests queued).
  [[maybe_unused]] static constexpr uint32_t kReaders = 8;  // unused without cuFile
  [[maybe_unused]] static constexpr uint64_t kRegisterMin = 1ull << 20;  // cuFile registers device buffers from this size
  static constexpr uint64_t kDeviceAlign = 4096;        // AllocateDevice hands out 4 KiB boundaries
  explicit CudaCopyBackend(int device) : device_(device) {}

  struct Checker;
  Checker TakeChecker() {
    cudaSetDevice(device_);
    std::lock_guard<std::mutex> lock(mu_);
    if (checkers_.empty()) return Checker{};
    Checker c = checkers_.back();
    checkers_.pop_back();
    return c;
  }
  void GiveChecker(const Checker& c) {
    if (c.stream == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    checkers_.push_back(c);
  }
  // One DecodeSlices call on `c`'s stream: the slices' bytes carried over in
  // one copy into its staging (grown as needed), then one decode each.
  static Status RunDecodes(Checker& c, const SliceLayout& layout, std::span<const std::span<const std::byte>> slices,
                           std::span<std::byte* const> dst) {
    if (c.stream == nullptr)
      FLATKV_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking), "cudaStreamCreate"));
    const std::byte* first = slices.front().data();
    const uint64_t bytes = uint64_t(slices.back().data() + slices.back().size() - first);
    if (c.staging_capacity < bytes) {
      cudaFree(c.staging);
      c.staging = nullptr;
      c.staging_capacity = 0;
      FLATKV_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&c.staging, bytes), "cudaMalloc of decode staging"));
      c.staging_capacity = bytes;
    }
    FLATKV_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(c.staging, first, bytes, cudaMemcpyHostToDevice, c.stream), "cudaMemcpyAsync of encoded slices"));
    for (size_t j = 0; j < slices.size(); ++j) {
      const std::byte* on_device = c.staging + (slices[j].data() - first);
      FLATKV_ASSIGN_OR_RETURN(codec::SliceHeader h, codec::ParseHeader(slices[j]));
      if (h.codec_id == 1) FLATKV_RETURN_IF_ERROR(LaunchInt8Decode(c.stream, layout, slices[j], on_device, dst[j]));
      else if (h.codec_id == 2) FLATKV_RETURN_IF_ERROR(LaunchKiviDecode(c.stream, layout, slices[j], on_device, dst[j]));
      else return Status::InvalidArgument("copy backend 'cuda': no decoder for codec id " + std::to_string(h.codec_id));
    }
    return CudaStatus(cudaStreamSynchronize(c.stream), "cudaStreamSynchronize (decodes)");
  }
  // One Checksums call on `c`'s stream, growing its buffers to n sums.
  static Status RunChecksums(Checker& c, const std::byte* slices, uint32_t n, uint64_t bytes, uint64_t* out) {
    if (c.stream == nullptr)
      FLATKV_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking), "cudaStreamCreate"));
    if (c.capacity < n) {  // grown to the largest run's blocks
      cudaFree(c.device);
      cudaFreeHost(c.host);
      c.device = nullptr;
      c.host = nullptr;
      c.capacity = 0;
      FLATKV_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&c.device, n * sizeof(uint64_t)), "cudaMalloc of checksums"));
      FLATKV_RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&c.host, n * sizeof(uint64_t)), "cudaMallocHost of checksums"));
      c.capacity = n;
    }
    FLATKV_RETURN_IF_ERROR(LaunchBlockChecksums(c.stream, slices, n, bytes, bytes, c.device));
    FLATKV_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(c.host, c.device, n * sizeof(uint64_t), cudaMemcpyDeviceToHost, c.stream), "cudaMemcpyAsync of checksums"));
    FLATKV_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(c.stream), "cudaStreamSynchronize (checksums)"));
    std::copy(c.host, c.host + n, out);
    return Status::Ok();
  }
#if FLATKV_HAVE_CUFILE
  // cuFileRead until `bytes` have landed at `dst` (within the buffer at `base`).
  Status ReadAll(CUfileHandle_t handle, uint64_t offset, std::byte* dst, const std::byte* base, uint64_t bytes) {
    for (uint64_t got = 0; got < bytes;) {
      const ssize_t n = cufile_->Read(handle, const_cast<std::byte*>(base), bytes - got, static_cast<off_t>(offset + got),
                                     static_cast<off_t>(dst - base + got));
      if (n == 0) return Status::IoError("cuFileRead: end of file at offset " + std::to_string(offset + got));
      if (n == -1) return Status::FromErrno(errno, "cuFileRead at offset " + std::to_string(offset + got));
      if (n < 0) return Status::IoError("cuFileRead at offset " + std::to_string(offset + got) + ": " + CUFILE_ERRSTR(n));
      got += static_cast<uint64_t>(n);
    }
    return Status::Ok();
  }
#endif

  // The process's cuFile (CuFile::Get), and its path.
  void OpenFileReads() {
#if FLATKV_HAVE_CUFILE
    cufile_ = &CuFile::Get();
    path_ = cufile_->path;
    why_ = cufile_->why;
#else
    why_ = "flatkv was built without cufile.h (scripts/install-deps.sh pyenv:torch, then reconfigure with -DFLATKV_CUDA=ON)";
#endif
  }

  int device_;
  cudaStream_t stream_ = nullptr;
  mutable std::mutex mu_;
  struct Event {
    cudaEvent_t event;
    int waiters;  // threads in Wait on it
  };
  std::map<uint64_t, Event> events_;
  uint64_t next_event_ = 0;
  std::map<const std::byte*, uint64_t> registered_;
  std::map<const std::byte*, void*> allocations_;  // aligned pointer handed out -> cudaMalloc's
  CopyBackendStats stats_;
  // File reads.
  std::string path_;  // "gds", "cufile-compat", or "" (none: why_)
  std::string why_;
  // A stream and buffers for one Checksums or DecodeSlices call at a time; reused.
  struct Checker {
    cudaStream_t stream = nullptr;
    uint64_t* device = nullptr;
    uint64_t* host = nullptr;
    uint32_t capacity = 0;
    std::byte* staging = nullptr;  // encoded slices, in device memory
    uint64_t staging_capacity = 0;
  };
  std::vector<Checker> checkers_;
  std::unique_ptr<DramQueue> readers_;  // made at the first read (under mu_)
#if FLATKV_HAVE_CUFILE
  CuFile* cufile_ = nullptr;  // the process's
  std::map<const std::byte*, uint64_t> buffers_;  // device buffers registered with cuFile
#endif
};

}  // namespace

Result<std::unique_ptr<CopyBackend>> MakeCudaCopyBackend(int device) { return CudaCopyBackend::Open(device); }

}  // namespace flatkv::gpu
