// The remote tests' cluster: the seeds (host:port) of the local Redis
// Cluster that ctest's RedisCluster fixture started in
// FLATKV_REDIS_CLUSTER_DIR (scripts/redis-cluster.sh writes them to
// DIR/seeds); empty when none is running.
#pragma once

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace flatkv::remote::cluster_testing {

inline std::string ClusterDir() { return FLATKV_REDIS_CLUSTER_DIR; }

inline std::vector<std::string> LocalClusterSeeds() {
  std::ifstream in(ClusterDir() + "/seeds");
  std::string line;
  std::getline(in, line);
  std::vector<std::string> out;
  std::stringstream ss(line);
  for (std::string s; std::getline(ss, s, ',');) out.push_back(s);
  return out;
}

}  // namespace flatkv::remote::cluster_testing
