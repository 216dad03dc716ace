#include "util/id.h"

#include <sodium.h>
#include <string.h>

#include "util/err.h"

bool gw_id_eq(const gw_id *a, const gw_id *b) { return memcmp(a->b, b->b, GW_ID_BYTES) == 0; }

int gw_id_cmp(const gw_id *a, const gw_id *b) { return memcmp(a->b, b->b, GW_ID_BYTES); }

bool gw_id_is_zero(const gw_id *a) {
  static const gw_id zero;
  return gw_id_eq(a, &zero);
}

void gw_id_to_hex(const gw_id *id, char *out) {
  sodium_bin2hex(out, GW_ID_HEX_LEN + 1, id->b, GW_ID_BYTES);
}

void gw_id_to_short(const gw_id *id, char *out) {
  sodium_bin2hex(out, GW_ID_SHORT_LEN + 1, id->b, GW_ID_SHORT_LEN / 2);
}

int gw_id_from_hex(const char *hex, gw_id *out) {
  size_t bin_len = 0;
  const char *end = NULL;
  if (strlen(hex) != GW_ID_HEX_LEN) return GW_EINVAL;
  if (sodium_hex2bin(out->b, GW_ID_BYTES, hex, GW_ID_HEX_LEN, NULL, &bin_len, &end) != 0 ||
      bin_len != GW_ID_BYTES)
    return GW_EINVAL;
  return 0;
}

void gw_id_hash(const void *data, size_t len, gw_id *out) {
  crypto_generichash(out->b, GW_ID_BYTES, data, len, NULL, 0);
}

void gw_id_hash_str(const char *s, gw_id *out) { gw_id_hash(s, strlen(s), out); }
