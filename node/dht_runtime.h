/* node/dht_runtime.h — a dht (dht/dht.h) running for real on a libuv loop.
 *
 * The runtime is the DHT's driver: its gw_io sends through a p2p_udp
 * endpoint (p2p/udp.h), asks for ticks with one uv_timer_t, and draws random
 * bytes from libsodium; datagrams that verify are handed to dht_on_message
 * with the loop's clock (uv_now). It also keeps the contacts file
 * (<data_dir>/dht-contacts: the most recently seen good contacts, one
 * "<node-id-hex> <ip:port>" per line, written atomically) so that a restart
 * joins through the peers it knew rather than only the bootstrap peers, and
 * it logs bad datagrams (rate-limited) and, if asked, periodic statistics.
 *
 * `gwtf node`, `gwtf lookup` and `gwtf bench dht` all run their DHT through
 * this; many runtimes may share one loop. */
#ifndef GWTF_NODE_DHT_RUNTIME_H
#define GWTF_NODE_DHT_RUNTIME_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "dht/dht.h"
#include "p2p/udp.h"

#define DHT_RT_CONTACTS_FILE "dht-contacts"
#define DHT_RT_CONTACTS_MAX (128)            /* contacts saved */
#define DHT_RT_SAVE_MS (5 * 60 * 1000)       /* contacts file refresh */

typedef struct dht_runtime dht_runtime;

typedef struct dht_runtime_config {
  gw_addr bind;             /* UDP address; a node uses its --listen address (same port as TCP) */
  const char *data_dir;     /* where the contacts file lives; NULL: no file */
  const gw_peer *bootstrap; /* resolved bootstrap peers; IDs may be zero */
  size_t n_bootstrap;
  /* DHT tunables, log and on_joined; the runtime fills in me, io and seq_base. */
  dht_config dht;
  uint64_t stats_every_ms;  /* log a dht.stats line this often; 0: never */
} dht_runtime_config;

/* Opens the endpoint, creates the dht and starts joining (through the saved
 * contacts and the bootstrap peers). me must outlive the runtime. Returns 0
 * or a negative code (a UV_E* code when the port cannot be bound; after a
 * failure past the bind, the loop must run once to release the handles). */
int dht_runtime_start(uv_loop_t *loop, const p2p_identity *me, const dht_runtime_config *cfg,
                      dht_runtime **out);
/* Saves the contacts, closes the socket and the timers, and frees the dht
 * once the loop has run (pending lookups then call back with GW_ECLOSED).
 * Safe to call from inside a DHT callback. */
void dht_runtime_stop(dht_runtime *rt);

dht *dht_runtime_dht(dht_runtime *rt);
p2p_udp *dht_runtime_udp(dht_runtime *rt);
/* The clock the dht runs on: pass it as now_ms to dht_* calls. */
uint64_t dht_runtime_now(const dht_runtime *rt);
/* Writes the contacts file now (also done every DHT_RT_SAVE_MS, on joining
 * and on stop). GW_ENOENT without a data dir. */
int dht_runtime_save_contacts(dht_runtime *rt);

/* Reads a contacts file: up to max entries into out, skipping lines that do
 * not parse. Returns 0 (a missing file is 0 entries) or a negative code. */
int dht_runtime_load_contacts(const char *path, gw_peer *out, size_t max, size_t *n);

#endif
