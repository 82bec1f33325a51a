// The remote tests' clusters, which ctest's RedisCluster fixture starts
// (scripts/redis-cluster.sh writes each one's seeds, host:port,..., to
// DIR/seeds): a plain one in FLATKV_REDIS_CLUSTER_DIR and a TLS-only one
// in FLATKV_REDIS_CLUSTER_DIR-tls, whose CA is DIR-tls/tls/ca.crt. Seeds are
// empty when that cluster is not running.
#pragma once

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace flatkv::remote::cluster_testing {

inline std::string ClusterDir() { return FLATKV_REDIS_CLUSTER_DIR; }
inline std::string TlsClusterDir() { return ClusterDir() + "-tls"; }
inline std::string TlsClusterCa() { return TlsClusterDir() + "/tls/ca.crt"; }

inline std::vector<std::string> LocalClusterSeeds(const std::string& dir = ClusterDir()) {
  std::ifstream in(dir + "/seeds");
  std::string line;
  std::getline(in, line);
  std::vector<std::string> out;
  std::stringstream ss(line);
  for (std::string s; std::getline(ss, s, ',');) out.push_back(s);
  return out;
}

}  // namespace flatkv::remote::cluster_testing
