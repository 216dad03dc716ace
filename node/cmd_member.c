/* `gwtf invite` and `gwtf revoke`: membership of a private run, from the
 * run key in the creator's data dir (node/run_access.h, train/member.h).
 * Neither talks to the network: an invite is a signed token the leader
 * checks when it is redeemed, and a revocation is a signed list the running
 * node picks up from the data dir and floods to the members. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "node/cmd.h"
#include "node/node.h"
#include "node/run_access.h"
#include "p2p/identity.h"
#include "util/err.h"

#define INVITE_DEFAULT_EXPIRES "7d"

void cmd_invite_help(void) {
  char dir[512];
  node_default_data_dir(dir, sizeof(dir));
  printf("usage: gwtf invite --run NAME [--expires 7d] [--uses N] [options]\n\n"
         "Prints an invite to the private run NAME: a token (gwtf1:...) a friend passes\n"
         "as `gwtf node --join TOKEN`. It holds the run's name and public key, this\n"
         "node's ID and address, an expiry and a use count, signed with the run key\n"
         "(DIR/runs/NAME/run.key, written by `gwtf node --create-run NAME`). The leader\n"
         "(or any data node holding the run key) checks it when a friend's node\n"
         "presents it, counts its uses in DIR/runs/NAME/redeemed, and gives that node\n"
         "a membership certificate. Nothing goes over the network here.\n\n"
         "options:\n"
         "  --run NAME          the run (required)\n"
         "  --expires DURATION  redeemable for this long: 30m, 12h, 7d, or seconds\n"
         "                      (default " INVITE_DEFAULT_EXPIRES "; 0: never expires)\n"
         "  --uses N            nodes that may redeem it (default 1; 0: unlimited)\n"
         "  --addr HOST:PORT    where friends dial this node (default: the address the\n"
         "                      running node announced, DIR/runs/NAME/creator.addr)\n"
         "  --data-dir DIR      (default %s)\n"
         "  --run-key FILE      the run key (default DIR/runs/NAME/run.key)\n"
         "  --identity FILE     this node's key (default DIR/identity.key): the token\n"
         "                      names its node ID, which the friend's node checks\n",
         dir);
}

void cmd_revoke_help(void) {
  char dir[512];
  node_default_data_dir(dir, sizeof(dir));
  printf("usage: gwtf revoke --run NAME PEER [options]\n\n"
         "Revokes PEER's membership of the private run NAME: adds it to the run's\n"
         "revocation list (signed with the run key, DIR/runs/NAME/revoked). The\n"
         "running node that holds the run key picks the list up within a second and\n"
         "sends it to every member; they refuse PEER from then on (run.refused\n"
         "reason=revoked) and drop it from their views, so it does no work from the\n"
         "next iteration on. PEER is a node ID in hex, or a prefix of it (the 8 digits\n"
         "logs show) that matches one node that redeemed an invite.\n\n"
         "options:\n"
         "  --run NAME          the run (required)\n"
         "  --data-dir DIR      (default %s)\n"
         "  --run-key FILE      the run key (default DIR/runs/NAME/run.key)\n",
         dir);
}

typedef struct member_args {
  const char *run, *data_dir, *run_key, *identity, *addr, *expires;
  long uses;
  char dir[512], key_path[4096];
} member_args;

static int load_key(member_args *a, member_key *key, const char *cmd) {
  char err[512];
  if (!a->data_dir) {
    node_default_data_dir(a->dir, sizeof(a->dir));
    a->data_dir = a->dir;
  }
  if (a->run_key)
    snprintf(a->key_path, sizeof(a->key_path), "%s", a->run_key);
  else
    run_access_path(a->data_dir, a->run, "run.key", a->key_path, sizeof(a->key_path));
  if (run_access_load_key(a->key_path, false, key, err, sizeof(err)) != 0) {
    fprintf(stderr, "gwtf %s: %s (is this the run's creator? `gwtf node --create-run %s` writes it)\n", cmd, err,
            a->run);
    return 1;
  }
  return 0;
}

static int parse(int argc, char **argv, member_args *a, void (*help)(void), const char *cmd) {
  static const struct option opts[] = {
      {"run", required_argument, 0, 'r'},      {"data-dir", required_argument, 0, 'd'},
      {"run-key", required_argument, 0, 'k'},  {"identity", required_argument, 0, 'i'},
      {"addr", required_argument, 0, 'a'},     {"expires", required_argument, 0, 'e'},
      {"uses", required_argument, 0, 'u'},     {"help", no_argument, 0, 'h'},
      {0},
  };
  int c;
  char *end;
  memset(a, 0, sizeof(*a));
  a->expires = INVITE_DEFAULT_EXPIRES;
  a->uses = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 'r': a->run = optarg; break;
    case 'd': a->data_dir = optarg; break;
    case 'k': a->run_key = optarg; break;
    case 'i': a->identity = optarg; break;
    case 'a': a->addr = optarg; break;
    case 'e': a->expires = optarg; break;
    case 'u':
      a->uses = strtol(optarg, &end, 10);
      if (end == optarg || *end || a->uses < 0 || a->uses > 1000000) {
        fprintf(stderr, "gwtf %s: --uses '%s': a count from 0 (unlimited) to 1000000\n", cmd, optarg);
        return 2;
      }
      break;
    case 'h': help(); return -1;
    default: fprintf(stderr, "(see gwtf help %s)\n", cmd); return 2;
    }
  }
  if (!a->run || !*a->run || strlen(a->run) > MEMBER_RUN_MAX) {
    fprintf(stderr, "gwtf %s: --run NAME is required (see gwtf help %s)\n", cmd, cmd);
    return 2;
  }
  return 0;
}

int cmd_invite(int argc, char **argv) {
  member_args a;
  int rc = parse(argc, argv, &a, cmd_invite_help, "invite");
  if (rc) return rc < 0 ? 0 : rc;
  if (optind < argc) {
    fprintf(stderr, "gwtf invite: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  uint64_t secs = 0;
  if (member_parse_duration(a.expires, &secs) != 0) {
    fprintf(stderr, "gwtf invite: --expires '%s': a duration like 30m, 12h, 7d or seconds\n", a.expires);
    return 2;
  }
  if (p2p_crypto_init() != 0) return 1;
  member_key key;
  if (load_key(&a, &key, "invite") != 0) return 1;
  member_invite inv;
  memset(&inv, 0, sizeof(inv));
  snprintf(inv.run, sizeof(inv.run), "%s", a.run);
  memcpy(inv.run_key, key.pk, sizeof(inv.run_key));
  char path[4096], err[512];
  if (a.identity)
    snprintf(path, sizeof(path), "%s", a.identity);
  else
    snprintf(path, sizeof(path), "%s/identity.key", a.data_dir);
  p2p_identity me;
  int created = 0;
  if (access(path, F_OK) != 0 || p2p_identity_load_or_create(path, &me, &created, err, sizeof(err)) != 0) {
    fprintf(stderr, "gwtf invite: no node identity at %s\n", path);
    sodium_memzero(&key, sizeof(key));
    return 1;
  }
  inv.creator = me.id;
  p2p_identity_wipe(&me);
  if (a.addr) {
    snprintf(inv.creator_addr, sizeof(inv.creator_addr), "%s", a.addr);
  } else if (run_access_read_addr(a.data_dir, a.run, inv.creator_addr, sizeof(inv.creator_addr)) != 0) {
    fprintf(stderr,
            "gwtf invite: no address known for run %s yet: pass --addr HOST:PORT (the address in the node's\n"
            "  \"to join this node\" line), or wait until the running node has announced itself\n",
            a.run);
    sodium_memzero(&key, sizeof(key));
    return 1;
  }
  randombytes_buf(inv.id, sizeof(inv.id));
  inv.expires = secs ? (uint64_t)time(NULL) + secs : 0;
  inv.uses = (uint32_t)a.uses;
  char token[MEMBER_TOKEN_TEXT_MAX];
  rc = member_token_make(&inv, &key, token, sizeof(token));
  sodium_memzero(&key, sizeof(key));
  if (rc != 0) {
    fprintf(stderr, "gwtf invite: cannot make the token: %s\n", gw_strerror(rc));
    return 1;
  }
  printf("%s\n", token);
  char until[64] = "never";
  if (inv.expires) {
    time_t t = (time_t)inv.expires;
    strftime(until, sizeof(until), "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
  }
  fprintf(stderr, "gwtf invite: run %s, dial %s, uses %u%s, expires %s\n", a.run, inv.creator_addr, inv.uses,
          inv.uses ? "" : " (unlimited)", until);
  fprintf(stderr, "  your friend runs: gwtf node --join TOKEN --listen 0.0.0.0:PORT\n");
  return 0;
}

/* PEER as a full node ID, or a unique prefix among the run's redeemers. */
static int resolve_peer(const member_args *a, const char *text, gw_id *out) {
  if (gw_id_from_hex(text, out) == 0) return 0;
  size_t n = strlen(text);
  if (n == 0 || n > GW_ID_HEX_LEN) return GW_EINVAL;
  gw_id ids[1024];
  size_t k = 0, found = 0;
  run_access_redeemers(a->data_dir, a->run, ids, 1024, &k);
  for (size_t i = 0; i < k; i++) {
    char hex[GW_ID_HEX_LEN + 1];
    gw_id_to_hex(&ids[i], hex);
    if (strncasecmp(hex, text, n) != 0) continue;
    if (found && gw_id_eq(out, &ids[i])) continue;
    *out = ids[i];
    found++;
  }
  return found == 1 ? 0 : found ? GW_EEXIST : GW_ENOENT;
}

