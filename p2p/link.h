/* p2p/link.h — link emulation: latency and bandwidth per destination.
 *
 * The kernel's netem is not available to us, so the transport shapes its own
 * sends, the way the GWTF paper emulated geo-distributed links:
 *
 *   p2p_links    a parsed links file (docs/LINKS.md): per-region matrices,
 *                per-pair overrides, and which node sits in which region
 *                (by node ID or listen address);
 *   p2p_shaper   one direction of one link: a token bucket (bandwidth,
 *                burst) followed by a fixed delay (latency). Pure arithmetic
 *                on a clock the caller passes in;
 *   p2p_delayq   a timer-driven queue on the libuv loop that releases items
 *                (datagrams) at the times a shaper computed.
 *
 * The TCP session pumps its own write queue with a shaper (p2p/session.c);
 * a datagram endpoint pushes each datagram through a p2p_delayq. Only the
 * sending side shapes, so every node of an emulated swarm loads the same
 * file and each direction gets its own row of the matrix. */
#ifndef GWTF_P2P_LINK_H
#define GWTF_P2P_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "util/addr.h"
#include "util/id.h"

#define P2P_LINK_BURST_DEFAULT ((uint32_t)64 << 10)
#define P2P_LINKS_MAX_REGIONS (256)

typedef struct p2p_link_params {
  double latency_ms;     /* one-way delay added to every byte, >= 0 */
  double bandwidth_bps;  /* bits per second; 0 = unlimited */
  uint32_t burst_bytes;  /* token bucket depth: bytes that may leave back to back */
} p2p_link_params;

/* ---- the links file ---- */

typedef struct p2p_links p2p_links;

/* Parses a links file. bw_scale > 0 replaces the file's "bandwidth_scale"
 * (e.g. 1/32 as in the GWTF paper's experiments). On error returns
 * GW_EINVAL (or a file error) with a message in err naming the problem. */
int p2p_links_load(const char *path, double bw_scale, p2p_links **out, char *err, size_t err_len);
int p2p_links_parse(const char *json, size_t len, double bw_scale, p2p_links **out, char *err, size_t err_len);
void p2p_links_free(p2p_links *l);

/* The region of a node (by its ID or listen address), or NULL. addr may be
 * NULL or unset (family 0). */
const char *p2p_links_region(const p2p_links *l, const gw_id *id, const gw_addr *addr);
/* Parameters for bytes sent from node a to node b: the first matching pair
 * rule, else the region matrix, else the default. Returns true when a pair
 * or region rule applied. */
bool p2p_links_lookup(const p2p_links *l, const gw_id *a_id, const gw_addr *a_addr, const gw_id *b_id,
                      const gw_addr *b_addr, p2p_link_params *out);
/* "latency=67ms bw=1.15Gbps" for log lines; out must hold 64 bytes. */
void p2p_link_params_format(const p2p_link_params *lp, char *out, size_t out_len);

/* ---- the shaper ---- */

typedef struct p2p_shaper {
  p2p_link_params lp;
  double ns_per_byte; /* 0 = unlimited bandwidth */
  double tau_ns;      /* burst tolerance: burst_bytes worth of time */
  double tat_ns;      /* theoretical arrival time of the next byte (GCRA) */
  uint64_t latency_ns;
} p2p_shaper;

/* When the bytes of one reserved message may be delivered: byte k (1-based)
 * at max(enq, base + k * ns_per_byte) + latency. */
typedef struct p2p_span {
  uint64_t enq_ns;
  double base_ns;
  double ns_per_byte;
  uint64_t latency_ns;
  uint64_t bytes;
} p2p_span;

void p2p_shaper_init(p2p_shaper *s, const p2p_link_params *lp);
/* False when the parameters add neither delay nor a rate limit. */
bool p2p_shaper_active(const p2p_shaper *s);
/* Reserves bytes on the link at now_ns (bytes leave in the order reserved). */
p2p_span p2p_shaper_reserve(p2p_shaper *s, uint64_t now_ns, uint64_t bytes);
/* Time at which the first k bytes of the span have been delivered. */
uint64_t p2p_span_time(const p2p_span *sp, uint64_t k);
/* Bytes of the span delivered by t_ns. */
uint64_t p2p_span_bytes_at(const p2p_span *sp, uint64_t t_ns);

/* ---- the delay queue (datagrams) ---- */

typedef void (*p2p_delayq_cb)(void *ud, void *item);

typedef struct p2p_delayq p2p_delayq;

struct p2p_delayq {
  uv_timer_t timer;
  p2p_delayq_cb due;
  void *ud;
  struct p2p_delayq_ent *heap; /* min-heap on (due_ns, seq): equal times keep push order */
  size_t n, cap;
  uint64_t seq;
  void (*closed)(p2p_delayq *q);
};

int p2p_delayq_init(p2p_delayq *q, uv_loop_t *loop, p2p_delayq_cb due, void *ud);
/* Releases item through the callback at due_ns (uv_hrtime() clock). */
int p2p_delayq_push(p2p_delayq *q, uint64_t due_ns, void *item);
size_t p2p_delayq_len(const p2p_delayq *q);
/* Hands every pending item to drop (may be NULL), then closes the timer;
 * closed (may be NULL) runs once the queue's memory may be freed. */
void p2p_delayq_close(p2p_delayq *q, void (*drop)(void *ud, void *item), void (*closed)(p2p_delayq *q));

#endif
