// The media past the store's index (store/source.h), as their components
// register them where a store is composed: the store names none of them.
// Restores ask them in registration order for the blocks after what the
// ones before supplied.
#include <string>
#include <string_view>
#include <vector>

#include "common/mutex.h"
#include "store/source.h"

namespace flatkv {
namespace {

// The media that StoreOptions can configure, and where each one's code is:
// what Open says when options ask for a medium that no one registered.
struct OptionsMedium {
  const char* name;          // MediumDescriptor::name
  const char* option;        // the StoreOptions field that configures it
  const char* component;     // the CMake target to link
  const char* registration;  // the call that registers it
  bool (*configured)(const StoreOptions& o);
};

constexpr OptionsMedium kOptionsMedia[] = {
    {"remote", "StoreOptions::remote.seeds", "flatkv::remote (library flatkv_remote)",
     "flatkv::RegisterRemoteMedium() from flatkv/remote.h",
     [](const StoreOptions& o) { return !o.remote.seeds.empty() && !o.read_only; }},
};

class Registry {
 public:
  static Registry& Get() {
    static Registry* r = new Registry();  // never destroyed: stores may close during exit
    return *r;
  }
  void Add(const MediumDescriptor& m) {
    MutexLock lock(&mu_);
    for (const MediumDescriptor& r : media_)
      if (std::string_view(r.name) == m.name) return;
    media_.push_back(m);
  }
  std::vector<MediumDescriptor> media() const {
    MutexLock lock(&mu_);
    return media_;
  }
  std::vector<MediumDescriptor> Replace(std::vector<MediumDescriptor> media) {
    MutexLock lock(&mu_);
    media_.swap(media);
    return media;
  }

 private:
  mutable Mutex mu_;
  std::vector<MediumDescriptor> media_ FLATKV_GUARDED_BY(mu_);
};

}  // namespace

void RegisterMedium(const MediumDescriptor& medium) { Registry::Get().Add(medium); }

std::vector<MediumDescriptor> ReplaceMediaForTest(std::vector<MediumDescriptor> media) {
  return Registry::Get().Replace(std::move(media));
}

Result<std::vector<std::unique_ptr<StoreMedium>>> OpenMedia(const MediumContext& context) {
  const std::vector<MediumDescriptor> registered = Registry::Get().media();
  for (const OptionsMedium& m : kOptionsMedia) {
    if (!m.configured(context.options)) continue;
    bool found = false;
    for (const MediumDescriptor& r : registered) found = found || std::string_view(r.name) == m.name;
    if (!found)
      return Status::FailedPrecondition(std::string("the options configure the medium '") + m.name + "' (" +
                                        m.option + "), which is not registered in this program: link " +
                                        m.component + " and call " + m.registration + " before Store::Open");
  }
  std::vector<std::unique_ptr<StoreMedium>> media;
  for (const MediumDescriptor& r : registered) {
    FLATKV_ASSIGN_OR_RETURN(std::unique_ptr<StoreMedium> m, r.open(context));
    if (m) media.push_back(std::move(m));
  }
  return media;
}

}  // namespace flatkv
