/* flatkv.h: the C API of flatkv, for connectors and other languages.
 *
 * One opaque-handle API over two backends: the embedded store (DRAM + SSD
 * in this process, include/flatkv/store.h) and a client of a `flatkv serve`
 * daemon ("unix:/path" or "tcp:host:port"). Which one a flatkv_store is
 * depends only on its options (flatkv_options_set_server); every other call
 * is the same.
 *
 * Conventions (docs/c_api.md):
 *  - Handles are opaque. Every `*_create` / `*_open` has a `*_destroy`, and
 *    every destroy accepts NULL.
 *  - A fallible call returns a `flatkv_status*`: NULL on success, otherwise
 *    an error the caller owns and frees with flatkv_status_destroy. Errors
 *    are values, never thread-local or per-handle state, so any thread may
 *    call anything without racing on "the last error".
 *  - No C++ exception crosses this boundary; running out of memory inside a
 *    call is reported as FLATKV_NO_SPACE.
 *  - Sizes are bytes as uint64_t; counts of blocks or keys as uint64_t in
 *    arguments, uint32_t in results (a restore covers at most 2^32 blocks).
 *    Enumerated arguments (dtype, hash kind, layout) are int32_t taking the
 *    enums' constants, so a value outside them is an error, not undefined.
 *
 * Thread-safety: a flatkv_store may be used from many threads at once. A
 * flatkv_restore is used by one thread at a time. A flatkv_namespace is
 * immutable (share it freely); a flatkv_options is not thread-safe.
 *
 * C99-compatible. Link against the flatkv library (C++; link with a C++
 * linker or add -lstdc++).
 */
#ifndef FLATKV_FLATKV_H_
#define FLATKV_FLATKV_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- status */

/* The same values as flatkv::Code (include/flatkv/status.h). */
typedef enum flatkv_code {
  FLATKV_OK = 0,
  FLATKV_INVALID_ARGUMENT = 1,    /* the caller passed something malformed */
  FLATKV_NOT_FOUND = 2,           /* a file, directory or session that does not exist */
  FLATKV_CORRUPTION = 3,          /* stored bytes or metadata failed a check */
  FLATKV_IO_ERROR = 4,            /* the device, filesystem or connection failed */
  FLATKV_NO_SPACE = 5,            /* a capacity limit, a full disk, or out of memory */
  FLATKV_PERMISSION_DENIED = 6,   /* an inaccessible directory or a rejected tenant token */
  FLATKV_NOT_SUPPORTED = 7,       /* a feature this build or backend lacks */
  FLATKV_FAILED_PRECONDITION = 8, /* the object is in the wrong state for the call */
  FLATKV_ABORTED = 9              /* the operation was cancelled, or an internal error */
} flatkv_code;

typedef struct flatkv_status flatkv_status;

/* The code of `status`; FLATKV_OK for NULL. */
flatkv_code flatkv_status_code(const flatkv_status* status);
/* What went wrong and with which value, e.g. "flatkv_store_put: data is 100
 * bytes, expected 2 blocks x 81920 bytes". "" for NULL. Valid until the
 * status is destroyed. */
const char* flatkv_status_message(const flatkv_status* status);
void flatkv_status_destroy(flatkv_status* status);
/* "OK", "InvalidArgument", ...; "Unknown" for values outside the enum. */
const char* flatkv_code_name(int32_t code);

/* ---------------------------------------------------------------- options */

/* FP8_E4M3 / FP8_E5M2: an engine's 8-bit KV cache (vLLM's --kv-cache-dtype fp8), stored as its
   bytes with the raw codec; a codec that computes on floats refuses it, naming the dtype. */
typedef enum flatkv_dtype {
  FLATKV_DTYPE_F16 = 1,
  FLATKV_DTYPE_BF16 = 2,
  FLATKV_DTYPE_F32 = 3,
  FLATKV_DTYPE_FP8_E4M3 = 4,
  FLATKV_DTYPE_FP8_E5M2 = 5
} flatkv_dtype;

/* What a store is opened with. Defaults are flatkv::StoreOptions' (64-token
 * blocks, 256 MiB DRAM, no SSD); the shape has no default and must be set
 * for an embedded store. Not thread-safe. */
