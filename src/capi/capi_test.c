/* Tests the C API from C (C11): the embedded store end to end, errors and
 * their messages, and, when a daemon can be started, the client path.
 *
 * Usage: flatkv_capi_test [FLATKV_BINARY]
 * With the path of the `flatkv` command (which has `serve`), the client
 * tests start a daemon on a Unix socket; without it they are skipped. */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "flatkv/flatkv.h"

static int failures = 0;

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                          \
    }                                                                      \
  } while (0)

/* Expects success; prints the status message otherwise. */
#define OK(expr)                                                                        \
  do {                                                                                  \
    flatkv_status* st_ = (expr);                                                        \
    if (st_ != NULL) {                                                                  \
      fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #expr,           \
              flatkv_code_name(flatkv_status_code(st_)), flatkv_status_message(st_));   \
      flatkv_status_destroy(st_);                                                       \
      failures++;                                                                       \
    }                                                                                   \
  } while (0)

/* Expects an error of `code` whose message contains `needle`. */
#define ERR(expr, code, needle) expect_error((expr), (code), (needle), #expr, __LINE__)

static void expect_error(flatkv_status* st, flatkv_code code, const char* needle, const char* what, int line) {
  if (st == NULL) {
    fprintf(stderr, "%s:%d: %s succeeded, expected %s\n", __FILE__, line, what, flatkv_code_name(code));
    failures++;
    return;
  }
  if (flatkv_status_code(st) != code || strstr(flatkv_status_message(st), needle) == NULL) {
    fprintf(stderr, "%s:%d: %s: got %s \"%s\", expected %s containing \"%s\"\n", __FILE__, line, what,
            flatkv_code_name(flatkv_status_code(st)), flatkv_status_message(st), flatkv_code_name(code), needle);
    failures++;
  }
  flatkv_status_destroy(st);
}

/* ------------------------------------------------------------ helpers */

static char temp_root[256];

static int remove_entry(const char* path, const struct stat* sb, int flag, struct FTW* ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

static void make_temp_root(void) {
  const char* base = getenv("FLATKV_TEST_DIR");
  if (base == NULL) base = "/tmp";
  snprintf(temp_root, sizeof(temp_root), "%s/flatkv_capi_XXXXXX", base);
  if (mkdtemp(temp_root) == NULL) {
    perror("mkdtemp");
    exit(1);
  }
}

/* Deterministic bytes, distinct per (seed, block, offset). */
static void fill_payload(uint8_t* p, uint64_t blocks, uint64_t block_bytes, uint64_t seed) {
  for (uint64_t b = 0; b < blocks; ++b) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + b * 0xD1B54A32D192ED03ull + 1;
    for (uint64_t i = 0; i < block_bytes; ++i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      p[b * block_bytes + i] = (uint8_t)x;
    }
  }
}

/* A small shape: 3 layers x 2 KV heads x 16 dims x f16 = 128 bytes per
 * token-layer; 16-token blocks of 2 KiB per layer, 6 KiB per block. */
enum { kLayers = 3, kBlockTokens = 16, kLayerBytes = 2048, kBlockBytes = kLayers * kLayerBytes };

static flatkv_options* small_options(const char* ssd_dir, uint64_t dram_bytes) {
  flatkv_options* o = flatkv_options_create();
  CHECK(o != NULL);
  OK(flatkv_options_set_shape_mha(o, kLayers, 2, 16, FLATKV_DTYPE_F16));
  OK(flatkv_options_set_block_tokens(o, kBlockTokens));
  OK(flatkv_options_set_dram_capacity(o, dram_bytes));
  OK(flatkv_options_set_extent_layer_bytes(o, 4 * kLayerBytes, 4 * kLayerBytes));
  if (ssd_dir != NULL) {
    OK(flatkv_options_add_ssd_dir(o, ssd_dir, 4u << 20));
    OK(flatkv_options_set_segment_bytes(o, 1u << 20));
  }
  return o;
}

/* Keys of `blocks` blocks of a prompt whose tokens start at `first`. */
static void prompt_keys(const flatkv_namespace* ns, uint32_t first, uint64_t blocks, flatkv_key* keys) {
  uint32_t tokens[64 * kBlockTokens];
  uint64_t n = 0;
  for (uint64_t i = 0; i < blocks * kBlockTokens; ++i) tokens[i] = first + (uint32_t)i;
  OK(flatkv_namespace_keys(ns, NULL, tokens, blocks * kBlockTokens, kBlockTokens, keys, blocks, &n));
  CHECK(n == blocks);
}

/* ------------------------------------------------------------ tests */

static void test_status(void) {
  CHECK(flatkv_status_code(NULL) == FLATKV_OK);
  CHECK(strcmp(flatkv_status_message(NULL), "") == 0);
  flatkv_status_destroy(NULL);
  CHECK(strcmp(flatkv_code_name(FLATKV_OK), "OK") == 0);
  CHECK(strcmp(flatkv_code_name(FLATKV_INVALID_ARGUMENT), "InvalidArgument") == 0);
  CHECK(strcmp(flatkv_code_name(FLATKV_ABORTED), "Aborted") == 0);
  CHECK(strcmp(flatkv_code_name(77), "Unknown") == 0);
  CHECK(strcmp(flatkv_code_name(-1), "Unknown") == 0);
  /* Every destroy accepts NULL. */
  flatkv_options_destroy(NULL);
  flatkv_namespace_destroy(NULL);
  flatkv_store_destroy(NULL);
  flatkv_restore_destroy(NULL);
}

