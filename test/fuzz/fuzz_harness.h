/* test/fuzz/fuzz_harness.h — what the DHT fuzz targets feed, and how.
 *
 * Each input gets a fresh dht (no state carries over between inputs, so a
 * crash replays from its input alone) whose random source is seeded, so the
 * transaction IDs of the requests it sends are always the same and the
 * fuzzer (helped by the seed corpus) can write replies that match them.
 * Before the input arrives the node has joined through three seeds (the
 * harness answers its bootstrap requests), holds its own record, and has a
 * STORE, a FIND_VALUE and a FIND_NODE outstanding to each seed, so replies of
 * every kind have a request to match. The input is then delivered as if sent
 * by one of the seeds or by a stranger, and the clock is moved past every
 * timeout.
 *
 *   fuzz_dht_payload: byte 0 picks the sender, the rest is a DhtMessage.
 *   fuzz_datagram:    a whole UDP datagram: framing and signature checks
 *                     (p2p/udp.h), then the payload goes to the dht as if
 *                     its signature had verified. */
#ifndef GWTF_TEST_FUZZ_HARNESS_H
#define GWTF_TEST_FUZZ_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include "p2p/identity.h"
#include "util/addr.h"

#define FUZZ_SEEDS (3)

/* A request the node sent. */
typedef struct fuzz_request {
  gw_peer to;
  int kind;
  uint64_t txid;
} fuzz_request;

/* Called for every message the dht sends (the corpus generator reads the
 * transaction IDs this way); may be NULL. */
typedef void (*fuzz_sent_fn)(void *ud, const gw_peer *to, const uint8_t *buf, size_t len);

/* Builds the node described above, delivers payload from sender `who`
 * (0..FUZZ_SEEDS-1: a bootstrap peer; anything else: a stranger), runs the
 * timers, frees everything. */
void fuzz_feed_payload(uint8_t who, const uint8_t *payload, size_t len, fuzz_sent_fn sent, void *ud);

int fuzz_dht_payload(const uint8_t *data, size_t size);
int fuzz_datagram(const uint8_t *data, size_t size);

/* The peers the harness uses and their keys, for the corpus generator. */
const gw_peer *fuzz_seed_peer(unsigned i);
const gw_peer *fuzz_stranger(void);
const gw_peer *fuzz_node(void);
const p2p_identity *fuzz_seed_identity(unsigned i);
const p2p_identity *fuzz_stranger_identity(void);
/* The key of the record the node holds (and fetches), and the target of its
 * node lookup. */
void fuzz_record_key(gw_id *out);
void fuzz_lookup_target(gw_id *out);
/* The requests the node has sent when the input arrives, in order. */
size_t fuzz_outstanding(fuzz_request *out, size_t max);

#endif