typedef struct flatkv_options flatkv_options;

/* NULL when out of memory. */
flatkv_options* flatkv_options_create(void);
void flatkv_options_destroy(flatkv_options* options);

/* A named shape ("llama-3.1-8b", "llama-3.1-70b", "qwen3-32b",
 * "deepseek-v3", "stories260k", "smollm2-135m"; case-insensitive). Unknown
 * names fail with INVALID_ARGUMENT listing the known ones. */
flatkv_status* flatkv_options_set_shape_preset(flatkv_options* options, const char* name);
/* Multi-head / grouped-query attention: 2 * kv_heads * head_dim elements per token and layer. */
flatkv_status* flatkv_options_set_shape_mha(flatkv_options* options, uint32_t layers, uint32_t kv_heads,
                                            uint32_t head_dim, int32_t dtype);
/* Multi-head latent attention: latent_dim + rope_dim elements per token and layer. */
flatkv_status* flatkv_options_set_shape_mla(flatkv_options* options, uint32_t layers, uint32_t latent_dim,
                                            uint32_t rope_dim, int32_t dtype);
/* Tokens per block, 16..512 (default 64). */
flatkv_status* flatkv_options_set_block_tokens(flatkv_options* options, uint32_t block_tokens);
/* DRAM tier capacity; 0 disables the tier (default 256 MiB). */
flatkv_status* flatkv_options_set_dram_capacity(flatkv_options* options, uint64_t bytes);
/* Adds an SSD directory of `capacity_bytes` (all directories share the last
 * capacity given). Created if missing; reopened warm if it holds a store. */
flatkv_status* flatkv_options_add_ssd_dir(flatkv_options* options, const char* dir, uint64_t capacity_bytes);
/* Size of one preallocated segment file (default 256 MiB; > 0). */
flatkv_status* flatkv_options_set_segment_bytes(flatkv_options* options, uint64_t bytes);
/* Target bytes of one layer's run in a DRAM / SSD extent (default 256 KiB / 2 MiB; > 0). */
flatkv_status* flatkv_options_set_extent_layer_bytes(flatkv_options* options, uint64_t dram_bytes,
                                                     uint64_t ssd_bytes);
/* The same, one medium at a time. */
flatkv_status* flatkv_options_set_dram_extent_layer_bytes(flatkv_options* options, uint64_t bytes);
flatkv_status* flatkv_options_set_ssd_extent_layer_bytes(flatkv_options* options, uint64_t bytes);
/* New extents sized to their session, the extent layer bytes above being
 * the largest (default 1); 0: every extent the largest, as stores before
 * manifest version 5 (an SSD directory keeps the choice it was created with). */
flatkv_status* flatkv_options_set_sized_extents(flatkv_options* options, int32_t enable);
/* Ask for O_DIRECT on segment files (default 1). */
flatkv_status* flatkv_options_set_direct_io(flatkv_options* options, int32_t enable);
/* fdatasync data and manifest after every put (default 0). */
flatkv_status* flatkv_options_set_sync_writes(flatkv_options* options, int32_t enable);
/* Verify checksums of DRAM hits too; SSD hits always are (default 0). */
flatkv_status* flatkv_options_set_verify_dram_reads(flatkv_options* options, int32_t enable);

/* Placement (docs/architecture.md, "Placement and reclaim"; every field's
 * trade-off is in include/flatkv/options.h). */
/* The most DRAM copies one session may hold, bytes; 0 (the default) derives
 * it from the capacities. */
flatkv_status* flatkv_options_set_session_dram_share(flatkv_options* options, uint64_t bytes);
/* DRAM-only stores: a session untouched for `ms` milliseconds is idle and
 * reclaimed first (default 600000; at most 2^63 - 1). */
flatkv_status* flatkv_options_set_dram_idle_after_ms(flatkv_options* options, uint64_t ms);
/* Which blocks a store with an SSD tier writes to SSD. */
typedef enum flatkv_ssd_admission {
  FLATKV_SSD_ADMISSION_ALL = 0,      /* every block, when it is put (the default) */
  FLATKV_SSD_ADMISSION_ON_REUSE = 1  /* a session's blocks once it is reused; DRAM-only until then */
} flatkv_ssd_admission;
flatkv_status* flatkv_options_set_ssd_admission(flatkv_options* options, int32_t admission);
/* A restore that read blocks from SSD re-admits them as the session's DRAM
 * copy (default 1). */
