/* Unit tests for the checks on what a UPnP-IGD router answers (p2p/upnp.h):
 * addresses, numbers and the read-back entry, strictly. The UPnP client
 * itself needs a router on a LAN: test/nat/test_portmap.py runs it against
 * miniupnpd in network namespaces. */
#include "testutil.h"

#include "p2p/upnp.h"
#include "util/err.h"

static void test_ipv4(void **state) {
  (void)state;
  uint8_t ip[4];
  assert_int_equal(p2p_upnp_parse_ipv4("11.77.0.2", ip), 0);
  assert_int_equal(ip[0], 11);
  assert_int_equal(ip[3], 2);
  assert_int_equal(p2p_upnp_parse_ipv4("255.255.255.255", ip), 0);
  const char *bad[] = {"",          "0.0.0.0",     "1.2.3",      "1.2.3.4.5", "256.1.1.1", "01.2.3.4",
                       "1.2.3.4 ",  " 1.2.3.4",    "1..3.4",     "a.b.c.d",   "1.2.3.4x",  "1234.1.1.1",
                       "1.2.3.-4",  "::ffff:1.2.3.4", "1.2.3.4\n"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    if (p2p_upnp_parse_ipv4(bad[i], ip) == 0) fail_msg("accepted \"%s\"", bad[i]);
  }
  assert_int_equal(p2p_upnp_parse_ipv4(NULL, ip), GW_EINVAL);
}

static void test_uint(void **state) {
  (void)state;
  uint32_t v;
  assert_int_equal(p2p_upnp_parse_uint("3600", 0, UINT32_MAX, &v), 0);
  assert_int_equal(v, 3600);
  assert_int_equal(p2p_upnp_parse_uint("4294967295", 0, UINT32_MAX, &v), 0);
  assert_int_equal(p2p_upnp_parse_uint("4294967296", 0, UINT32_MAX, &v), GW_EINVAL);
  assert_int_equal(p2p_upnp_parse_uint("99999999999", 0, UINT32_MAX, &v), GW_EINVAL);
  assert_int_equal(p2p_upnp_parse_uint("0", 1, 65535, &v), GW_EINVAL);
  assert_int_equal(p2p_upnp_parse_uint("65536", 1, 65535, &v), GW_EINVAL);
  assert_int_equal(p2p_upnp_parse_uint("-1", 0, 10, &v), GW_EINVAL);
  assert_int_equal(p2p_upnp_parse_uint("1e3", 0, 10000, &v), GW_EINVAL);
  assert_int_equal(p2p_upnp_parse_uint("", 0, 10, &v), GW_EINVAL);
}

static void test_entry(void **state) {
  (void)state;
  uint32_t lease = 99;
  assert_int_equal(p2p_upnp_check_entry("10.77.1.2", "7447", "3600", "10.77.1.2", 7447, &lease), 0);
  assert_int_equal(lease, 3600);
  assert_int_equal(p2p_upnp_check_entry("10.77.1.2", "7447", "", "10.77.1.2", 7447, &lease), 0);
  assert_int_equal(lease, 0); /* permanent */
  assert_int_equal(p2p_upnp_check_entry("10.77.1.3", "7447", "3600", "10.77.1.2", 7447, &lease), GW_EINVAL);
  assert_int_equal(p2p_upnp_check_entry("10.77.1.2", "7448", "3600", "10.77.1.2", 7447, &lease), GW_EINVAL);
  assert_int_equal(p2p_upnp_check_entry("10.77.1.2", "7447", "soon", "10.77.1.2", 7447, &lease), GW_EINVAL);
  assert_int_equal(p2p_upnp_check_entry("", "7447", "3600", "10.77.1.2", 7447, &lease), GW_EINVAL);
  assert_int_equal(p2p_upnp_check_entry("10.77.1.2", "", "3600", "10.77.1.2", 7447, &lease), GW_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ipv4),
      cmocka_unit_test(test_uint),
      cmocka_unit_test(test_entry),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
