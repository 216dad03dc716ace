/* test/fuzz/fuzz_harness.h — what the DHT fuzz targets feed, and how.
 *
 * Each input gets a fresh dht (no state carries over between inputs, so a
 * crash replays from its input alone) whose random source is seeded, so the
 * transaction IDs of the bootstrap requests it sends are always the same and
 * the fuzzer (helped by the seed corpus) can write replies that match them.
 * The node holds one record (FIND_VALUE has something to return) and has
 * three bootstrap requests outstanding (NODES replies have a request to
 * match). The input is then delivered as if sent by one of those peers or by
 * a stranger, and the clock is moved past every timeout.
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
/* The key of the record the node holds. */
void fuzz_record_key(gw_id *out);

#endif