flatkv_status* flatkv_options_set_readmit_on_restore(flatkv_options* options, int32_t enable);
/* Put bytes whose SSD write may still be outstanding before a put waits;
 * 0 (the default) derives it from the capacities. */
flatkv_status* flatkv_options_set_ssd_write_buffer(flatkv_options* options, uint64_t bytes);
/* Manifest log size that starts an online checkpoint (the log is rewritten
 * as a snapshot once past max(bytes, 2 x its last snapshot)); 0: only at
 * close. Default 64 MiB. */
flatkv_status* flatkv_options_set_manifest_checkpoint(flatkv_options* options, uint64_t bytes);

/* I/O. */
/* A restore's window holds max(window_layers, window_bytes / layer bytes)
 * layers (default 4 layers, 32 MiB; layers > 0). */
flatkv_status* flatkv_options_set_window_layers(flatkv_options* options, uint32_t layers);
flatkv_status* flatkv_options_set_window_bytes(flatkv_options* options, uint64_t bytes);
/* Layers a restore reads from SSD at once, at most; layer 0 goes alone
 * first where the model has more (default 16; > 0). */
flatkv_status* flatkv_options_set_ssd_layers_in_flight(flatkv_options* options, uint32_t layers);
/* Coalesced SSD reads are split into requests of at most this many bytes
 * (default 4 MiB; > 0; opening requires a multiple of 4096). */
flatkv_status* flatkv_options_set_max_request_bytes(flatkv_options* options, uint64_t bytes);
typedef enum flatkv_io_engine {
  FLATKV_IO_AUTO = 0,       /* io_uring where the kernel allows it, else the thread pool (the default) */
  FLATKV_IO_URING = 1,      /* io_uring only: opening fails where it is refused */
  FLATKV_IO_THREAD_POOL = 2 /* blocking pread/pwrite on worker threads */
} flatkv_io_engine;
flatkv_status* flatkv_options_set_ssd_io(flatkv_options* options, int32_t engine);
/* io_uring ring entries (default 32; > 0). */
flatkv_status* flatkv_options_set_ssd_queue_depth(flatkv_options* options, uint32_t depth);
/* Worker threads (each > 0): the thread-pool I/O engine's (default 4),
 * copying DRAM hits (default 2), decoding coded blocks (default 4). */
flatkv_status* flatkv_options_set_ssd_threads(flatkv_options* options, uint32_t threads);
flatkv_status* flatkv_options_set_dram_threads(flatkv_options* options, uint32_t threads);
flatkv_status* flatkv_options_set_decode_threads(flatkv_options* options, uint32_t threads);

/* The remote tier (docs/remote.md): a Redis Cluster the nodes of a fleet
 * share. With at least one seed, puts are published there in the
 * background and restores take what the local media miss from there; an
 * unreachable cluster makes flatkv_open fail, naming the seeds. */
/* Adds a cluster node, "host:port" (any node: the slot map comes from the first that answers). */
flatkv_status* flatkv_options_add_remote_seed(flatkv_options* options, const char* host_port);
/* AUTH as `user` (NULL or "": default) with `password` (NULL or "": no AUTH). */
flatkv_status* flatkv_options_set_remote_auth(flatkv_options* options, const char* user, const char* password);
/* TLS to every node, verified against `ca_file` (NULL or "": the system's CAs) unless verify is 0. */
flatkv_status* flatkv_options_set_remote_tls(flatkv_options* options, int32_t enable, const char* ca_file,
                                             int32_t verify);
/* Every name starts "<prefix>:" (default "fkv"); no '{', '}', ':' or spaces. */
flatkv_status* flatkv_options_set_remote_prefix(flatkv_options* options, const char* prefix);
/* One request's timeout (default 1000 ms); a lookup gives up after it. */
flatkv_status* flatkv_options_set_remote_timeout_ms(flatkv_options* options, uint32_t ms);
/* The cluster bytes this store keeps, at most (0, the default: no cap); past it the oldest it published are deleted. */
flatkv_status* flatkv_options_set_remote_capacity(flatkv_options* options, uint64_t bytes);
/* Put data waiting to be published, at most (0, the default: max(256 MiB, DRAM capacity / 16)); of a put
 * that does not fit, the leading blocks that do are published, the rest are not. */