static void test_option_errors(void) {
  flatkv_options* o = flatkv_options_create();
  ERR(flatkv_options_set_shape_preset(o, "no-such-model"), FLATKV_INVALID_ARGUMENT, "no-such-model");
  ERR(flatkv_options_set_shape_preset(o, NULL), FLATKV_INVALID_ARGUMENT, "NULL");
  ERR(flatkv_options_set_shape_preset(NULL, "llama-3.1-8b"), FLATKV_INVALID_ARGUMENT, "options is NULL");
  ERR(flatkv_options_set_shape_mha(o, 0, 8, 128, FLATKV_DTYPE_BF16), FLATKV_INVALID_ARGUMENT, "layers");
  ERR(flatkv_options_set_shape_mha(o, 4, 8, 128, 9), FLATKV_INVALID_ARGUMENT, "dtype 9");
  ERR(flatkv_options_set_block_tokens(o, 8), FLATKV_INVALID_ARGUMENT, "block_tokens 8");
  ERR(flatkv_options_add_ssd_dir(o, "", 1 << 20), FLATKV_INVALID_ARGUMENT, "SSD directory");
  ERR(flatkv_options_add_ssd_dir(o, "/tmp/x", 0), FLATKV_INVALID_ARGUMENT, "0 bytes");
  ERR(flatkv_options_set_server(o, "http://localhost", "t"), FLATKV_INVALID_ARGUMENT, "http://localhost");
  /* Enumerated options take their constants only; counts that must be
   * positive say which one was 0. */
  ERR(flatkv_options_set_ssd_admission(o, 2), FLATKV_INVALID_ARGUMENT,
      "unknown ssd admission 2 (FLATKV_SSD_ADMISSION_ALL=0, FLATKV_SSD_ADMISSION_ON_REUSE=1)");
  ERR(flatkv_options_set_ssd_admission(o, -1), FLATKV_INVALID_ARGUMENT, "unknown ssd admission -1");
  ERR(flatkv_options_set_ssd_io(o, 3), FLATKV_INVALID_ARGUMENT, "unknown I/O engine 3 (FLATKV_IO_AUTO=0");
  ERR(flatkv_options_set_dram_idle_after_ms(o, UINT64_MAX), FLATKV_INVALID_ARGUMENT,
      "dram_idle_after_ms 18446744073709551615 exceeds 2^63 - 1");
  ERR(flatkv_options_set_window_layers(o, 0), FLATKV_INVALID_ARGUMENT, "window_layers is 0");
  ERR(flatkv_options_set_ssd_layers_in_flight(o, 0), FLATKV_INVALID_ARGUMENT, "ssd_layers_in_flight is 0");
  ERR(flatkv_options_set_max_request_bytes(o, 0), FLATKV_INVALID_ARGUMENT, "max_request_bytes is 0");
  ERR(flatkv_options_set_ssd_queue_depth(o, 0), FLATKV_INVALID_ARGUMENT, "ssd_queue_depth is 0");
  ERR(flatkv_options_set_ssd_threads(o, 0), FLATKV_INVALID_ARGUMENT, "ssd_threads is 0");
  ERR(flatkv_options_set_dram_threads(o, 0), FLATKV_INVALID_ARGUMENT, "dram_threads is 0");
  ERR(flatkv_options_set_decode_threads(o, 0), FLATKV_INVALID_ARGUMENT, "decode_threads is 0");
  ERR(flatkv_options_set_ssd_extent_layer_bytes(o, 0), FLATKV_INVALID_ARGUMENT, "ssd_extent_layer_bytes is 0");
  ERR(flatkv_options_set_session_dram_share(NULL, 1), FLATKV_INVALID_ARGUMENT,
      "flatkv_options_set_session_dram_share: options is NULL");
  ERR(flatkv_options_set_readmit_on_restore(NULL, 1), FLATKV_INVALID_ARGUMENT, "options is NULL");

  flatkv_store* store = (flatkv_store*)1;
  ERR(flatkv_store_open(o, &store), FLATKV_INVALID_ARGUMENT, "no KV shape");
  CHECK(store == NULL);
  ERR(flatkv_store_open(NULL, &store), FLATKV_INVALID_ARGUMENT, "options is NULL");
  ERR(flatkv_store_open(o, NULL), FLATKV_INVALID_ARGUMENT, "out is NULL");
  OK(flatkv_options_set_shape_preset(o, "Llama-3.1-8B"));
  OK(flatkv_options_set_shape_mla(o, 61, 512, 64, FLATKV_DTYPE_BF16));
  flatkv_options_destroy(o);
}

static void test_keys(void) {
  flatkv_namespace *a = NULL, *b = NULL, *c = NULL;
  OK(flatkv_namespace_create(FLATKV_HASH_XXH3, FLATKV_DEFAULT_HASH_SEED, "model-1", NULL, "tenant-a", &a));
  OK(flatkv_namespace_create(FLATKV_HASH_XXH3, FLATKV_DEFAULT_HASH_SEED, "model-1", NULL, "tenant-b", &b));
  ERR(flatkv_namespace_create(5, 0, "m", NULL, NULL, &c), FLATKV_INVALID_ARGUMENT, "hash kind 5");
  CHECK(c == NULL);
  OK(flatkv_namespace_create(FLATKV_HASH_SHA256, 7, "model-1", "lora-x", "tenant-a", &c));

  uint32_t tokens[50];
  for (uint32_t i = 0; i < 50; ++i) tokens[i] = 1000 + i;
  flatkv_key ka[3], ka2[3], kb[3], kc[3], tail[2];
  uint64_t n = 99;
  OK(flatkv_namespace_keys(a, NULL, tokens, 50, 16, ka, 3, &n));
  CHECK(n == 3); /* 50 tokens: 3 full blocks, the partial one gets no key */
  OK(flatkv_namespace_keys(a, NULL, tokens, 50, 16, ka2, 3, &n));
  CHECK(memcmp(ka, ka2, sizeof(ka)) == 0);
  OK(flatkv_namespace_keys(b, NULL, tokens, 48, 16, kb, 3, &n));
  OK(flatkv_namespace_keys(c, NULL, tokens, 48, 16, kc, 3, &n));
  CHECK(memcmp(ka, kb, sizeof(ka)) != 0);
  CHECK(memcmp(ka, kc, sizeof(ka)) != 0);
  /* Chaining on from a parent continues the same chain. */
  OK(flatkv_namespace_keys(a, &ka[0], tokens + 16, 32, 16, tail, 2, &n));
  CHECK(n == 2 && memcmp(tail, ka + 1, sizeof(tail)) == 0);
  flatkv_key d = flatkv_namespace_digest(a);
  CHECK(d.lo != 0 || d.hi != 0);

  ERR(flatkv_namespace_keys(a, NULL, tokens, 50, 16, ka, 2, &n), FLATKV_INVALID_ARGUMENT, "keys holds 2");
  CHECK(n == 0);
  ERR(flatkv_namespace_keys(a, NULL, NULL, 50, 16, ka, 3, &n), FLATKV_INVALID_ARGUMENT, "tokens is NULL");
  ERR(flatkv_namespace_keys(a, NULL, tokens, 50, 0, ka, 3, &n), FLATKV_INVALID_ARGUMENT, "block_tokens is 0");
  ERR(flatkv_namespace_keys(NULL, NULL, tokens, 50, 16, ka, 3, &n), FLATKV_INVALID_ARGUMENT, "namespace is NULL");
  flatkv_namespace_destroy(a);
  flatkv_namespace_destroy(b);
  flatkv_namespace_destroy(c);
}

