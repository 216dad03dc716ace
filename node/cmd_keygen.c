/* `gwtf keygen [--out FILE]`: create an identity and print its node ID. */
#include <getopt.h>
#include <stdio.h>

#include "node/cmd.h"
#include "p2p/identity.h"
#include "util/err.h"

#define DEFAULT_KEY_PATH "gwtf.key"

void cmd_keygen_help(void) {
  printf("usage: gwtf keygen [--out FILE]\n\n"
         "Creates a new Ed25519 identity in FILE (default " DEFAULT_KEY_PATH ", mode 0600;\n"
         "an existing file is never overwritten) and prints the node ID, which is\n"
         "BLAKE2b-256 of the public key.\n");
}

int cmd_keygen(int argc, char **argv) {
  const char *out = DEFAULT_KEY_PATH;
  static const struct option opts[] = {{"out", required_argument, 0, 'o'}, {"help", no_argument, 0, 'h'}, {0}};
  int c;
  while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
    switch (c) {
    case 'o': out = optarg; break;
    case 'h': cmd_keygen_help(); return 0;
    default: cmd_keygen_help(); return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "gwtf keygen: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  p2p_identity me;
  char err[512];
  if (p2p_identity_create(out, &me, err, sizeof(err)) != 0) {
    fprintf(stderr, "gwtf keygen: %s\n", err);
    return 1;
  }
  char hex[GW_ID_HEX_LEN + 1];
  gw_id_to_hex(&me.id, hex);
  printf("%s\n", hex);
  fprintf(stderr, "gwtf keygen: wrote %s (mode 0600)\n", out);
  p2p_identity_wipe(&me);
  return 0;
}
