// The media past the store's index (store/source.h). Adding one: its files
// in a folder of its own, its options in flatkv/options.h, and its factory
// here. Restores ask them in this order for the blocks after what the ones
// before supplied.
#include "remote/remote_source.h"
#include "store/source.h"

namespace flatkv {
namespace {

constexpr MediumFactory kMedia[] = {
    &remote::RemoteStoreMedium::Open,  // StoreOptions::remote: a Redis Cluster (docs/remote.md)
};

}  // namespace

Result<std::vector<std::unique_ptr<StoreMedium>>> OpenMedia(const MediumContext& context) {
  std::vector<std::unique_ptr<StoreMedium>> media;
  for (MediumFactory open : kMedia) {
    FLATKV_ASSIGN_OR_RETURN(std::unique_ptr<StoreMedium> m, open(context));
    if (m) media.push_back(std::move(m));
  }
  return media;
}

}  // namespace flatkv