/* Restores `keys` through every path and checks the bytes against `expect`. */
static void check_restores(flatkv_store* s, const flatkv_key* keys, uint32_t n, const uint8_t* expect) {
  const uint64_t bytes = (uint64_t)n * kBlockBytes;
  uint8_t* out = malloc(bytes);
  uint8_t* lm = NULL;
  CHECK(posix_memalign((void**)&lm, 4096, bytes) == 0);
  uint32_t got = 0;

  memset(out, 0, bytes);
  OK(flatkv_store_restore(s, keys, n, out, bytes, FLATKV_LAYOUT_BLOCK_MAJOR, &got));
  CHECK(got == n);
  CHECK(memcmp(out, expect, bytes) == 0);

  memset(lm, 0, bytes);
  OK(flatkv_store_restore(s, keys, n, lm, bytes, FLATKV_LAYOUT_LAYER_MAJOR, &got));
  CHECK(got == n);
  for (uint32_t l = 0; l < kLayers; ++l)
    for (uint32_t b = 0; b < n; ++b)
      CHECK(memcmp(lm + ((uint64_t)l * n + b) * kLayerBytes, expect + (uint64_t)b * kBlockBytes + l * kLayerBytes,
                   kLayerBytes) == 0);

  /* Layer by layer through the store's window. */
  flatkv_restore* r = NULL;
  OK(flatkv_store_restore_start(s, keys, n, NULL, 0, FLATKV_LAYOUT_BLOCK_MAJOR, &r));
  CHECK(flatkv_restore_hit_blocks(r) == n);
  for (uint32_t l = 0; l < kLayers; ++l) {
    const void* data = NULL;
    uint32_t blocks = 0;
    OK(flatkv_restore_wait_layer(r, l, &data, &blocks));
    CHECK(blocks == n && data != NULL);
    for (uint32_t b = 0; data != NULL && b < blocks; ++b)
      CHECK(memcmp((const uint8_t*)data + (uint64_t)b * kLayerBytes,
                   expect + (uint64_t)b * kBlockBytes + l * kLayerBytes, kLayerBytes) == 0);
    OK(flatkv_restore_release_layer(r, l));
  }
  ERR(flatkv_restore_release_layer(r, kLayers), FLATKV_INVALID_ARGUMENT, "layer 3");
  OK(flatkv_restore_finish(r, &got));
  CHECK(got == n);
  flatkv_restore_destroy(r);

  /* Layer by layer into caller memory. */
  memset(out, 0, bytes);
  OK(flatkv_store_restore_start(s, keys, n, out, bytes, FLATKV_LAYOUT_BLOCK_MAJOR, &r));
  for (uint32_t l = 0; l < kLayers; ++l) {
    const void* data = (const void*)1;
    uint32_t blocks = 0;
    OK(flatkv_restore_wait_layer(r, l, &data, &blocks));
    CHECK(blocks == n && data == NULL);
    OK(flatkv_restore_release_layer(r, l));
  }
  OK(flatkv_restore_finish(r, &got));
  CHECK(got == n);
  flatkv_restore_destroy(r);
  CHECK(memcmp(out, expect, bytes) == 0);
  free(out);
  free(lm);
}

