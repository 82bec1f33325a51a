/* connector.c: how a serving engine would use flatkv through the C API.
 *
 * The engine keeps its KV cache in pages laid out [layer][block] (layer-major,
 * 4 KiB aligned), hashes each prompt into block keys, asks the store how much
 * of the prompt it holds, restores that prefix layer by layer straight into
 * its pages (computing layer l as soon as it has landed), prefills the rest,
 * and puts the newly completed blocks back.
 *
 * Usage: flatkv_example_connector [SSD_DIR | unix:/path | tcp:host:port [TOKEN]]
 * With no argument the store is embedded and DRAM-only. */
#define _XOPEN_SOURCE 700
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flatkv/flatkv.h"

#define MAX_BLOCKS 64

static int failed(flatkv_status* st, const char* what) {
  if (st == NULL) return 0;
  fprintf(stderr, "%s: %s\n", what, flatkv_status_message(st));
  flatkv_status_destroy(st);
  return 1;
}

/* The engine's "prefill" of one layer of one block: deterministic fake KV. */
static void compute_layer(uint8_t* page, uint64_t bytes, uint32_t layer, const flatkv_key* key) {
  for (uint64_t i = 0; i < bytes; ++i) page[i] = (uint8_t)(key->lo + 31 * layer + i);
}

/* Serves one prompt; returns the number of blocks reused from the store, or -1. */
static int serve(flatkv_store* store, const flatkv_namespace* ns, uint64_t session, const uint32_t* tokens,
                 uint64_t n_tokens, uint8_t* pages) {
  const uint32_t layers = flatkv_store_layers(store);
  const uint64_t lb = flatkv_store_block_layer_bytes(store), bb = flatkv_store_block_bytes(store);
  flatkv_key keys[MAX_BLOCKS];
  uint64_t n = 0;
  if (failed(flatkv_namespace_keys(ns, NULL, tokens, n_tokens, flatkv_store_block_tokens(store), keys, MAX_BLOCKS, &n),
             "keys"))
    return -1;

  /* Restore the stored prefix into the pages, layer by layer. */
  flatkv_restore* r = NULL;
  if (failed(flatkv_store_restore_start(store, keys, n, pages, n * bb, FLATKV_LAYOUT_LAYER_MAJOR, &r), "restore"))
    return -1;
  for (uint32_t l = 0; l < layers; ++l) {
    uint32_t have = 0;
    if (failed(flatkv_restore_wait_layer(r, l, NULL, &have), "wait")) break;
    for (uint64_t b = have; b < n; ++b) compute_layer(pages + (l * n + b) * lb, lb, l, &keys[b]);
    flatkv_status_destroy(flatkv_restore_release_layer(r, l));
  }
  uint32_t reused = 0;
  flatkv_status* st = flatkv_restore_finish(r, &reused);
  flatkv_restore_destroy(r);
  if (failed(st, "finish")) return -1;

  /* Put the new blocks back (block-major, as put takes them). */
  if (reused < n) {
    uint8_t* blocks = malloc((n - reused) * bb);
    for (uint64_t b = reused; b < n; ++b)
      for (uint32_t l = 0; l < layers; ++l) memcpy(blocks + (b - reused) * bb + l * lb, pages + (l * n + b) * lb, lb);
    st = flatkv_store_put(store, session, keys + reused, n - reused, blocks, (n - reused) * bb, 0);
    free(blocks);
    if (failed(st, "put")) return -1;
  }
  return (int)reused;
}

int main(int argc, char** argv) {
  flatkv_options* o = flatkv_options_create();
  int bad = failed(flatkv_options_set_shape_preset(o, "stories260k"), "shape") ||
            failed(flatkv_options_set_block_tokens(o, 16), "block tokens") ||
            failed(flatkv_options_set_dram_capacity(o, 16u << 20), "dram");
  if (!bad && argc > 1 && (strncmp(argv[1], "unix:", 5) == 0 || strncmp(argv[1], "tcp:", 4) == 0))
    bad = failed(flatkv_options_set_server(o, argv[1], argc > 2 ? argv[2] : ""), "server");
  else if (!bad && argc > 1)
    bad = failed(flatkv_options_add_ssd_dir(o, argv[1], 64u << 20), "ssd dir");
  flatkv_store* store = NULL;
  if (bad || failed(flatkv_store_open(o, &store), "open")) return 1;
  flatkv_options_destroy(o);
  flatkv_namespace* ns = NULL;
  if (failed(flatkv_namespace_create(FLATKV_HASH_XXH3, FLATKV_DEFAULT_HASH_SEED, "stories260k", NULL, NULL, &ns),
             "namespace"))
    return 1;

  /* Two turns of one conversation: the second re-sends the first and adds to it. */
  uint32_t tokens[48 * 16];
  for (uint32_t i = 0; i < 48 * 16; ++i) tokens[i] = (i * 7919u) % 512u;
  uint8_t* pages = NULL;
  if (posix_memalign((void**)&pages, 4096, 48 * flatkv_store_block_bytes(store)) != 0) return 1;
  const int first = serve(store, ns, 1, tokens, 32 * 16 + 5, pages);
  const int second = serve(store, ns, 1, tokens, 48 * 16, pages);
  printf("turn 1 reused %d of 32 blocks, turn 2 reused %d of 48 blocks\n", first, second);
  free(pages);
  flatkv_namespace_destroy(ns);
  flatkv_store_destroy(store);
  return first >= 0 && second == 32 ? 0 : 1;
}
