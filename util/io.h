/* util/io.h — the driver contract shared by the protocol state machines.
 *
 * dht/ and flow/ (and the training protocol in train/) never touch a socket,
 * the wall clock or a global. Their driver hands them messages and ticks:
 *
 *     xxx_on_message(x, from, buf, len, now_ms);   // one whole message
 *     xxx_on_tick(x, now_ms);                      // a timer they asked for fired
 *
 * and they act on the world only through the gw_io they were created with.
 * node/ implements gw_io over libuv (UDP for the DHT, encrypted TCP sessions
 * for the rest); sim/ implements it over a seeded virtual network, so the very
 * same code runs thousands of nodes deterministically in one process.
 *
 * `now_ms` is milliseconds on the driver's monotonic clock (virtual in the
 * simulator); protocols compare times only with times they were given. */
#ifndef GWTF_UTIL_IO_H
#define GWTF_UTIL_IO_H

#include <stddef.h>
#include <stdint.h>

#include "util/addr.h"

typedef struct gw_io {
  void *ud;
  /* Sends one message. Datagram protocols (the DHT) address by to->addr and
   * may leave to->id zero (a bootstrap address whose owner is not yet known);
   * session protocols (flow, training) address by to->id. A failed send is
   * reported as a negative code and otherwise behaves like a lost message. */
  int (*send)(void *ud, const gw_peer *to, const uint8_t *buf, size_t len);
  /* Asks for an on_tick call at or soon after at_ms. The earliest pending
   * request wins; a protocol re-arms from inside each tick. */
  void (*want_tick)(void *ud, uint64_t at_ms);
  /* Random bytes: libsodium in the node, a seeded generator in the simulator
   * (so runs replay). Transaction IDs and flow IDs come from here. */
  void (*random)(void *ud, void *buf, size_t len);
} gw_io;

#endif