static void test_embedded(void) {
  char dir[300];
  snprintf(dir, sizeof(dir), "%s/ssd", temp_root);
  flatkv_options* o = small_options(dir, 1u << 20);
  flatkv_store* s = NULL;
  OK(flatkv_store_open(o, &s));
  flatkv_options_destroy(o); /* the store keeps what it needs */
  if (s == NULL) return;
  CHECK(flatkv_store_layers(s) == kLayers);
  CHECK(flatkv_store_block_tokens(s) == kBlockTokens);
  CHECK(flatkv_store_block_layer_bytes(s) == kLayerBytes);
  CHECK(flatkv_store_block_bytes(s) == kBlockBytes);
  CHECK(flatkv_store_block_bytes(NULL) == 0);
  CHECK(flatkv_store_dtype(s) == FLATKV_DTYPE_F16);
  CHECK(flatkv_store_dtype(NULL) == 0);

  flatkv_namespace* ns = NULL;
  OK(flatkv_namespace_create(FLATKV_HASH_XXH3, FLATKV_DEFAULT_HASH_SEED, "capi-test", NULL, NULL, &ns));
  enum { N = 6 };
  flatkv_key keys[N + 2];
  prompt_keys(ns, 1, N + 2, keys);
  uint8_t* data = malloc((uint64_t)N * kBlockBytes);
  fill_payload(data, N, kBlockBytes, 11);

  uint32_t hit = 99;
  OK(flatkv_store_match(s, keys, N, &hit));
  CHECK(hit == 0);
  OK(flatkv_store_put(s, 1, keys, N, data, (uint64_t)N * kBlockBytes, 0));
  OK(flatkv_store_match(s, keys, N + 2, &hit));
  CHECK(hit == N);
  check_restores(s, keys, N, data);

  /* A longer chain restores its stored prefix; the rest stays untouched. */
  uint8_t* big = malloc((uint64_t)(N + 2) * kBlockBytes);
  memset(big, 0xAB, (uint64_t)(N + 2) * kBlockBytes);
  uint32_t got = 0;
  OK(flatkv_store_restore(s, keys, N + 2, big, (uint64_t)(N + 2) * kBlockBytes, FLATKV_LAYOUT_BLOCK_MAJOR, &got));
  CHECK(got == N);
  CHECK(memcmp(big, data, (uint64_t)N * kBlockBytes) == 0);
  CHECK(big[(uint64_t)N * kBlockBytes] == 0xAB);

  /* Bad arguments: errors with messages, never a crash. */
  ERR(flatkv_store_put(s, 1, keys, N, data, (uint64_t)N * kBlockBytes - 1, 0), FLATKV_INVALID_ARGUMENT,
      "expected 6 blocks x 6144 bytes");
  ERR(flatkv_store_put(s, 1, NULL, N, data, (uint64_t)N * kBlockBytes, 0), FLATKV_INVALID_ARGUMENT, "keys is NULL");
  ERR(flatkv_store_put(s, 1, keys, N, NULL, (uint64_t)N * kBlockBytes, 0), FLATKV_INVALID_ARGUMENT, "data is NULL");
  ERR(flatkv_store_put(s, 1, keys, N, data, (uint64_t)N * kBlockBytes, 0x80), FLATKV_INVALID_ARGUMENT, "flags 128");
  ERR(flatkv_store_put(NULL, 1, keys, N, data, (uint64_t)N * kBlockBytes, 0), FLATKV_INVALID_ARGUMENT,
      "flatkv_store_put: store is NULL");
  ERR(flatkv_store_restore(s, keys, N, big, (uint64_t)N * kBlockBytes - 1, FLATKV_LAYOUT_BLOCK_MAJOR, &got),
      FLATKV_INVALID_ARGUMENT, "need 6 x 6144");
  ERR(flatkv_store_restore(s, keys, N, NULL, 0, FLATKV_LAYOUT_BLOCK_MAJOR, &got), FLATKV_INVALID_ARGUMENT,
      "dst is NULL");
  ERR(flatkv_store_restore(s, keys, N, big, (uint64_t)N * kBlockBytes, 7, &got),
      FLATKV_INVALID_ARGUMENT, "layout 7");
  ERR(flatkv_store_restore(s, keys, N, big, (uint64_t)N * kBlockBytes, FLATKV_LAYOUT_BLOCK_MAJOR, NULL),
      FLATKV_INVALID_ARGUMENT, "n_restored is NULL");
  ERR(flatkv_store_match(s, keys, N, NULL), FLATKV_INVALID_ARGUMENT, "n_hit is NULL");
  ERR(flatkv_restore_wait_layer(NULL, 0, NULL, &got), FLATKV_INVALID_ARGUMENT, "restore is NULL");
  CHECK(flatkv_restore_hit_blocks(NULL) == 0);

  /* A layer past the model is an error. */
  flatkv_restore* r = NULL;
  OK(flatkv_store_restore_start(s, keys, N, NULL, 0, FLATKV_LAYOUT_BLOCK_MAJOR, &r));
  const void* view = NULL;
  ERR(flatkv_restore_wait_layer(r, kLayers, &view, &got), FLATKV_INVALID_ARGUMENT, "layer 3");
  flatkv_restore_destroy(r); /* unconsumed: destroy waits for its I/O */

  /* Stats. */
  flatkv_stats st;
  OK(flatkv_store_stats(s, &st));
  CHECK(st.put_blocks == N);
  CHECK(st.ssd.blocks == N);  /* every block has its SSD home */
  CHECK(st.dram.blocks <= N); /* and at most one DRAM copy */
  CHECK(st.restores >= 5);
  uint64_t needed = 0;
  OK(flatkv_store_stats_json(s, NULL, 0, &needed));
  CHECK(needed > 10);
  char* json = malloc(needed);
  ERR(flatkv_store_stats_json(s, json, needed - 1, &needed), FLATKV_INVALID_ARGUMENT, "the JSON needs");
  OK(flatkv_store_stats_json(s, json, needed, &needed));
  CHECK(strstr(json, "\"put_blocks\":6") != NULL);
  free(json);

  /* Dropping a session frees its blocks. */
  ERR(flatkv_store_drop_session(s, 99), FLATKV_NOT_FOUND, "session 99");
  OK(flatkv_store_drop_session(s, 1));
  OK(flatkv_store_match(s, keys, N, &hit));
  CHECK(hit == 0);

  /* A restore outliving its store handle keeps the store alive. */
  OK(flatkv_store_put(s, 2, keys, N, data, (uint64_t)N * kBlockBytes, 0));
  OK(flatkv_store_restore_start(s, keys, N, NULL, 0, FLATKV_LAYOUT_BLOCK_MAJOR, &r));
  flatkv_store_destroy(s);
  for (uint32_t l = 0; l < kLayers; ++l) {
    uint32_t blocks = 0;
    OK(flatkv_restore_wait_layer(r, l, &view, &blocks));
    CHECK(blocks == N);
    OK(flatkv_restore_release_layer(r, l));
  }
  flatkv_restore_destroy(r);

  flatkv_namespace_destroy(ns);
  free(big);
  free(data);
}

/* The store's options as JSON, NUL-terminated; NULL on error (reported). */
static char* options_json(flatkv_store* s) {
  uint64_t needed = 0;
  OK(flatkv_store_options_json(s, NULL, 0, &needed));
  if (needed == 0) return NULL;
  char* json = malloc(needed);
  ERR(flatkv_store_options_json(s, json, needed - 1, &needed), FLATKV_INVALID_ARGUMENT, "the JSON needs");
  OK(flatkv_store_options_json(s, json, needed, &needed));
  return json;
}

/* Expects `"key":value` in `json` (nlohmann's compact form). */
#define HAS(json, kv) expect_has((json), (kv), __LINE__)
static void expect_has(const char* json, const char* kv, int line) {
  if (json == NULL || strstr(json, kv) == NULL) {
    fprintf(stderr, "%s:%d: options JSON lacks %s: %s\n", __FILE__, line, kv, json ? json : "(null)");
    failures++;
  }
}

