// Wire protocol v1: round trips of every message and rejection of what a
// reader must not accept.
#include "service/wire.h"

#include <gtest/gtest.h>

#include <cstring>

#include "flatkv/placement.h"
#include "testing/test_util.h"

namespace flatkv::service::wire {
namespace {

std::span<const std::byte> Payload(const std::vector<std::byte>& frame) { return std::span(frame).subspan(kHeaderBytes); }

TEST(WireTest, HeaderRoundTripAndRejections) {
  auto f = EncodeEmpty(Type::kPing, 77);
  ASSERT_EQ(f.size(), kHeaderBytes);
  auto h = ParseHeader(f, 1024);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->type, Type::kPing);
  EXPECT_EQ(h->request_id, 77u);
  EXPECT_EQ(h->payload_bytes, 0u);
  auto bad = f;
  bad[0] = std::byte{'G'};
  EXPECT_NE(ParseHeader(bad, 1024).status().message().find("bad magic"), std::string::npos);
  bad = f;
  bad[4] = std::byte{2};
  EXPECT_EQ(ParseHeader(bad, 1024).status().code(), Code::kNotSupported);
  bad = f;
  bad[5] = std::byte{200};
  EXPECT_NE(ParseHeader(bad, 1024).status().message().find("unknown frame type 200"), std::string::npos);
  bad = f;
  bad[6] = std::byte{1};
  EXPECT_EQ(ParseHeader(bad, 1024).status().code(), Code::kInvalidArgument);
  EncodeHeader({Type::kPut, 1, 2000}, bad.data());
  EXPECT_NE(ParseHeader(bad, 1024).status().message().find("exceeds the limit of 1024"), std::string::npos);
  EXPECT_EQ(ParseHeader(std::span(f).first(8), 1024).status().code(), Code::kInvalidArgument);
}

TEST(WireTest, RequestsRoundTrip) {
  Hello hello{1, 1, "token-x", "engine-y"};
  auto h = DecodeHello(Payload(EncodeHello(1, hello)));
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->token, "token-x");
  EXPECT_EQ(h->client_name, "engine-y");

  Lookup lookup{250, flatkv::testing::ChainKeys(3, 5)};
  auto l = DecodeLookup(Payload(EncodeLookup(2, lookup)));
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->deadline_ms, 250u);
  EXPECT_EQ(l->keys, lookup.keys);

  Put put;
  put.session = 42;
  put.hint = 1;
  put.keys = flatkv::testing::ChainKeys(4, 2);
  std::vector<std::byte> data(64, std::byte{7});
  auto frame = EncodePutHead(3, put, data.size());
  frame.insert(frame.end(), data.begin(), data.end());
  ASSERT_EQ(ParseHeader(frame, 1 << 20)->payload_bytes, frame.size() - kHeaderBytes);
  auto p = DecodePut(Payload(frame));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->session, 42u);
  EXPECT_EQ(p->keys, put.keys);
  EXPECT_EQ(p->data.size(), 64u);
  EXPECT_FALSE(p->has_first_block);
  // Protocol 5: a chain position crosses too; unknown flag bits are refused.
  put.has_first_block = true;
  put.first_block = 70000;
  auto fb_frame = EncodePutHead(3, put, data.size());
  fb_frame.insert(fb_frame.end(), data.begin(), data.end());
  auto fb = DecodePut(Payload(fb_frame));
  ASSERT_TRUE(fb.ok()) << fb.status().ToString();
  EXPECT_TRUE(fb->has_first_block);
  EXPECT_EQ(fb->first_block, 70000u);
  EXPECT_EQ(fb->keys, put.keys);
  EXPECT_EQ(fb->data.size(), 64u);
  fb_frame[kHeaderBytes + 13] = std::byte{3};  // the flags byte (after deadline, session, hint): an unknown bit
  EXPECT_NE(DecodePut(Payload(fb_frame)).status().message().find("reserved bytes are not zero"), std::string::npos);
  put.has_first_block = false;
  // Every placement hint crosses the wire; a value beyond them is refused.
  for (PutHint hint : {PutHint::kAuto, PutHint::kOneShot, PutHint::kHot}) {
    put.hint = static_cast<uint8_t>(hint);
    auto hp = DecodePut(Payload(EncodePutHead(3, put, 0)));
    ASSERT_TRUE(hp.ok()) << hp.status().ToString();
    EXPECT_EQ(hp->hint, static_cast<uint8_t>(hint));
  }
  put.hint = 3;
  EXPECT_NE(DecodePut(Payload(EncodePutHead(3, put, 0))).status().message().find("unknown placement hint 3"),
            std::string::npos);

  Restore restore;
  restore.mode = RestoreMode::kShm;
  restore.shm_id = 3;
  restore.shm_offset = 4096;
  restore.keys = flatkv::testing::ChainKeys(5, 3);
  auto r = DecodeRestore(Payload(EncodeRestore(4, restore)));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->mode, RestoreMode::kShm);
  EXPECT_EQ(r->shm_offset, 4096u);
  EXPECT_EQ(r->keys, restore.keys);

  auto e = DecodeError(Payload(EncodeError(5, Status::NoSpace("quota of 10 bytes"))));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->code, Code::kNoSpace);
  EXPECT_EQ(e->message, "quota of 10 bytes");

  HelloOk ok;
  ok.shape = KvShape::Mha(32, 8, 128, DType::kBF16);
  ok.block_tokens = 64;
  ok.block_layer_bytes = 256 << 10;
  ok.max_frame_bytes = 1 << 26;
  ok.tenant = "t1";
  auto o = DecodeHelloOk(Payload(EncodeHelloOk(6, ok)));
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->shape, ok.shape);
  EXPECT_EQ(o->tenant, "t1");
}

