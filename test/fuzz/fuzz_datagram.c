/* libFuzzer target: one whole UDP datagram, see fuzz_harness.h. */
#include "fuzz_harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_datagram(data, size); }
