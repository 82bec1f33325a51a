#include "store/local_sources.h"

#include <cstring>

#include "common/stream_copy.h"
#include "store/store_impl.h"

namespace flatkv {

bool DramSource::Holds(const Extent& e, uint32_t slot, uint64_t* base) const {
  if (e.medium == Medium::kDram) {
    *base = e.base;
    return true;
  }
  if (e.has_copy && e.in_copy(slot)) {
    *base = e.copy_base;  // a copy has its home's layout
    return true;
  }
  return false;
}

Result<RunOrigin> DramSource::Origin(const Extent& e, uint64_t base, uint64_t first) const {
  return RunOrigin{0, -1, base + first};
}

bool DramSource::verifies() const { return store_->options().verify_dram_reads; }

const std::byte* DramSource::Map(uint64_t src) const { return store_->dram()->At(src); }

MediumCounters* DramSource::counters() const { return &store_->counters().dram; }

void DramSource::Read(ReadRequest req, ReadDone done) {
  const std::byte* from = store_->dram()->At(req.src);
  DramQueue* q = store_->dram_queue();
  q->Submit([from, req = std::move(req), done = std::move(done)]() mutable {
    // Copy maximal contiguous stretches (one memcpy, or one device copy,
    // for the usual case; block by block where slots are padded, as in a
    // copy of an SSD extent).
    const std::vector<const std::byte*>& where = req.where;
    const uint32_t n = static_cast<uint32_t>(where.size());
    Status status;
    for (uint32_t j = 0; j < n && status.ok();) {
      uint32_t k = j + 1;
      while (req.stride == req.block_bytes && k < n && where[k] == where[j] + uint64_t{k - j} * req.block_bytes) ++k;
      std::byte* to = const_cast<std::byte*>(where[j]);
      const uint64_t len = uint64_t{k - j} * req.block_bytes;
      if (req.device) status = req.device->Copy(to, from + uint64_t{j} * req.stride, len);
      else StreamCopy(to, from + uint64_t{j} * req.stride, len);
      j = k;
    }
    done(std::move(status), std::move(req.where));
  });
  counters()->NoteDepth(q->outstanding());
}

bool SsdSource::Holds(const Extent& e, uint32_t slot, uint64_t* base) const {
  // Never read unwritten SSD bytes: a block whose write is in flight is
  // served by the DRAM copy that its put pins.
  if (e.medium != Medium::kSsd || e.durable(slot) != kDurable) return false;
  *base = e.base;
  return true;
}

Result<RunOrigin> SsdSource::Origin(const Extent& e, uint64_t base, uint64_t first) const {
  FLATKV_ASSIGN_OR_RETURN(auto loc, store_->ssd(e.device)->Locate(e.base, /*create=*/false));
  return RunOrigin{e.device, loc.first, loc.second + first};
}

MediumCounters* SsdSource::counters() const { return &store_->counters().ssd; }

void SsdSource::Read(ReadRequest req, ReadDone done) {
  std::byte* into = const_cast<std::byte*>(req.where[0]);
  const uint64_t len = req.where.size() * req.stride, src = req.src;
  const int fd = req.fd;
  if (req.device) {  // straight into device memory, by the landing's own file reads (cuFile)
    DeviceLanding* device = req.device;
    device->ReadFile(fd, src, into, len, [src, where = std::move(req.where), done = std::move(done)](Status s) mutable {
      done(s.WithContext("read into device memory at offset " + std::to_string(src)), std::move(where));
    });
    return;
  }
  store_->engine()->Submit({io::Op::kRead, fd, src, into, len,
                            [src, where = std::move(req.where), done = std::move(done)](Status s) mutable {
                              done(s.WithContext("read at offset " + std::to_string(src)), std::move(where));
                            }});
  counters()->NoteDepth(store_->engine()->outstanding());
}

void SsdSource::ReadBytes(int fd, uint64_t src, std::byte* into, uint64_t len, std::function<void(Status)> done) {
  store_->engine()->Submit({io::Op::kRead, fd, src, into, len, std::move(done)});
  counters()->NoteDepth(store_->engine()->outstanding());
}

}  // namespace flatkv
