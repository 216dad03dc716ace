/* p2p/limits.h — resource limits of a host: who may hold how much of it.
 *
 * Accounting keyed by the remote IP and by its subnet (/24 for IPv4, /64
 * for IPv6): inbound connections ("sessions", handshaking ones included)
 * and inbound handshakes in flight; and one budget across all sessions for
 * reassembly buffers (frames being received). libp2p's resource manager is
 * the model: every limit is a named constant with a config field, and a
 * `limit.hit` line says when one bites, at most once per second per key
 * (kind + IP or subnet), with how many were refused since the last line.
 *
 * Loopback (127.0.0.0/8, ::1) is exempt from the per-IP and per-subnet
 * caps unless limit_loopback is set: local swarms (gwtf swarm,
 * scripts/run.sh) run every node on 127.0.0.1. The global caps and the
 * reassembly budget apply to everyone.
 *
 * Single-threaded (the host's loop). Pure: no sockets, no timers. */
#ifndef GWTF_P2P_LIMITS_H
#define GWTF_P2P_LIMITS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/addr.h"
#include "util/log.h"

/* Inbound handshakes in flight from one IP / one subnet. */
#define P2P_LIMIT_HANDSHAKES_PER_IP (8)
#define P2P_LIMIT_HANDSHAKES_PER_SUBNET (32)
/* Inbound connections (handshaking or up, relay legs included) from one
 * IP / one subnet. A carrier-grade NAT puts many honest peers behind one
 * IP: these are generous. */
#define P2P_LIMIT_SESSIONS_PER_IP (16)
#define P2P_LIMIT_SESSIONS_PER_SUBNET (64)
/* Reassembly buffers (frames being received) across all sessions. A
 * session whose next frame would exceed it stops reading (TCP flow
 * control holds the sender) until others finish; after
 * P2P_LIMIT_RX_WAIT_MS it is closed (reason rx-budget). */
#define P2P_LIMIT_RX_BUDGET ((size_t)1 << 30)
#define P2P_LIMIT_RX_WAIT_MS (30000)
/* Slow senders: while a frame is being received, at least this many bytes
 * per second over each window, else the session is cut (slow-sender). */
#define P2P_LIMIT_RX_MIN_BPS ((uint32_t)64 << 10)
#define P2P_LIMIT_RX_WINDOW_MS (20000)
/* File descriptors kept free for our own dials, the DHT and files: an
 * inbound connection whose fd lands within this many of RLIMIT_NOFILE is
 * closed at once (limit.hit kind=fds), so a flood from many addresses
 * never runs the process out of fds. */
#define P2P_LIMIT_FD_RESERVE (32)
/* limit.hit lines: at most one per key per this period. */
#define P2P_LIMIT_LOG_MS (1000)
/* Subnet prefixes keyed on. */
#define P2P_LIMIT_SUBNET4_BITS (24)
#define P2P_LIMIT_SUBNET6_BITS (64)

typedef struct p2p_limits_config {
  uint32_t handshakes_per_ip;     /* 0: no cap */
  uint32_t handshakes_per_subnet; /* 0: no cap */
  uint32_t sessions_per_ip;       /* 0: no cap */
  uint32_t sessions_per_subnet;   /* 0: no cap */
  bool limit_loopback;            /* false: loopback peers are exempt from the per-IP/subnet caps */
  size_t rx_budget;               /* 0: unlimited */
  uint32_t rx_wait_ms;            /* longest wait for budget before the session is closed */
  uint32_t rx_min_Bps;            /* 0: no slow-sender rule */
  uint32_t rx_window_ms;
} p2p_limits_config;

/* The P2P_LIMIT_* values above; limit_loopback false. */
void p2p_limits_config_defaults(p2p_limits_config *c);

typedef struct p2p_limits p2p_limits;

/* What p2p_limits_counts reports for one address. */
typedef struct p2p_limit_counts {
  uint32_t ip_handshakes, ip_sessions;
  uint32_t subnet_handshakes, subnet_sessions;
  uint32_t handshakes, sessions; /* all inbound, exempt ones included */
  size_t rx_used;                /* reassembly bytes charged, all sessions */
  uint64_t refused;              /* connections refused by a per-IP/subnet cap, ever */
  uint64_t hits_logged;          /* limit.hit lines written, ever */
} p2p_limit_counts;

int p2p_limits_new(const p2p_limits_config *cfg, const gw_log *log, p2p_limits **out);
void p2p_limits_free(p2p_limits *l);
const p2p_limits_config *p2p_limits_get_config(const p2p_limits *l);

/* A new inbound connection from addr. 0: admitted, counted as a session
 * and a handshake in flight. GW_EFULL: a per-IP or per-subnet cap refuses
 * it (*kind: handshakes-per-ip, handshakes-per-subnet, sessions-per-ip,
 * sessions-per-subnet), a limit.hit line is logged (rate-limited) and
 * nothing is counted. */
int p2p_limits_admit(p2p_limits *l, const gw_addr *addr, uint64_t now_ms, const char **kind);
/* The connection admitted from addr finished (or left) its handshake. */
void p2p_limits_handshake_done(p2p_limits *l, const gw_addr *addr);
/* The connection admitted from addr closed; handshaking: it had not
 * called p2p_limits_handshake_done. */
void p2p_limits_release(p2p_limits *l, const gw_addr *addr, bool handshaking);

/* A limit without a per-IP key bit (global caps, fds, rx-budget,
 * slow-sender): logs `limit.hit kind=KIND ip=ADDR count=COUNT` at most once
 * per P2P_LIMIT_LOG_MS per kind, with refused= the hits since the last
 * line. addr may be NULL (ip=-). */
void p2p_limits_hit(p2p_limits *l, const char *kind, const gw_addr *addr, uint64_t count, uint64_t now_ms);

/* Reassembly budget. may_grow: could a session already holding `held`
 * bytes grow its buffer to `want` bytes now? charge: a session's holding
 * changed by delta (may be negative). */
bool p2p_limits_rx_may_grow(const p2p_limits *l, size_t held, size_t want);
void p2p_limits_rx_charge(p2p_limits *l, long long delta);
/* Sessions waiting for budget (+1 when one starts, -1 when it stops).
 * While any wait, idle sessions give back the buffers they keep between
 * frames. */
void p2p_limits_rx_waiting(p2p_limits *l, int delta);
unsigned p2p_limits_rx_waiters(const p2p_limits *l);

void p2p_limits_counts(const p2p_limits *l, const gw_addr *addr, p2p_limit_counts *out);
/* True for 127.0.0.0/8, ::1 and ::ffff:127.0.0.0/104. */
bool p2p_limits_is_loopback(const gw_addr *addr);

#endif