TEST(WireTest, MalformedPayloadsAreRejectedWithTheField) {
  Lookup lookup{0, flatkv::testing::ChainKeys(3, 2)};
  auto f = EncodeLookup(1, lookup);
  auto p = Payload(f);
  EXPECT_NE(DecodeLookup(p.first(p.size() - 1)).status().message().find("key count 2"), std::string::npos);
  std::vector<std::byte> extra(p.begin(), p.end());
  extra.push_back(std::byte{0});
  EXPECT_NE(DecodeLookup(extra).status().message().find("trailing"), std::string::npos);
  std::vector<std::byte> huge(8, std::byte{0});
  const uint32_t n = kMaxKeys + 1;
  std::memcpy(huge.data() + 4, &n, 4);
  EXPECT_NE(DecodeLookup(huge).status().message().find("exceeds"), std::string::npos);
  Restore r;
  auto rf = EncodeRestore(1, r);
  rf[kHeaderBytes + 4] = std::byte{9};
  EXPECT_NE(DecodeRestore(Payload(rf)).status().message().find("unknown mode 9"), std::string::npos);
  EXPECT_EQ(ValidateRequest(Type::kRetain, {}).code(), Code::kInvalidArgument);
  EXPECT_NE(ParseHeader([] {
              std::vector<std::byte> h(kHeaderBytes);
              EncodeHeader({static_cast<Type>(10), 1, 0}, h.data());
              return h;
            }(), kDefaultMaxFrameBytes)
                .status()
                .message()
                .find("unknown frame type 10"),
            std::string::npos);
  Retain rt;
  rt.ttl_ms = 1500;
  rt.chain.keys = {BlockKey{1, 2}, BlockKey{3, 4}};
  auto rtf = EncodeRetain(9, rt);
  auto rt2 = DecodeRetain(Payload(rtf));
  ASSERT_TRUE(rt2.ok()) << rt2.status().ToString();
  EXPECT_EQ(rt2->ttl_ms, 1500u);
  EXPECT_EQ(rt2->chain.keys, rt.chain.keys);
  auto tf = EncodeTruncateSession(9, {77, 5});
  auto t2 = DecodeTruncateSession(Payload(tf));
  ASSERT_TRUE(t2.ok());
  EXPECT_EQ(t2->session, 77u);
  EXPECT_EQ(t2->keep_blocks, 5u);
  tf.pop_back();
  EXPECT_EQ(DecodeTruncateSession(Payload(tf)).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ValidateRequest(Type::kHelloOk, {}).code(), Code::kInvalidArgument);
  EXPECT_EQ(DecodeRegisterShm(Payload(EncodeRegisterShm(1, {0}))).status().code(), Code::kInvalidArgument);
  std::vector<std::byte> err(6, std::byte{0});
  EXPECT_EQ(DecodeError(err).status().code(), Code::kInvalidArgument);  // code 0 is not an error
}

TEST(WireTest, PruneRoundTripsAndRefusesGarbage) {
  Prune m;
  m.deadline_ms = 250;
  m.hint = 2;
  m.ranges = {{3, 9}, {40, 100}};
  m.keys = {BlockKey{1, 2}, BlockKey{3, 4}};
  auto f = EncodePrune(5, m);
  auto h = ParseHeader(f, kDefaultMaxFrameBytes);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->type, Type::kPrune);
  EXPECT_TRUE(IsRequest(Type::kPrune));
  EXPECT_EQ(TypeName(Type::kPrune), "prune");
  auto back = DecodePrune(Payload(f));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->deadline_ms, 250u);
  EXPECT_EQ(back->hint, 2u);
  EXPECT_EQ(back->ranges, m.ranges);
  EXPECT_EQ(back->keys, m.keys);
  EXPECT_TRUE(ValidateRequest(Type::kPrune, Payload(f)).ok());
  auto cut = f;
  cut.pop_back();
  EXPECT_EQ(DecodePrune(Payload(cut)).status().code(), Code::kInvalidArgument);
  m.hint = 9;
  EXPECT_NE(DecodePrune(Payload(EncodePrune(5, m))).status().message().find("unknown placement hint 9"), std::string::npos);
  PruneResult r{0x8000000000000007ull, 4, 150, 3, 2};
  auto ok = DecodePruneOk(Payload(EncodePruneOk(5, r)));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->view_session, r.view_session);
  EXPECT_EQ(ok->kept_tokens, 150u);
  EXPECT_EQ(ok->view_blocks, 3u);
  EXPECT_EQ(ok->stored_blocks, 2u);
}

}  // namespace
}  // namespace flatkv::service::wire
