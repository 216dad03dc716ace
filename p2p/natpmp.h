/* p2p/natpmp.h — NAT-PMP (RFC 6886) replies as plain bytes.
 *
 * The NAT-PMP client itself is p2p_pm_natpmp (p2p/portmap.h, natpmp.c):
 * libnatpmp (Debian's 20150609 release) builds the requests and reads the
 * replies on its non-blocking socket, which we watch with a uv_poll_t and
 * resend on libnatpmp's schedule (250 ms, doubling) with a uv_timer_t.
 *
 *   map:   public address -> map TCP -> map UDP  (renewals do the same)
 *   close: delete both mappings (lifetime 0), bounded by a timeout
 *
 * libnatpmp 20150609 does not check a reply's length: a 2-byte datagram
 * from the gateway becomes a "mapping" made of whatever its stack buffer
 * held. So every datagram is first peeked at and checked here, strictly;
 * one that fails is consumed and dropped (nat.bad_reply) before libnatpmp
 * reads anything. The check is pure so that tests and the fuzzer
 * (test/fuzz/fuzz_natpmp_reply.c) call it without sockets.
 *
 *   public address  (12 B)  ver=0 | op=128 | result u16 | epoch u32 | IPv4
 *   mapping         (16 B)  ver=0 | op=129 (UDP) / 130 (TCP) | result | epoch
 *                           | internal port | mapped port | lifetime u32
 *   an error may come as the 8-byte header alone. */
#ifndef GWTF_P2P_NATPMP_H
#define GWTF_P2P_NATPMP_H

#include <stddef.h>
#include <stdint.h>

#define P2P_NATPMP_PORT (5351)
#define P2P_NATPMP_OP_PUBLIC (128)
#define P2P_NATPMP_OP_UDP (129)
#define P2P_NATPMP_OP_TCP (130)

typedef struct p2p_natpmp_reply {
  uint8_t op;        /* 128, 129 or 130 */
  uint16_t result;   /* 0 success, 1 unsupported version, 2 not authorized, 3 network failure, 4 out of resources, 5 unsupported opcode */
  uint32_t epoch;
  uint8_t public_ip[4]; /* op 128 */
  uint16_t internal_port, external_port; /* 129/130 */
  uint32_t lifetime;
} p2p_natpmp_reply;

/* 0: a well-formed NAT-PMP reply in *out; GW_EPROTO otherwise (wrong
 * version, a request, an unknown opcode, a length that does not fit). */
int p2p_natpmp_parse_reply(const uint8_t *buf, size_t len, p2p_natpmp_reply *out);

#endif