flatkv_status* flatkv_options_set_remote_publish_buffer(flatkv_options* options, uint64_t bytes);

/* Makes flatkv_store_open connect to a daemon instead of opening a store in
 * this process. `address` is "unix:/path/to/socket" or "tcp:host:port";
 * `tenant_token` authenticates the tenant (the daemon salts its keys, so a
 * tenant only ever sees its own blocks). The shape and capacities are the
 * daemon's; the options above are ignored. */
flatkv_status* flatkv_options_set_server(flatkv_options* options, const char* address, const char* tenant_token);
/* For a unix-socket daemon: register a shared-memory window of `bytes` that
 * the daemon fills directly, saving the copy through the socket (0, the
 * default, transfers KV bytes over the socket). */
flatkv_status* flatkv_options_set_shm_window(flatkv_options* options, uint64_t bytes);
/* For a daemon client: one request's deadline (default 10,000 ms: the daemon
 * abandons a request past it, and the client stops waiting for its reply
 * and fails the call, dropping the connection) and the time to connect, hello
 * included (default 5,000 ms). An engine that must not stall behind a slow
 * daemon sets both low: a lookup past its deadline is a miss. */
flatkv_status* flatkv_options_set_server_timeouts(flatkv_options* options, uint32_t deadline_ms,
                                                  uint32_t connect_timeout_ms);

/* ---------------------------------------------------------------- keys */

/* A block's 128-bit chained key (docs/format_keys.md). */
typedef struct flatkv_key {
  uint64_t lo;
  uint64_t hi;
} flatkv_key;

typedef enum flatkv_hash_kind { FLATKV_HASH_XXH3 = 1, FLATKV_HASH_SHA256 = 2 } flatkv_hash_kind;

#define FLATKV_DEFAULT_HASH_SEED UINT64_C(0x666C61746B763031) /* "flatkv01" */

/* A key namespace: the hash and what it binds (model fingerprint, adapter,
 * tenant salt; NULL means ""). Keys from different namespaces never match.
 * Immutable: thread-safe. */
typedef struct flatkv_namespace flatkv_namespace;

flatkv_status* flatkv_namespace_create(int32_t kind, uint64_t seed, const char* model_fingerprint,
                                       const char* adapter_id, const char* tenant_salt, flatkv_namespace** out);
void flatkv_namespace_destroy(flatkv_namespace* ns);
/* The parent of every chain's first block. */
flatkv_key flatkv_namespace_digest(const flatkv_namespace* ns);
/* Keys of the full blocks of `tokens` (n_tokens / block_tokens of them; a
 * trailing partial block gets none), chained from `parent` (NULL: the
 * namespace digest, i.e. the start of a prompt). Writes *n_keys keys;
 * fails with INVALID_ARGUMENT when `keys_capacity` is too small. */
flatkv_status* flatkv_namespace_keys(const flatkv_namespace* ns, const flatkv_key* parent, const uint32_t* tokens,
                                     uint64_t n_tokens, uint32_t block_tokens, flatkv_key* keys,
                                     uint64_t keys_capacity, uint64_t* n_keys);

/* Keys of a serving engine's own block hashes (vLLM's request.block_hashes,
 * SGLang's page hashes: each already covers the whole prefix), n_hashes of
 * hash_bytes bytes each, back to back: keys[i] = H("flatkv-engine-v1" ‖
 * namespace ‖ u64 hash_bytes ‖ hash i) (docs/format_keys.md). Fails with
 * INVALID_ARGUMENT when keys_capacity < n_hashes. */
flatkv_status* flatkv_namespace_engine_keys(const flatkv_namespace* ns, const uint8_t* hashes, uint64_t n_hashes,
                                            uint32_t hash_bytes, flatkv_key* keys, uint64_t keys_capacity);

/* ---------------------------------------------------------------- store */

/* An embedded store or a daemon client. Thread-safe. */
typedef struct flatkv_store flatkv_store;

/* Opens (creating or recovering) an embedded store, or connects to the
 * daemon named by flatkv_options_set_server. `options` may be destroyed
 * afterwards. */