/* Every option set through the C API is the store's once it is open. */
static void test_options_take_effect(void) {
  char dir[300];
  snprintf(dir, sizeof(dir), "%s/knobs", temp_root);
  flatkv_options* o = small_options(dir, 2u << 20);
  OK(flatkv_options_set_session_dram_share(o, 1u << 20));
  OK(flatkv_options_set_dram_idle_after_ms(o, 1500));
  OK(flatkv_options_set_ssd_admission(o, FLATKV_SSD_ADMISSION_ON_REUSE));
  OK(flatkv_options_set_readmit_on_restore(o, 0));
  OK(flatkv_options_set_sized_extents(o, 0));
  OK(flatkv_options_set_ssd_write_buffer(o, 3u << 20));
  OK(flatkv_options_set_manifest_checkpoint(o, 5u << 20));
  OK(flatkv_options_set_window_layers(o, 2));
  OK(flatkv_options_set_window_bytes(o, 1u << 20));
  OK(flatkv_options_set_ssd_layers_in_flight(o, 5));
  OK(flatkv_options_set_max_request_bytes(o, 1u << 20));
  OK(flatkv_options_set_ssd_io(o, FLATKV_IO_THREAD_POOL));
  OK(flatkv_options_set_ssd_queue_depth(o, 8));
  OK(flatkv_options_set_ssd_threads(o, 3));
  OK(flatkv_options_set_dram_threads(o, 1));
  OK(flatkv_options_set_decode_threads(o, 2));
  OK(flatkv_options_set_verify_dram_reads(o, 1));
  OK(flatkv_options_set_sync_writes(o, 1));
  OK(flatkv_options_set_direct_io(o, 0));
  OK(flatkv_options_set_dram_extent_layer_bytes(o, 2 * kLayerBytes));
  OK(flatkv_options_set_ssd_extent_layer_bytes(o, 8 * kLayerBytes));
  flatkv_store* s = NULL;
  OK(flatkv_store_open(o, &s));
  flatkv_options_destroy(o);
  if (s == NULL) return;
  char* json = options_json(s);
  HAS(json, "\"block_tokens\":16");
  HAS(json, "\"dram_capacity_bytes\":2097152");
  HAS(json, "\"ssd_capacity_bytes\":4194304");
  HAS(json, "\"segment_bytes\":1048576");
  HAS(json, "\"dram_extent_layer_bytes\":4096");
  HAS(json, "\"ssd_extent_layer_bytes\":16384");
  HAS(json, "\"session_dram_share_bytes\":1048576");
  HAS(json, "\"dram_idle_after_ms\":1500");
  HAS(json, "\"ssd_admission\":\"on-reuse\"");
  HAS(json, "\"readmit_on_restore\":false");
  HAS(json, "\"sized_extents\":false");
  HAS(json, "\"ssd_write_buffer_bytes\":3145728");
  HAS(json, "\"manifest_checkpoint_bytes\":5242880");
  HAS(json, "\"window_layers\":2");
  HAS(json, "\"window_bytes\":1048576");
  HAS(json, "\"ssd_layers_in_flight\":5");
  HAS(json, "\"max_request_bytes\":1048576");
  HAS(json, "\"ssd_io\":\"threadpool\"");
  HAS(json, "\"ssd_queue_depth\":8");
  HAS(json, "\"ssd_threads\":3");
  HAS(json, "\"dram_threads\":1");
  HAS(json, "\"decode_threads\":2");
  HAS(json, "\"verify_dram_reads\":true");
  HAS(json, "\"sync_writes\":true");
  HAS(json, "\"use_direct_io\":false");
  HAS(json, dir);
  free(json);
  /* The thread-pool engine was taken, not io_uring. */
  uint64_t needed = 0;
  OK(flatkv_store_stats_json(s, NULL, 0, &needed));
  char* stats = malloc(needed);
  OK(flatkv_store_stats_json(s, stats, needed, &needed));
  CHECK(strstr(stats, "\"ssd_engine\":\"threadpool\"") != NULL);
  free(stats);

  /* Put hints: each one is accepted, two at once are not. */
  flatkv_namespace* ns = NULL;
  OK(flatkv_namespace_create(FLATKV_HASH_XXH3, FLATKV_DEFAULT_HASH_SEED, "capi-knobs", NULL, NULL, &ns));
  flatkv_key keys[3];
  prompt_keys(ns, 900, 3, keys);
  uint8_t* data = malloc(3 * kBlockBytes);
  fill_payload(data, 3, kBlockBytes, 5);
  OK(flatkv_store_put(s, 1, keys, 1, data, kBlockBytes, 0));
  OK(flatkv_store_put(s, 1, keys + 1, 1, data + kBlockBytes, kBlockBytes, FLATKV_PUT_ONE_SHOT));
  OK(flatkv_store_put(s, 1, keys + 2, 1, data + 2 * kBlockBytes, kBlockBytes, FLATKV_PUT_HOT));
  ERR(flatkv_store_put(s, 1, keys, 1, data, kBlockBytes, FLATKV_PUT_ONE_SHOT | FLATKV_PUT_HOT),
      FLATKV_INVALID_ARGUMENT, "put flags 3 name 2 placement hints");
  uint32_t hit = 0;
  OK(flatkv_store_match(s, keys, 3, &hit));
  CHECK(hit == 3);
  ERR(flatkv_store_options_json(NULL, NULL, 0, &needed), FLATKV_INVALID_ARGUMENT, "store is NULL");
  ERR(flatkv_store_options_json(s, NULL, 0, NULL), FLATKV_INVALID_ARGUMENT, "needed is NULL");
  free(data);
  flatkv_namespace_destroy(ns);
  flatkv_store_destroy(s);
}

