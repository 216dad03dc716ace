/* sim/sim.h — a deterministic discrete-event network for protocol state machines.
 *
 * Nodes are protocol instances (DHT, flow) registered with two callbacks; the
 * engine gives each one a gw_io (util/io.h) whose sends become delivery
 * events on a virtual clock. Delay, loss and crashes come from one seeded
 * generator, so a run with the same seed and inputs replays exactly — the
 * basis of every simulated test and of `gwtf sim`.
 *
 * Delivery order is (time, sequence number): ties resolve in the order events
 * were scheduled, never by pointer values or hash order.
 *
 *   sim *s = sim_new(&(sim_config){.seed = 7, .delay_min_ms = 5, .delay_max_ms = 20});
 *   int i = sim_add_node(s, &peer, &ops, my_proto);
 *   my_proto = proto_new(sim_io(s, i), ...);      // the io can be taken before the node exists
 *   sim_run_until(s, 60000);
 */
#ifndef GWTF_SIM_SIM_H
#define GWTF_SIM_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/addr.h"
#include "util/io.h"
#include "util/rng.h"

typedef struct sim sim;

typedef struct sim_node_ops {
  void (*on_message)(void *node, const gw_peer *from, const uint8_t *buf, size_t len, uint64_t now_ms);
  void (*on_tick)(void *node, uint64_t now_ms);
} sim_node_ops;

/* With sim_config.session_notice: `peer`, a node that `node` had a session
 * with, crashed (the transport's RST/EOF reached `node`). */
typedef void (*sim_peer_down_fn)(void *ud, void *node, const gw_peer *peer, uint64_t now_ms);

/* Per-message delay in ms; overrides the uniform [delay_min, delay_max]. */
typedef uint64_t (*sim_delay_fn)(void *ud, int from, int to, size_t len, gw_rng *rng);

typedef struct sim_config {
  uint64_t seed;
  uint64_t delay_min_ms; /* uniform per-message delay; default 1 */
  uint64_t delay_max_ms; /* default = delay_min_ms */
  double loss;           /* probability that a message is dropped */
  size_t max_message;    /* larger sends are refused with GW_ERANGE (0: no limit) */
  bool fifo;             /* per (sender, receiver) order is kept, as on a TCP session;
                            otherwise messages may overtake each other, as datagrams do */
  bool session_notice;   /* a crash is a process crash on live sessions: every node that
                            exchanged a message with the crashed one (both ways count; a
                            session stays up once a message made it) is told (sim_set_peer_down_fn) one
                            message delay later, as a TCP RST/EOF arrives. Never lost: a lost
                            RST is found by the next write. Off: crashes are silent */
} sim_config;

typedef struct sim_stats {
  uint64_t sent, delivered, dropped_loss, dropped_dead, dropped_unknown, refused_size;
  uint64_t bytes_sent, max_message_bytes;
} sim_stats;

sim *sim_new(const sim_config *cfg);
void sim_free(sim *s);

/* Registers a node. peer->id and peer->addr must be unique among live nodes
 * (messages are routed by id when it is non-zero, else by address). node is
 * passed to ops; it may be set later with sim_set_node. Returns the index. */
int sim_add_node(sim *s, const gw_peer *peer, const sim_node_ops *ops, void *node);
void sim_set_node(sim *s, int index, void *node);
int sim_node_count(const sim *s);
const gw_peer *sim_peer(const sim *s, int index);
/* The io handle for node `index`; valid for the life of the sim. */
gw_io sim_io(sim *s, int index);

/* A crashed node stops: its pending messages and ticks are dropped, nothing
 * reaches it, and its sends are ignored. It stays registered (indices are
 * stable) and its address is not reused. With cfg.session_notice its
 * session partners are told (sim_set_peer_down_fn) one delay later. */
void sim_crash(sim *s, int index);
bool sim_alive(const sim *s, int index);

/* The crash of `from` reaches `node` as a session's end does over TCP:
 * after every message `from` sent it that is still in flight (cfg.fifo;
 * at once without one in flight), through sim_set_peer_down_fn's callback.
 * Returns 1 when the notice was scheduled for later, 0 when nothing of
 * `from`'s is in flight to `node` (the caller tells it now). */
int sim_notice_down_after_in_flight(sim *s, int node, int from);

void sim_set_delay_fn(sim *s, sim_delay_fn fn, void *ud);
/* Who hears of a crash under cfg.session_notice (NULL: nobody). */
void sim_set_peer_down_fn(sim *s, sim_peer_down_fn fn, void *ud);
/* Counts per node, for message-overhead figures. */
uint64_t sim_node_sent(const sim *s, int index);
uint64_t sim_node_bytes_sent(const sim *s, int index);

uint64_t sim_now(const sim *s);
/* Runs events with time <= t_ms, then sets the clock to t_ms. Returns the
 * number of events processed. */
uint64_t sim_run_until(sim *s, uint64_t t_ms);
/* Runs until pred(ud) is true (checked after each event) or the clock passes
 * deadline_ms. Returns true when pred became true. */
bool sim_run_while_not(sim *s, bool (*pred)(void *ud), void *ud, uint64_t deadline_ms);
/* Runs a single event; false when none is pending. */
bool sim_step(sim *s);
/* Inject a message as if `from` had sent it (tests of hostile input). */
int sim_inject(sim *s, int from, int to, const uint8_t *buf, size_t len);

const sim_stats *sim_get_stats(const sim *s);
/* The engine's generator, for scenario decisions that must replay too. */
gw_rng *sim_rng(sim *s);

#endif