flatkv_status* flatkv_store_open(const flatkv_options* options, flatkv_store** out);
/* Persists the SSD index (embedded) or disconnects. Further calls fail with
 * FAILED_PRECONDITION. Closing twice is OK. */
flatkv_status* flatkv_store_close(flatkv_store* store);
/* Closes (ignoring errors) and frees. Restores still alive keep what they
 * need alive until they are destroyed. */
void flatkv_store_destroy(flatkv_store* store);

/* The geometry blocks are exchanged in; 0 for NULL. A block is
 * `layers` consecutive layer slices of block_layer_bytes each. */
uint32_t flatkv_store_layers(const flatkv_store* store);
uint32_t flatkv_store_block_tokens(const flatkv_store* store);
uint64_t flatkv_store_block_layer_bytes(const flatkv_store* store);
uint64_t flatkv_store_block_bytes(const flatkv_store* store);
/* The element type of the store's shape (an engine checks it against its KV cache's: f16 and
 * bf16 blocks have the same size); 0 for NULL. */
flatkv_dtype flatkv_store_dtype(const flatkv_store* store);

/* How many leading keys of `keys` are stored (no data I/O). */
flatkv_status* flatkv_store_match(flatkv_store* store, const flatkv_key* keys, uint64_t n_keys, uint32_t* n_hit);

/* Put flags: at most one placement hint (none: the store decides). */
#define FLATKV_PUT_ONE_SHOT UINT32_C(1) /* the blocks will not be reused soon: place them on SSD */
#define FLATKV_PUT_HOT UINT32_C(2)      /* the blocks will be reused soon: DRAM if the session's share allows */

/* Stores `n_keys` blocks for `session`. `data` is the blocks back to back,
 * exactly n_keys * flatkv_store_block_bytes bytes. Blocks already stored are
 * skipped. On error nothing stored before is lost. */
flatkv_status* flatkv_store_put(flatkv_store* store, uint64_t session, const flatkv_key* keys, uint64_t n_keys,
                                const void* data, uint64_t data_bytes, uint32_t flags);

/* Where a restore puts block b's slice of layer l in caller memory. */
typedef enum flatkv_layout {
  /* dst + b * block_bytes + l * block_layer_bytes: put's layout. */
  FLATKV_LAYOUT_BLOCK_MAJOR = 0,
  /* dst + l * n_keys * block_layer_bytes + b * block_layer_bytes: every
   * layer contiguous, so SSD reads land in place when dst is 4 KiB aligned. */
  FLATKV_LAYOUT_LAYER_MAJOR = 1
} flatkv_layout;

/* Restores the longest stored prefix of `keys` into `dst` (at least
 * n_keys * block_bytes bytes, laid out by `layout`) and waits for it.
 * *n_restored is the number of leading blocks valid in every layer. */
flatkv_status* flatkv_store_restore(flatkv_store* store, const flatkv_key* keys, uint64_t n_keys, void* dst,
                                    uint64_t dst_bytes, int32_t layout, uint32_t* n_restored);

/* A restore in flight, consumed layer by layer: wait for layer l, use it,
 * release it (which lets a later layer load). Used by one thread at a time. */
typedef struct flatkv_restore flatkv_restore;

/* Starts restoring the longest stored prefix of `keys`. With `dst` (laid
 * out as in flatkv_store_restore) the layers land there; with dst == NULL
 * (and dst_bytes 0) they land in the store's window and
 * flatkv_restore_wait_layer hands out a pointer to each. */
flatkv_status* flatkv_store_restore_start(flatkv_store* store, const flatkv_key* keys, uint64_t n_keys, void* dst,
                                          uint64_t dst_bytes, int32_t layout, flatkv_restore** out);
/* Leading blocks found when the restore began; 0 for NULL. */
uint32_t flatkv_restore_hit_blocks(const flatkv_restore* restore);
/* Waits until `layer` has landed. *blocks: leading blocks valid in it.
 * *data (may be NULL): with a window, `blocks` slices of this layer back to
 * back, valid until the layer is released; with dst, NULL. Layers are
 * waited for in order; one beyond the window before earlier ones are
 * released fails with FAILED_PRECONDITION instead of deadlocking. */
