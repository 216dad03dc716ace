/* util/clock.h — time sources for the runtime (never used by the protocol
 * state machines, which are handed `now` by their driver). */
#ifndef GWTF_UTIL_CLOCK_H
#define GWTF_UTIL_CLOCK_H

#include <stdint.h>

/* Monotonic milliseconds and nanoseconds since an arbitrary origin. */
uint64_t gw_clock_mono_ms(void);
uint64_t gw_clock_mono_ns(void);
/* Wall-clock milliseconds since the Unix epoch (record expiry on the wire). */
uint64_t gw_clock_wall_ms(void);

#endif