int cmd_revoke(int argc, char **argv) {
  member_args a;
  int rc = parse(argc, argv, &a, cmd_revoke_help, "revoke");
  if (rc) return rc < 0 ? 0 : rc;
  if (optind + 1 != argc) {
    fprintf(stderr, "gwtf revoke: name one PEER (see gwtf help revoke)\n");
    return 2;
  }
  if (p2p_crypto_init() != 0) return 1;
  member_key key;
  if (load_key(&a, &key, "revoke") != 0) return 1;
  gw_id peer;
  rc = resolve_peer(&a, argv[optind], &peer);
  if (rc != 0) {
    fprintf(stderr, "gwtf revoke: '%s' %s\n", argv[optind],
            rc == GW_EEXIST ? "matches more than one member: give more digits"
                            : "is no node ID (64 hex digits) and no prefix of one that redeemed an invite");
    sodium_memzero(&key, sizeof(key));
    return 2;
  }
  uint64_t seq = 0;
  size_t n = 0;
  char err[512];
  rc = run_access_revoke(a.data_dir, a.run, &key, &peer, &seq, &n, err, sizeof(err));
  sodium_memzero(&key, sizeof(key));
  if (rc != 0) {
    fprintf(stderr, "gwtf revoke: %s\n", err);
    return 1;
  }
  char hex[GW_ID_HEX_LEN + 1];
  gw_id_to_hex(&peer, hex);
  printf("%s\n", hex);
  fprintf(stderr, "gwtf revoke: run %s revokes %s (list %llu, %zu peer%s); the running node sends it on\n", a.run, hex,
          (unsigned long long)seq, n, n == 1 ? "" : "s");
  return 0;
}