flatkv_status* flatkv_restore_wait_layer(flatkv_restore* restore, uint32_t layer, const void** data,
                                         uint32_t* blocks);
flatkv_status* flatkv_restore_release_layer(flatkv_restore* restore, uint32_t layer);
/* Waits for every layer still loading; *n_valid: blocks valid in every layer. */
flatkv_status* flatkv_restore_finish(flatkv_restore* restore, uint32_t* n_valid);
/* Waits for the restore's I/O and frees it. */
void flatkv_restore_destroy(flatkv_restore* restore);

/* Frees every block of `session`. */
flatkv_status* flatkv_store_drop_session(flatkv_store* store, uint64_t session);

/* Releases the blocks of `session` beyond the first `keep_blocks` of its
 * chain (the order its puts carried them, blocks it shares included), for
 * an agent that rewrote its history; blocks another live session references
 * stay. *n_released (may be NULL): the blocks taken out of the index. Its
 * next put goes on from `keep_blocks`. NOT_FOUND for a session with no
 * blocks. Against a daemon it needs protocol version 4. */
flatkv_status* flatkv_store_truncate_session(flatkv_store* store, uint64_t session, uint32_t keep_blocks,
                                             uint32_t* n_released);

/* Keeps the stored prefix of `keys` (and its DRAM copies) from eviction for
 * `ttl_ms` from now; a later, longer retain extends it, ttl_ms 0 releases
 * it. *n_retained: the leading blocks retained, fewer than stored when
 * retained extents would pass half of a medium or, against a daemon, when
 * the tenant's pin budget (limits.tenant_pinned_bytes, shared with its
 * restores in flight) runs out; the daemon also caps ttl_ms at
 * limits.max_retain_ms. Against a daemon it needs protocol version 4. */
flatkv_status* flatkv_store_retain(flatkv_store* store, const flatkv_key* keys, uint64_t n_keys, uint32_t ttl_ms,
                                   uint32_t* n_retained);

/* Starts bringing the DRAM copies of the longest stored prefix of `keys` in
 * ahead of the restore that will need them, and returns without waiting:
 * *n_found is the leading blocks stored. Blocks held on SSD alone are read
 * in the background into their session's DRAM copy where DRAM has room;
 * those already in DRAM cost nothing. A hint: when too many prefetches run
 * it only counts ("prefetch_skipped" in the stats). Against a daemon it
 * needs protocol version 3 (NOT_SUPPORTED names the daemon's version). */
flatkv_status* flatkv_store_prefetch(flatkv_store* store, const flatkv_key* keys, uint64_t n_keys, uint32_t* n_found);

/* Counters of one medium (flatkv::MediumStats). */
typedef struct flatkv_medium_stats {
  uint64_t capacity_bytes;
  uint64_t used_bytes;
  uint64_t blocks;
  uint64_t hit_blocks;
  uint64_t bytes_written;
  uint64_t bytes_read;
  uint64_t bytes_delivered;
  uint64_t evicted_blocks;
} flatkv_medium_stats;

typedef struct flatkv_stats {
  flatkv_medium_stats dram;
  flatkv_medium_stats ssd;
  uint64_t sessions;
  uint64_t restores;
  uint64_t lookup_blocks;
  uint64_t miss_blocks;
  uint64_t put_blocks;
  uint64_t dedup_blocks;
  uint64_t checksum_failures;
  uint64_t io_errors;
  uint64_t recovered_blocks;
  uint64_t lost_blocks;
  double restore_p50_us;
  double restore_p99_us;
} flatkv_stats;

/* A snapshot of the store's counters (a daemon's: those of the whole daemon
 * as far as it reports them). */
flatkv_status* flatkv_store_stats(flatkv_store* store, flatkv_stats* out);
/* The full counters as one JSON object, NUL-terminated in `buf`.
 * *needed: the bytes the text takes with its NUL. With buf NULL and
 * capacity 0 only *needed is set; a smaller capacity fails with
 * INVALID_ARGUMENT and writes nothing. */
flatkv_status* flatkv_store_stats_json(flatkv_store* store, char* buf, uint64_t capacity, uint64_t* needed);