/* SSD blocks survive a close and reopen: the store restarts warm. */
static void test_restart_warm(void) {
  char dir[300];
  snprintf(dir, sizeof(dir), "%s/warm", temp_root);
  flatkv_namespace* ns = NULL;
  OK(flatkv_namespace_create(FLATKV_HASH_XXH3, FLATKV_DEFAULT_HASH_SEED, "capi-warm", NULL, NULL, &ns));
  enum { N = 5 };
  flatkv_key keys[N];
  prompt_keys(ns, 500, N, keys);
  uint8_t* data = malloc((uint64_t)N * kBlockBytes);
  fill_payload(data, N, kBlockBytes, 23);

  flatkv_options* o = small_options(dir, 0); /* SSD only */
  flatkv_store* s = NULL;
  OK(flatkv_store_open(o, &s));
  OK(flatkv_store_put(s, 7, keys, N, data, (uint64_t)N * kBlockBytes, FLATKV_PUT_ONE_SHOT));
  OK(flatkv_store_close(s));
  OK(flatkv_store_close(s)); /* twice is fine */
  uint32_t hit = 0;
  ERR(flatkv_store_put(s, 7, keys, N, data, (uint64_t)N * kBlockBytes, 0), FLATKV_FAILED_PRECONDITION, "closed");
  flatkv_store_destroy(s);

  s = NULL;
  OK(flatkv_store_open(o, &s));
  flatkv_options_destroy(o);
  if (s != NULL) {
    flatkv_stats st;
    OK(flatkv_store_stats(s, &st));
    CHECK(st.recovered_blocks == N);
    OK(flatkv_store_match(s, keys, N, &hit));
    CHECK(hit == N);
    check_restores(s, keys, N, data);
    flatkv_store_destroy(s);
  }
  /* A different shape over the same directory is refused with a message. */
  o = flatkv_options_create();
  OK(flatkv_options_set_shape_mha(o, kLayers + 1, 2, 16, FLATKV_DTYPE_F16));
  OK(flatkv_options_set_block_tokens(o, kBlockTokens));
  OK(flatkv_options_add_ssd_dir(o, dir, 4u << 20));
  s = (flatkv_store*)1;
  flatkv_status* err = flatkv_store_open(o, &s);
  CHECK(err != NULL && s == NULL);
  CHECK(strlen(flatkv_status_message(err)) > strlen("flatkv_store_open: "));
  flatkv_status_destroy(err);
  flatkv_options_destroy(o);
  flatkv_namespace_destroy(ns);
  free(data);
}

/* ------------------------------------------------------------ daemon */

static const char* kTokenA = "capi-tenant-a-token-0123";
static const char* kTokenB = "capi-tenant-b-token-4567";

/* 1 when `binary serve --help` mentions --config. */
static int has_serve(const char* binary) {
  char cmd[1200];
  snprintf(cmd, sizeof(cmd), "'%s' serve --help 2>/dev/null", binary);
  FILE* p = popen(cmd, "r");
  if (p == NULL) return 0;
  char line[512];
  int found = 0;
  while (fgets(line, sizeof(line), p) != NULL)
    if (strstr(line, "--config") != NULL) found = 1;
  return pclose(p) == 0 && found;
}

static flatkv_store* connect_to(const char* address, const char* token, uint64_t shm_bytes, flatkv_status** err) {
  flatkv_options* o = flatkv_options_create();
  OK(flatkv_options_set_server(o, address, token));
  OK(flatkv_options_set_shm_window(o, shm_bytes));
  flatkv_store* s = NULL;
  *err = flatkv_store_open(o, &s);
  flatkv_options_destroy(o);
  return s;
}

/* Starts `flatkv serve` on a Unix socket, uses it through the C API, stops
 * it with SIGTERM. Skipped (with a note) when no binary is given; a failure
 * when the one given is missing or has no `serve --config`. */
/* The view of `blocks` blocks of `data` (block-major, `layers` slices of
 * `layer_bytes`, `bt` tokens, K rows then V rows) without [b0, e0) and
 * [b1, e1): the kept rows packed in order, zero padded. Returns its blocks. */
static uint32_t expected_view(const uint8_t* data, uint32_t blocks, uint32_t layers, uint64_t layer_bytes, uint32_t bt,
                              uint32_t b0, uint32_t e0, uint32_t b1, uint32_t e1, uint8_t* out) {
  const uint64_t row = layer_bytes / (2 * bt), block_bytes = layers * layer_bytes;
  uint32_t j = 0;
  memset(out, 0, (uint64_t)blocks * block_bytes);
  for (uint32_t p = 0; p < blocks * bt; ++p) {
    if ((p >= b0 && p < e0) || (p >= b1 && p < e1)) continue;
    for (uint32_t l = 0; l < layers; ++l) {
      const uint8_t* src = data + (uint64_t)(p / bt) * block_bytes + l * layer_bytes;
      uint8_t* dst = out + (uint64_t)(j / bt) * block_bytes + l * layer_bytes;
      memcpy(dst + (j % bt) * row, src + (p % bt) * row, row);
      memcpy(dst + (bt + j % bt) * row, src + (bt + p % bt) * row, row);
    }
    ++j;
  }
  return (j + bt - 1) / bt;
}

/* Prefix-cache pruning: the view holds the kept rows, only its prune set
 * finds it, and it outlives the unpruned session. */
