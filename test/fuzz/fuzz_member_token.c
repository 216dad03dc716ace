/* libFuzzer target: see fuzz_targets.h (fuzz_member_token). */
#include "fuzz_targets.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_member_token(data, size); }