/* The options the store runs with, as one JSON object NUL-terminated in
 * `buf` (the StoreOptions field names: "dram_capacity_bytes",
 * "session_dram_share_bytes", "dram_idle_after_ms", "ssd_admission":
 * "all" | "on-reuse", ...; docs/c_api.md). A daemon client reports the
 * daemon's store, with "ssd_dirs" the number of its directories. Buffer
 * convention as flatkv_store_stats_json. */
flatkv_status* flatkv_store_options_json(flatkv_store* store, char* buf, uint64_t capacity, uint64_t* needed);

/* ---------------------------------------------------------------- chunks */

/* Reuse of a chunk (a retrieved document, a tool output, a file) wherever
 * it sits in a prompt, behind any prefix (docs/blend.md, "The C and Python
 * API"). A chunk's keys hash the namespace and the chunk's own tokens only,
 * and its trailing partial block gets a key too. Its KV is computed on its
 * own, at positions 0..n-1, and stored with K *before* RoPE, so that a
 * restore can place it at any positions by rotating K there. Which of the
 * placed tokens to recompute (CacheBlend's selection) is the engine's work.
 *
 * A chunk's KV in caller memory ("chunk rows", the layout of every call
 * below): layer l of an n-token chunk starts at l * n * token_layer_bytes,
 * where token_layer_bytes = flatkv_store_token_layer_bytes(store); in it,
 * MHA/GQA: n rows of K, then n rows of V, each row one token's
 * kv_heads * head_dim elements (head-major) in the store's dtype;
 * MLA: n rows of latent_dim + rope_dim elements, the RoPE key last. In the
 * store a chunk block's layer slice holds its block_tokens rows the same way
 * (K rows then V rows), the tail of a partial block zero-filled. */

/* Keys of a chunk of n_tokens (>= 1): ceil(n_tokens / block_tokens) of
 * them, the last covering the partial block. Fails with INVALID_ARGUMENT
 * when keys_capacity is too small. */
flatkv_status* flatkv_namespace_chunk_keys(const flatkv_namespace* ns, const uint32_t* tokens, uint64_t n_tokens,
                                           uint32_t block_tokens, flatkv_key* keys, uint64_t keys_capacity,
                                           uint64_t* n_keys);
/* The session a chunk is stored under, from its first chunk key (its low
 * word with the top bit set); flatkv_store_drop_session frees the chunk. */
uint64_t flatkv_chunk_session(flatkv_key first_chunk_key);

/* Prefix-cache pruning (flatkv/prune.h, docs/c_api.md): a pruned view of a
 * stored chain holds only the KV rows of the tokens outside the removed
 * ranges [begin, end) (sorted, disjoint, within n_keys * block_tokens, at
 * least one token kept), packed in order, each block's slice laid out as a
 * chain block's (K rows then V rows; MLA: one row per token), the last
 * block's tail zero-filled. It is a session of its own, found only by
 * requests that name the same ranges: their keys are
 * flatkv_prune_view_keys of the logical chain's last key. */
typedef struct flatkv_token_range {
  uint32_t begin;
  uint32_t end;
} flatkv_token_range;

typedef struct flatkv_prune_result {
  uint64_t view_session;   /* the session the view is stored under (flatkv_store_drop_session frees it) */
  uint32_t logical_blocks; /* blocks of the chain the view covers (n_keys) */
  uint32_t kept_tokens;    /* tokens whose KV the view holds */
  uint32_t view_blocks;    /* ceil(kept_tokens / block_tokens) */
  uint32_t stored_blocks;  /* view blocks this call wrote (0: the view existed) */
} flatkv_prune_result;

/* Stores the pruned view of the chain `keys` (every block must be stored:
 * NOT_FOUND says how many are, unless the view exists already: then
 * nothing is written and stored_blocks is 0). The chain's own blocks stay
 * until their session is dropped. *result may be NULL; it is zeroed on
 * failure. Against a daemon it needs protocol version 6; the view is built
 * there. */
flatkv_status* flatkv_store_prune(flatkv_store* store, const flatkv_key* keys, uint64_t n_keys,
                                  const flatkv_token_range* ranges, uint64_t n_ranges, flatkv_prune_result* result);