static void test_prune(void) {
  char dir[300];
  snprintf(dir, sizeof(dir), "%s/prune-ssd", temp_root);
  flatkv_options* o = small_options(dir, 1u << 20);
  flatkv_store* s = NULL;
  OK(flatkv_store_open(o, &s));
  flatkv_options_destroy(o);
  if (s == NULL) return;
  flatkv_namespace* ns = NULL;
  OK(flatkv_namespace_create(FLATKV_HASH_XXH3, FLATKV_DEFAULT_HASH_SEED, "capi-prune", NULL, NULL, &ns));
  enum { N = 5 };
  flatkv_key keys[N];
  prompt_keys(ns, 7, N, keys);
  uint8_t* data = malloc((uint64_t)N * kBlockBytes);
  uint8_t* want = malloc((uint64_t)N * kBlockBytes);
  uint8_t* out = malloc((uint64_t)N * kBlockBytes);
  fill_payload(data, N, kBlockBytes, 5);
  OK(flatkv_store_put(s, 3, keys, N, data, (uint64_t)N * kBlockBytes, 0));
  const flatkv_token_range ranges[2] = {{4, 9}, {20, 50}}; /* 35 of 80 tokens go */
  flatkv_prune_result r;
  OK(flatkv_store_prune(s, keys, N, ranges, 2, &r));
  CHECK(r.logical_blocks == N && r.kept_tokens == 45 && r.view_blocks == 3 && r.stored_blocks == 3);
  flatkv_key view[N];
  uint64_t nv = 0;
  OK(flatkv_prune_view_keys(keys[N - 1], N, ranges, 2, kBlockTokens, view, N, &nv));
  CHECK(nv == 3);
  CHECK(flatkv_chunk_session(view[0]) == r.view_session); /* the same formula: the first key's low word, top bit set */
  OK(flatkv_store_drop_session(s, 3)); /* the unpruned blocks go; the view stays */
  uint32_t got = 9;
  OK(flatkv_store_match(s, keys, N, &got));
  CHECK(got == 0);
  OK(flatkv_store_restore(s, view, nv, out, nv * kBlockBytes, FLATKV_LAYOUT_BLOCK_MAJOR, &got));
  CHECK(got == 3);
  CHECK(expected_view(data, N, kLayers, kLayerBytes, kBlockTokens, 4, 9, 20, 50, want) == 3);
  CHECK(memcmp(out, want, 3 * (uint64_t)kBlockBytes) == 0);
  /* Another prune set names other keys; bad sets are refused. */
  const flatkv_token_range other[1] = {{4, 9}};
  flatkv_key other_keys[N];
  OK(flatkv_prune_view_keys(keys[N - 1], N, other, 1, kBlockTokens, other_keys, N, &nv));
  OK(flatkv_store_match(s, other_keys, nv, &got));
  CHECK(got == 0);
  const flatkv_token_range bad[2] = {{20, 50}, {4, 9}};
  ERR(flatkv_prune_view_keys(keys[N - 1], N, bad, 2, kBlockTokens, other_keys, N, &nv), FLATKV_INVALID_ARGUMENT,
      "range 1 [4, 9) overlaps or precedes");
  ERR(flatkv_prune_view_keys(keys[N - 1], N, ranges, 2, kBlockTokens, other_keys, 2, &nv), FLATKV_INVALID_ARGUMENT,
      "keys_capacity 2");
  /* The view exists: pruning again writes nothing. Another set needs the dropped chain. */
  flatkv_prune_result again;
  OK(flatkv_store_prune(s, keys, N, ranges, 2, &again));
  CHECK(again.view_session == r.view_session && again.stored_blocks == 0);
  flatkv_prune_result failed;
  ERR(flatkv_store_prune(s, keys, N, other, 1, &failed), FLATKV_NOT_FOUND, "0 of the chain's 5 blocks are stored");
  CHECK(failed.view_session == 0 && failed.view_blocks == 0); /* cleared on failure */
  ERR(flatkv_store_prune(s, keys, N, NULL, 2, &failed), FLATKV_INVALID_ARGUMENT, "ranges is NULL");
  ERR(flatkv_store_prune(NULL, keys, N, ranges, 2, &failed), FLATKV_INVALID_ARGUMENT, "store is NULL");
  OK(flatkv_store_drop_session(s, r.view_session));
  flatkv_store_destroy(s);
  flatkv_namespace_destroy(ns);
  free(data);
  free(want);
  free(out);
}

