#include "media/ssd_dir.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/log.h"

namespace flatkv {
namespace {

std::string SegmentPath(const std::string& dir, uint32_t segment) {
  char name[32];
  std::snprintf(name, sizeof(name), "/seg-%06u.dat", segment);
  return dir + name;
}

std::string SumsPath(const std::string& dir, uint32_t segment) {
  char name[32];
  std::snprintf(name, sizeof(name), "/sums-%06u.dat", segment);
  return dir + name;
}

}  // namespace

Result<std::unique_ptr<SsdDir>> SsdDir::Open(const SsdDirOptions& options, const persist::ManifestHeader& header,
                                             io::IoEngine* engine, persist::ManifestContents* contents) {
  if (!options.read_only) FLATKV_RETURN_IF_ERROR(io::EnsureWritableDir(options.path));
  FLATKV_ASSIGN_OR_RETURN(auto manifest,
                          persist::Manifest::Open(options.path, header, engine, contents, options.read_only));
  const persist::ManifestHeader& stored = contents->header;
  if (header.shape.layers != 0 && (!(stored.shape == header.shape) || stored.block_tokens != header.block_tokens))
    return Status::InvalidArgument(options.path + ": store holds {" + stored.shape.ToString() + " block_tokens=" +
                                   std::to_string(stored.block_tokens) + "} but was opened with {" +
                                   header.shape.ToString() + " block_tokens=" + std::to_string(header.block_tokens) + "}");
  ExtentGeometry g;
  g.layers = stored.shape.layers;
  g.block_layer_bytes = stored.shape.BytesPerTokenLayer() * stored.block_tokens;
  g.slot_stride = stored.slot_stride;
  g.extent_blocks = stored.extent_blocks;
  g.layer_stride = stored.layer_stride;
  g.extent_bytes = stored.extent_bytes;
  if (g.slot_stride < g.block_layer_bytes || g.slot_stride % 4096 != 0)
    return Status::Corruption(options.path + ": manifest slot_stride " + std::to_string(g.slot_stride) +
                              " does not fit blocks of " + std::to_string(g.block_layer_bytes) + " bytes per layer");
  if (options.capacity_bytes < g.extent_bytes)
    return Status::InvalidArgument(options.path + ": ssd_capacity_bytes=" + std::to_string(options.capacity_bytes) +
                                   " is smaller than one SSD extent (" + std::to_string(g.extent_bytes) + " bytes)");
  std::unique_ptr<SsdDir> d(new SsdDir(options, stored, g));
  d->manifest_ = std::move(manifest);
  d->tagged_sums_ = contents->version >= persist::kManifestVersionTagged;
  const uint64_t total_units = options.capacity_bytes / d->unit_bytes();
  d->units_ = RangeAllocator(total_units, d->units_per_segment());
  MutexLock lock(&d->mu_);
  d->segments_.resize((total_units + d->units_per_segment() - 1) / d->units_per_segment());
  d->sums_.resize(d->segments_.size());
  return d;
}

uint64_t SsdDir::SegmentFileBytes(uint32_t segment) const {
  const uint64_t first = uint64_t{segment} * units_per_segment();
  const uint64_t n = std::min(units_per_segment(), units_.capacity() - first);
  return n * unit_bytes();
}

Result<const io::File*> SsdDir::Segment(uint32_t segment, bool create) {
  MutexLock lock(&mu_);
  if (segment >= segments_.size())
    return Status::InvalidArgument(options_.path + ": segment " + std::to_string(segment) + " beyond capacity");
  if (segments_[segment]) return segments_[segment].get();
  const std::string path = SegmentPath(options_.path, segment);
  if (!create && !io::PathExists(path)) return Status::NotFound(path + ": segment file missing");
  if (options_.read_only && create) return Status::FailedPrecondition(options_.path + ": opened read-only");
  FLATKV_ASSIGN_OR_RETURN(io::File f, io::File::Open(path, create, options_.want_direct, options_.read_only));
  if (options_.want_direct && !f.direct()) {
    all_direct_ = false;
    if (!fallback_warned_) {
      LogWarning(options_.path + ": O_DIRECT refused by the filesystem; using buffered I/O (reads may come from the page cache)");
      fallback_warned_ = true;
    }
  }
  if (!options_.want_direct) all_direct_ = false;
  const uint64_t want = SegmentFileBytes(segment);
  if (create) {
    FLATKV_ASSIGN_OR_RETURN(uint64_t size, f.Size());
    if (size < want) FLATKV_RETURN_IF_ERROR(f.Preallocate(want));
  }
  segments_[segment] = std::make_unique<io::File>(std::move(f));
  return segments_[segment].get();
}

Result<std::pair<int, uint64_t>> SsdDir::Locate(uint64_t address_offset, bool create) {
  const uint32_t segment = static_cast<uint32_t>(address_offset / header_.segment_bytes);
  FLATKV_ASSIGN_OR_RETURN(const io::File* f, Segment(segment, create));
  return std::make_pair(f->fd(), address_offset % header_.segment_bytes);
}

Result<int> SsdDir::SumsFd(uint32_t segment) {
  MutexLock lock(&mu_);
  if (segment >= sums_.size())
    return Status::InvalidArgument(options_.path + ": segment " + std::to_string(segment) + " beyond capacity");
  if (sums_[segment]) return sums_[segment]->fd();
  if (options_.read_only && !io::PathExists(SumsPath(options_.path, segment)))
    return Status::FailedPrecondition(options_.path + ": opened read-only, and " + SumsPath(options_.path, segment) +
                                      " does not exist");
  FLATKV_ASSIGN_OR_RETURN(io::File f, io::File::Open(SumsPath(options_.path, segment), /*create=*/!options_.read_only,
                                                     /*want_direct=*/false, options_.read_only));
  sums_[segment] = std::make_unique<io::File>(std::move(f));
  return sums_[segment]->fd();
}

Status SsdDir::WriteSums(uint64_t unit, uint32_t first_block, std::span<const SumEntry> entries, bool sync) {
  const auto ref = RefOf(unit);
  FLATKV_ASSIGN_OR_RETURN(int fd, SumsFd(ref.segment));
  const uint64_t at = ref.slot * SumsRegionBytes() + uint64_t{first_block} * geometry_.layers * sizeof(SumEntry);
  const auto* p = reinterpret_cast<const char*>(entries.data());
  uint64_t done = 0, bytes = entries.size_bytes();
  while (done < bytes) {
    const ssize_t n = ::pwrite(fd, p + done, bytes - done, static_cast<off_t>(at + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      return Status::IoError(SumsPath(options_.path, ref.segment) + ": write of " + std::to_string(bytes) +
                             " bytes at offset " + std::to_string(at) + ": " + std::strerror(n < 0 ? errno : EIO));
    done += static_cast<uint64_t>(n);
  }
  if (sync && ::fdatasync(fd) != 0)
    return Status::IoError(SumsPath(options_.path, ref.segment) + ": fdatasync: " + std::strerror(errno));
  return Status::Ok();
}

Status SsdDir::ReadSums(uint64_t unit, uint32_t first_block, std::span<SumEntry> entries) {
  const auto ref = RefOf(unit);
  FLATKV_ASSIGN_OR_RETURN(int fd, SumsFd(ref.segment));
  const uint64_t at = ref.slot * SumsRegionBytes() + uint64_t{first_block} * geometry_.layers * sizeof(SumEntry);
  auto* p = reinterpret_cast<char*>(entries.data());
  uint64_t done = 0, bytes = entries.size_bytes();
  while (done < bytes) {
    const ssize_t n = ::pread(fd, p + done, bytes - done, static_cast<off_t>(at + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return Status::IoError(SumsPath(options_.path, ref.segment) + ": read of " + std::to_string(bytes) +
                             " bytes at offset " + std::to_string(at) + ": " + std::strerror(errno));
    if (n == 0) {  // past the end: never written
      std::memset(p + done, 0, bytes - done);
      break;
    }
    done += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

bool SsdDir::SegmentHolds(uint64_t unit, uint64_t n) {
  if (unit + n > units_.capacity()) return false;
  auto ref = RefOf(unit);
  auto f = Segment(ref.segment, /*create=*/false);
  if (!f.ok()) return false;
  auto size = f.value()->Size();
  return size.ok() && size.value() >= (uint64_t{ref.slot} + n) * unit_bytes();
}

bool SsdDir::all_direct() const {
  MutexLock lock(&mu_);
  return all_direct_;
}

std::vector<int> SsdDir::OpenFds() const {
  MutexLock lock(&mu_);
  std::vector<int> fds;
  for (const auto& s : segments_)
    if (s) fds.push_back(s->fd());
  return fds;
}

}  // namespace flatkv
