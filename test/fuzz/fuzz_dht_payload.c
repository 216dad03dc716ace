/* libFuzzer target: one DHT message (after the UDP layer), see fuzz_harness.h. */
#include "fuzz_harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_dht_payload(data, size); }
