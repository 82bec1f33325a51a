// Rendering of the daemon's metrics: exact values, tenant labels, the /stats
// bearer-token check.
#include "service/metrics.h"

#include <gtest/gtest.h>

namespace flatkv::service {
namespace {

bool Has(const std::string& text, const std::string& line) { return text.find(line) != std::string::npos; }

TEST(MetricsTest, ValuesAreExactAndTenantsAreIndexedUnlessNamed) {
  StoreStats store;
  store.ssd.capacity_bytes = (1ull << 40) + 3;  // past %.9g's precision
  ServerMetrics server;
  TenantMetrics a, b;
  b.put_bytes = 1073741825;
  const std::vector<TenantView> tenants = {{"team-a", &a, 0, 0, 0}, {"team.b", &b, 3ull << 30, 17, 0}};
  const std::string text = RenderPrometheus(store, server, tenants, false);
  EXPECT_TRUE(Has(text, "flatkv_capacity_bytes{medium=\"ssd\"} 1099511627779\n")) << text;
  EXPECT_TRUE(Has(text, "flatkv_tenant_bytes_total{tenant=\"1\",direction=\"put\"} 1073741825\n")) << text;
  EXPECT_TRUE(Has(text, "flatkv_tenant_quota_bytes{tenant=\"1\"} 3221225472\n")) << text;
  EXPECT_TRUE(Has(text, "flatkv_tenant_used_bytes{tenant=\"0\"} 0\n")) << text;
  EXPECT_TRUE(Has(text, "flatkv_tenant_dram_bytes{tenant=\"0\"} ")) << text;
  EXPECT_TRUE(Has(text, "flatkv_tenant_retained_bytes{tenant=\"0\"} 0\n")) << text;
  EXPECT_TRUE(Has(text, "flatkv_lookup_latency_seconds_bucket{tenant=\"0\",le=\"1e-05\"} 0\n")) << text;
  EXPECT_FALSE(Has(text, "team")) << text;
  const std::string named = RenderPrometheus(store, server, tenants, true);
  EXPECT_TRUE(Has(named, "flatkv_tenant_quota_bytes{tenant=\"team.b\"} 3221225472\n")) << named;
  EXPECT_EQ(PromLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

// The remote tier's series appear only with a remote tier.
TEST(MetricsTest, RemoteTierSeriesAppearWithARemoteTier) {
  StoreStats store;
  ServerMetrics server;
  EXPECT_FALSE(Has(RenderPrometheus(store, server, {}, false), "flatkv_remote_"));
  store.remote.enabled = true;
  store.remote.hit_blocks = 12;
  store.remote.publish_dropped_blocks = 5;
  store.remote.bytes_read = 4096;
  store.remote.publish_queued_bytes = 777;
  const std::string text = RenderPrometheus(store, server, {}, false);
  EXPECT_TRUE(Has(text, "flatkv_remote_events_total{event=\"hit_block\"} 12\n")) << text;
  EXPECT_TRUE(Has(text, "flatkv_remote_events_total{event=\"publish_dropped_block\"} 5\n")) << text;
  EXPECT_TRUE(Has(text, "flatkv_remote_bytes_total{direction=\"read\"} 4096\n")) << text;
  EXPECT_TRUE(Has(text, "flatkv_remote_publish_queue_bytes 777\n")) << text;
  EXPECT_NE(store.ToJson().find("\"remote\":{\"hit_blocks\":12,"), std::string::npos) << store.ToJson();
  EXPECT_NE(store.ToString().find("remote hit_blocks=12 "), std::string::npos) << store.ToString();
}

TEST(MetricsTest, BearerTokenMustMatchExactly) {
  const std::string t = "stats-token-0123456789";
  EXPECT_TRUE(HttpBearerMatches("GET /stats HTTP/1.0\r\nAuthorization: Bearer " + t + "\r\n\r\n", t));
  EXPECT_TRUE(HttpBearerMatches("GET /stats HTTP/1.0\nHost: x\nauthorization:   bearer " + t + "  \n\n", t));
  EXPECT_FALSE(HttpBearerMatches("GET /stats HTTP/1.0\r\nAuthorization: Bearer " + t + "x\r\n\r\n", t));
  EXPECT_FALSE(HttpBearerMatches("GET /stats HTTP/1.0\r\nAuthorization: Bearer\r\n\r\n", t));
  EXPECT_FALSE(HttpBearerMatches("GET /stats HTTP/1.0\r\nAuthorization: Basic " + t + "\r\n\r\n", t));
  EXPECT_FALSE(HttpBearerMatches("GET /stats HTTP/1.0\r\n\r\nAuthorization: Bearer " + t + "\r\n", t));  // a body
  EXPECT_FALSE(HttpBearerMatches("GET /stats HTTP/1.0\r\nAuthorization: Bearer \r\n\r\n", ""));
  EXPECT_FALSE(HttpBearerMatches("Authorization: Bearer " + t + "\r\n\r\n", t));  // that is the request line
}

}  // namespace
}  // namespace flatkv::service