/* The keys of the view of a chain of `logical_blocks` blocks whose last key
 * is `last_key`, without `ranges`: ceil(kept / block_tokens) of them.
 * INVALID_ARGUMENT for a bad prune set or when keys_capacity is too small.
 * Look them up and restore them like any keys (flatkv_store_match,
 * flatkv_store_restore); a whole view matches all of them. */
flatkv_status* flatkv_prune_view_keys(flatkv_key last_key, uint32_t logical_blocks, const flatkv_token_range* ranges,
                                      uint64_t n_ranges, uint32_t block_tokens, flatkv_key* keys,
                                      uint64_t keys_capacity, uint64_t* n_keys);

/* Bytes of one token's slice of one layer (2 * kv_heads * head_dim or
 * latent_dim + rope_dim elements); 0 for NULL. A chunk of n tokens takes
 * layers * n * this many bytes in chunk rows. */
uint64_t flatkv_store_token_layer_bytes(const flatkv_store* store);

/* Stores a chunk: `tokens` (n_tokens >= 1) and its KV in chunk rows,
 * exactly layers * n_tokens * token_layer_bytes bytes, computed on its own
 * at positions 0..n_tokens-1 with K before RoPE. Put flags as
 * flatkv_store_put. Blocks already stored are skipped. */
flatkv_status* flatkv_store_put_chunk(flatkv_store* store, const flatkv_namespace* ns, const uint32_t* tokens,
                                      uint64_t n_tokens, const void* data, uint64_t data_bytes, uint32_t flags);

/* One chunk of a prompt: tokens[begin, begin + length). */
typedef struct flatkv_chunk {
  uint64_t begin;
  uint64_t length;
} flatkv_chunk;

/* Which chunks of a prompt are cached (no data I/O): cached_tokens[i] is
 * chunks[i].length when all of chunk i is stored, else the tokens of its
 * leading stored whole blocks (a multiple of block_tokens; 0 on a miss).
 * Chunks must lie inside tokens[0, n_tokens) and be non-empty; they may
 * overlap and come in any order. */
flatkv_status* flatkv_store_lookup_chunks(flatkv_store* store, const flatkv_namespace* ns, const uint32_t* tokens,
                                          uint64_t n_tokens, const flatkv_chunk* chunks, uint64_t n_chunks,
                                          uint64_t* cached_tokens);

/* How the model applies RoPE to keys, for re-rotation. Frequency f of a
 * head rotates a pair by pos * theta^(-2f / rotary_dim). */
typedef enum flatkv_rope_style {
  FLATKV_ROPE_INTERLEAVED = 1, /* pairs (2f, 2f + 1): llama2.c, Meta's llama, GPT-J */
  FLATKV_ROPE_NEOX = 2         /* pairs (f, f + rotary_dim / 2): GPT-NeoX, Hugging Face / vLLM llama */
} flatkv_rope_style;

typedef struct flatkv_rope {
  double theta;        /* base, > 0 (10000 for llama 2, 500000 for llama 3) */
  uint32_t rotary_dim; /* leading elements of each head rotated, even; 0: the whole head (MLA: the RoPE key) */
  int32_t style;       /* flatkv_rope_style */
} flatkv_rope;
/* Frequency scaling (llama 3.1's, YaRN, NTK) is not modelled: for such a
 * model restore with rope NULL and rotate with the model's own kernel. */

/* Restores a chunk into `dst` (chunk rows of n_tokens, at least layers *
 * n_tokens * token_layer_bytes bytes) with its keys rotated to positions
 * pos0 .. pos0 + n_tokens - 1 by `rope`; rope NULL delivers K as stored,
 * before RoPE. V is delivered as stored. In f16/bf16 a rotated key is
 * computed in float and rounded to nearest; in f32 it is bit for bit the
 * key a prefill with the same RoPE writes. *n_restored: the leading tokens
 * valid in dst (n_tokens when the chunk is wholly stored, whole blocks
 * otherwise, 0 on a miss); rows past them are left as they were. */
flatkv_status* flatkv_store_restore_chunk(flatkv_store* store, const flatkv_namespace* ns, const uint32_t* tokens,
                                          uint64_t n_tokens, const flatkv_rope* rope, uint64_t pos0, void* dst,
                                          uint64_t dst_bytes, uint64_t* n_restored);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLATKV_FLATKV_H_ */