static void test_daemon(const char* binary) {
  if (binary == NULL) {
    printf("capi_test: daemon tests skipped (no flatkv binary given)\n");
    return;
  }
  /* A binary that was named (ctest names the one it built) must be there:
   * a missing one is a failure, not a silent skip. */
  if (access(binary, X_OK) != 0 || !has_serve(binary)) {
    fprintf(stderr, "%s:%d: %s is not an executable flatkv with `serve --config`\n", __FILE__, __LINE__, binary);
    failures++;
    return;
  }
  char config[300], sock[300], address[310], log[300];
  snprintf(config, sizeof(config), "%s/serve.toml", temp_root);
  snprintf(sock, sizeof(sock), "%s/serve.sock", temp_root);
  snprintf(address, sizeof(address), "unix:%s", sock);
  snprintf(log, sizeof(log), "%s/serve.log", temp_root);
  FILE* f = fopen(config, "w");
  CHECK(f != NULL);
  if (f == NULL) return;
  fprintf(f,
          "[store]\nshape = \"stories260k\"\nblock_tokens = 16\ndram_bytes = \"8MiB\"\n"
          "ssd_dir = \"%s/serve-ssd\"\nssd_bytes = \"64MiB\"\nsegment_bytes = \"8MiB\"\n"
          "session_dram_share_bytes = \"2MiB\"\ndram_idle_after_ms = 4321\nssd_admission = \"on-reuse\"\n"
          "readmit_on_restore = false\nwindow_layers = 3\n"
          "[listen]\nunix = \"%s\"\ntcp = \"\"\nhttp = \"\"\n"
          "[[tenants]]\nname = \"a\"\ntoken = \"%s\"\n[[tenants]]\nname = \"b\"\ntoken = \"%s\"\n",
          temp_root, sock, kTokenA, kTokenB);
  fclose(f);

  pid_t pid = fork();
  if (pid == 0) {
    FILE* out = freopen(log, "w", stdout);
    (void)out;
    dup2(fileno(stdout), 2);
    execl(binary, binary, "serve", "--config", config, (char*)NULL);
    _exit(127);
  }
  CHECK(pid > 0);
  if (pid <= 0) return;

  /* Connect as soon as it listens (up to 20 s). */
  flatkv_store* a = NULL;
  for (int i = 0; i < 400 && a == NULL; ++i) {
    flatkv_status* err = NULL;
    a = connect_to(address, kTokenA, 0, &err);
    flatkv_status_destroy(err);
    if (a == NULL) {
      int status;
      if (waitpid(pid, &status, WNOHANG) == pid) break;
      struct timespec ts = {0, 50 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
  }
  CHECK(a != NULL);
  if (a != NULL) {
    CHECK(flatkv_store_layers(a) == 5);
    CHECK(flatkv_store_block_tokens(a) == 16);
    /* The config file's knobs are the daemon's store's; its paths are not shown. */
    char* json = options_json(a);
    HAS(json, "\"session_dram_share_bytes\":2097152");
    HAS(json, "\"dram_idle_after_ms\":4321");
    HAS(json, "\"ssd_admission\":\"on-reuse\"");
    HAS(json, "\"readmit_on_restore\":false");
    HAS(json, "\"window_layers\":3");
    HAS(json, "\"ssd_write_buffer_bytes\":0");
    HAS(json, "\"ssd_dirs\":1");
    CHECK(json == NULL || strstr(json, "serve-ssd") == NULL);
    free(json);
    const uint64_t bb = flatkv_store_block_bytes(a);
    flatkv_namespace* ns = NULL;
    OK(flatkv_namespace_create(FLATKV_HASH_XXH3, FLATKV_DEFAULT_HASH_SEED, "stories260k", NULL, NULL, &ns));
    flatkv_key keys[4];
    uint32_t tokens[64];
    uint64_t n = 0;
    for (uint32_t i = 0; i < 64; ++i) tokens[i] = i * 3;
    OK(flatkv_namespace_keys(ns, NULL, tokens, 64, 16, keys, 4, &n));
    uint8_t* data = malloc(4 * bb);
    uint8_t* out = calloc(4, bb);
    fill_payload(data, 4, bb, 77);
    OK(flatkv_store_put(a, 1, keys, 2, data, 2 * bb, FLATKV_PUT_HOT));
    OK(flatkv_store_put(a, 1, keys + 2, 2, data + 2 * bb, 2 * bb, FLATKV_PUT_ONE_SHOT));
    uint32_t got = 0;
    OK(flatkv_store_match(a, keys, 4, &got));
    CHECK(got == 4);
    OK(flatkv_store_restore(a, keys, 4, out, 4 * bb, FLATKV_LAYOUT_BLOCK_MAJOR, &got));
    CHECK(got == 4 && memcmp(out, data, 4 * bb) == 0);

    flatkv_status* err = NULL;
    flatkv_store* shm = connect_to(address, kTokenA, 4u << 20, &err);
    OK(err);
    memset(out, 0, 4 * bb);
    OK(flatkv_store_restore(shm, keys, 4, out, 4 * bb, FLATKV_LAYOUT_BLOCK_MAJOR, &got));
    CHECK(got == 4 && memcmp(out, data, 4 * bb) == 0);
    flatkv_store_destroy(shm);

    flatkv_store* b = connect_to(address, kTokenB, 0, &err);
    OK(err);
    OK(flatkv_store_match(b, keys, 4, &got));
    CHECK(got == 0); /* another tenant's blocks are out of reach */
    flatkv_store_destroy(b);
    CHECK(connect_to(address, "not-the-token-of-anyone", 0, &err) == NULL);
    CHECK(flatkv_status_code(err) == FLATKV_PERMISSION_DENIED);
    flatkv_status_destroy(err);
    /* A pruned view built in the daemon (protocol 6), in tenant a's namespace only. */
    flatkv_prune_result pr;
    const flatkv_token_range ranges[2] = {{0, 3}, {17, 40}};
    OK(flatkv_store_prune(a, keys, 4, ranges, 2, &pr));
    CHECK(pr.kept_tokens == 38 && pr.view_blocks == 3 && pr.stored_blocks == 3);
    flatkv_key view[4];
    OK(flatkv_prune_view_keys(keys[3], 4, ranges, 2, 16, view, 4, &n));
    CHECK(n == 3);
    uint8_t* want = malloc(4 * bb);
    CHECK(expected_view(data, 4, 5, bb / 5, 16, 0, 3, 17, 40, want) == 3);
    memset(out, 0, 4 * bb);
    OK(flatkv_store_restore(a, view, 3, out, 3 * bb, FLATKV_LAYOUT_BLOCK_MAJOR, &got));
    CHECK(got == 3 && memcmp(out, want, 3 * bb) == 0);
    free(want);
    flatkv_store* b2 = connect_to(address, kTokenB, 0, &err);
    OK(err);
    OK(flatkv_store_match(b2, view, 3, &got));
    CHECK(got == 0);
    flatkv_prune_result none;
    ERR(flatkv_store_prune(b2, keys, 4, ranges, 2, &none), FLATKV_NOT_FOUND, "0 of the chain's 4 blocks");
    flatkv_store_destroy(b2);
    OK(flatkv_store_drop_session(a, pr.view_session));
    OK(flatkv_store_match(a, view, 3, &got));
    CHECK(got == 0);
    OK(flatkv_store_drop_session(a, 1)); /* through the daemon (protocol 2) */
    OK(flatkv_store_match(a, keys, 4, &got));
    CHECK(got == 0);
    ERR(flatkv_store_drop_session(a, 1), FLATKV_NOT_FOUND, "session 1 has no blocks");
    flatkv_store_destroy(a);
    flatkv_namespace_destroy(ns);
    free(data);
    free(out);
  }
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  if (a == NULL || !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    fprintf(stderr, "capi_test: flatkv serve exited with status %d; its log:\n", status);
    FILE* l = fopen(log, "r");
    char line[512];
    while (l != NULL && fgets(line, sizeof(line), l) != NULL) fputs(line, stderr);
    if (l != NULL) fclose(l);
  }
}

int main(int argc, char** argv) {
  make_temp_root();
  test_status();
  test_option_errors();
  test_keys();
  test_embedded();
  test_options_take_effect();
  test_restart_warm();
  test_prune();
  test_daemon(argc > 1 ? argv[1] : NULL);
  nftw(temp_root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  if (failures) {
    fprintf(stderr, "capi_test: %d failure(s)\n", failures);
    return 1;
  }
  printf("capi_test: all passed\n");
  return 0;
}
