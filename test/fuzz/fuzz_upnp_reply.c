/* libFuzzer target: one upnp reply from a router, see fuzz_portmap.h. */
#include "fuzz_portmap.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_upnp_reply(data, size); }
