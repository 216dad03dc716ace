/* train/peer_admit.c — who is a member of a private run (issue 17, item 1).
 *
 * The dispatcher's table (peer_trust.c) says which circle may send each
 * message; in a private run every circle is inside the run's members, so
 * trust_admit asks admit_check first: a message from a peer that has not
 * presented a valid certificate is refused, logged once per (peer, reason)
 * as `run.refused`, and answered (at most every ADMIT_ASK_MS) with our own
 * certificate flagged `reply`, so a member we missed presents its own.
 * Only the admission messages carry their own proof and pass:
 *   TRAIN_CERT      a peer's certificate (verified against the run key);
 *   TRAIN_REDEEM    a joiner's invite token (a holder of the run key checks
 *                   signature, run, expiry, uses and revocation, and answers
 *                   TRAIN_ADMITTED with a certificate, or with the reason);
 *   TRAIN_ADMITTED  that answer (taken only for ourselves);
 *   TRAIN_REVOKED   the run's signed revocation list (a newer one replaces
 *                   ours, revoked members leave every view at once, and we
 *                   pass it on to our neighbours).
 * A peer presents its certificate before the first message it sends to
 * another in a session (admit_before_send), so members never see each
 * other refused in practice. Cryptography is in train/member.c. */
#include "train/peer_admit.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"

/* A certificate request to one peer at most this often. */
#define ADMIT_ASK_MS 2000
/* After a certificate or token that did not verify, that peer's next ones
 * are dropped unchecked for this long: a signature check costs ~0.2 ms, and
 * a stranger could otherwise keep a core busy with forged ones. */
#define ADMIT_BAD_PROOF_MS 1000
/* A joiner redeems its token this often until it is admitted. */
#define ADMIT_REDEEM_MS 2000
#define ADMIT_DEFAULT_TTL_S (30ull * 86400)

static bool renewing(train_peer *p);

static uint64_t unix_now(train_peer *p) { return p->io.unix_s ? p->io.unix_s(p->io.ud) : p->now / 1000; }

static bool admission_type(uint32_t type) {
  return type == GWTF__TRAIN_MSG__TRAIN_CERT || type == GWTF__TRAIN_MSG__TRAIN_REDEEM ||
         type == GWTF__TRAIN_MSG__TRAIN_ADMITTED || type == GWTF__TRAIN_MSG__TRAIN_REVOKED;
}

bool admit_ready(train_peer *p) {
  peer_admit *a = &p->admit;
  return !a->private_run || (a->my_cert && unix_now(p) < a->my_expires);
}

bool train_peer_certified(const train_peer *p) { return admit_ready((train_peer *)p); }

static admit_member *member_find(peer_admit *a, const gw_id *id) {
  for (uint32_t i = 0; i < a->n_members; i++)
    if (gw_id_eq(&a->members[i].id, id)) return &a->members[i];
  return NULL;
}

bool admit_is_member(train_peer *p, const gw_id *id) {
  peer_admit *a = &p->admit;
  if (!a->private_run || gw_id_eq(id, &p->cfg.self)) return true;
  if (member_revoked(&a->revoked, id)) return false;
  admit_member *m = member_find(a, id);
  return m && unix_now(p) < m->expires;
}

bool train_peer_member(train_peer *p, const gw_id *peer) { return admit_is_member(p, peer); }

bool train_peer_certificate(const train_peer *p, const uint8_t **cert, size_t *len) {
  if (!p->admit.my_cert) return false;
  *cert = p->admit.my_cert;
  *len = p->admit.my_cert_len;
  return true;
}

/* ---- presenting our certificate ---- */

static void send_cert(train_peer *p, const gw_id *to, uint32_t type, bool reply, const char *refused,
                      const uint8_t *cert, size_t cert_len) {
  Gwtf__TrainCert c = GWTF__TRAIN_CERT__INIT;
  c.cert = (ProtobufCBinaryData){cert_len, (uint8_t *)cert};
  c.reply = reply;
  c.refused = (char *)(refused ? refused : "");
  peer_send(p, to, type, &c.base, NULL);
}

static bool presented(peer_admit *a, const gw_id *to) { return id_in(a->presented, a->n_presented, to); }

static void present(train_peer *p, const gw_id *to, bool reply) {
  peer_admit *a = &p->admit;
  if (!a->my_cert) return;
  if (!presented(a, to)) {
    if (a->n_presented < ADMIT_MAX_MEMBERS) {
      a->presented[a->n_presented++] = *to;
    } else {
      a->presented[a->presented_pos] = *to; /* full: overwrite round-robin; at worst we present again */
      a->presented_pos = (a->presented_pos + 1) % ADMIT_MAX_MEMBERS;
    }
  }
  send_cert(p, to, GWTF__TRAIN_MSG__TRAIN_CERT, reply, NULL, a->my_cert, a->my_cert_len);
  /* and the run's revocations: a member that was away learns them (it
   * ignores a list that is not newer than its own) */
  if (a->revoked_bin) {
    Gwtf__TrainRevoked r = GWTF__TRAIN_REVOKED__INIT;
    r.list = (ProtobufCBinaryData){a->revoked_len, a->revoked_bin};
    peer_send(p, to, GWTF__TRAIN_MSG__TRAIN_REVOKED, &r.base, NULL);
  }
}

void admit_before_send(train_peer *p, const gw_id *to, uint32_t type) {
  peer_admit *a = &p->admit;
  if (!a->private_run || !a->my_cert || admission_type(type) || presented(a, to)) return;
  present(p, to, !admit_is_member(p, to));
}

void train_peer_present(train_peer *p, const gw_id *peer) { admit_before_send(p, peer, 0); }

void admit_peer_up(train_peer *p, const gw_id *peer) {
  if (!p->admit.private_run || !p->admit.my_cert) return;
  present(p, peer, !admit_is_member(p, peer));
}

static void forget_presented(peer_admit *a, const gw_id *peer) {
  for (uint32_t i = 0; i < a->n_presented; i++)
    if (gw_id_eq(&a->presented[i], peer)) {
      a->presented[i] = a->presented[--a->n_presented];
      if (a->presented_pos >= a->n_presented) a->presented_pos = 0;
      return;
    }
}

void admit_peer_down(train_peer *p, const gw_id *peer) { forget_presented(&p->admit, peer); }

/* ---- refusing ---- */

/* Once per (peer, reason); the slot also rate-limits our certificate
 * requests to that peer. Returns the slot. */
static void refuse(train_peer *p, const gw_id *from, uint32_t type, const char *reason) {
  peer_admit *a = &p->admit;
  p->counters.messages_refused++;
  p->counters.admissions_refused++;
  uint32_t k = 0;
  while (k < a->n_logged && !(gw_id_eq(&a->logged[k].id, from) && strcmp(a->logged[k].reason, reason) == 0)) k++;
  if (k == a->n_logged) {
    k = a->n_logged < ADMIT_MAX_LOGGED ? a->n_logged++ : (uint32_t)(p->counters.admissions_refused % ADMIT_MAX_LOGGED);
    a->logged[k].id = *from;
    a->logged[k].reason = reason;
    a->logged[k].asked_ms = 0;
    a->logged[k].at_ms = p->now;
    char who[GW_ID_SHORT_LEN + 1];
    peer_short(from, who);
    GW_WARN(&p->log, "run.refused", "peer=%s reason=%s type=%u", who, reason, type);
  }
  a->logged[k].at_ms = p->now;
  /* A member whose certificate we missed (we restarted, it presented to
   * our previous session) presents it again when asked. */
  if (a->my_cert && strcmp(reason, "revoked") != 0 &&
      (!a->logged[k].asked_ms || p->now - a->logged[k].asked_ms >= ADMIT_ASK_MS)) {
    a->logged[k].asked_ms = p->now ? p->now : 1;
    present(p, from, true);
  }
}

bool admit_check(train_peer *p, const gw_id *from, uint32_t type) {
  peer_admit *a = &p->admit;
  if (!a->private_run || admission_type(type) || gw_id_eq(from, &p->cfg.self)) return true;
  const char *why;
  if (member_revoked(&a->revoked, from)) {
    why = "revoked";
  } else {
    admit_member *m = member_find(a, from);
    if (m && unix_now(p) < m->expires) return true;
    why = m ? "expired" : "no_certificate";
  }
  refuse(p, from, type, why);
  return false;
}

bool train_peer_admit(train_peer *p, const gw_id *peer, uint64_t now_ms) {
  p->now = now_ms;
  return admit_check(p, peer, 0);
}

/* ---- views ---- */

bool admit_view_filter(train_peer *p, int stage, const gw_id *id, uint32_t capacity, uint32_t load) {
  peer_admit *a = &p->admit;
  if (admit_is_member(p, id)) return true;
  if (member_revoked(&a->revoked, id)) return false;
  uint32_t k = 0;
  while (k < a->n_pending && !gw_id_eq(&a->pending[k].id, id)) k++;
  if (k == a->n_pending) {
    if (a->n_pending == ADMIT_MAX_PENDING) return false;
    a->n_pending++;
    a->pending[k].id = *id;
    a->pending[k].asked_ms = 0;
  }
  a->pending[k].stage = stage;
  a->pending[k].capacity = capacity;
  a->pending[k].load = load;
  /* Ask it for its certificate (ours goes with the question). */
  if (a->my_cert && (!a->pending[k].asked_ms || p->now - a->pending[k].asked_ms >= ADMIT_ASK_MS)) {
    a->pending[k].asked_ms = p->now ? p->now : 1;
    present(p, id, true);
  }
  return false;
}

/* A pending directory member presented a valid certificate: into its view now. */
static void let_in(train_peer *p, const gw_id *id) {
  peer_admit *a = &p->admit;
  for (uint32_t k = 0; k < a->n_pending; k++) {
    if (!gw_id_eq(&a->pending[k].id, id)) continue;
    peer_stage_view *v = peer_stage(p, a->pending[k].stage);
    if (v && !peer_in_view(v, id)) {
      /* the driver's next directory refresh would add it too; this saves a round */
      size_t n = v->n;
      train_member *all = malloc((n + 1) * sizeof(*all));
      if (all) {
        for (size_t i = 0; i < n; i++) all[i] = (train_member){v->v[i].id, v->v[i].capacity, v->v[i].load};
        all[n] = (train_member){*id, a->pending[k].capacity, a->pending[k].load};
        int stage = a->pending[k].stage;
        a->pending[k] = a->pending[--a->n_pending];
        train_peer_set_members(p, stage, all, n + 1, p->now);
        free(all);
        return;
      }
    }
    a->pending[k] = a->pending[--a->n_pending];
    return;
  }
}

static void remember(train_peer *p, const gw_id *id, uint64_t expires) {
  peer_admit *a = &p->admit;
  admit_member *m = member_find(a, id);
  if (!m) {
    if (a->n_members == ADMIT_MAX_MEMBERS) {
      /* full: replace the one that expires first */
      uint32_t k = 0;
      for (uint32_t i = 1; i < a->n_members; i++)
        if (a->members[i].expires < a->members[k].expires) k = i;
      m = &a->members[k];
    } else {
      m = &a->members[a->n_members++];
    }
    m->id = *id;
  }
  m->expires = expires;
}

/* ---- the admission messages ---- */

/* `from` sent a proof that did not verify within ADMIT_BAD_PROOF_MS. */
static bool bad_proof_lately(train_peer *p, const gw_id *from) {
  peer_admit *a = &p->admit;
  for (uint32_t k = 0; k < a->n_logged; k++)
    if (gw_id_eq(&a->logged[k].id, from) && p->now - a->logged[k].at_ms < ADMIT_BAD_PROOF_MS &&
        (!strcmp(a->logged[k].reason, "bad_certificate") || !strcmp(a->logged[k].reason, "bad_token")))
      return true;
  return false;
}

void admit_on_cert(train_peer *p, const gw_id *from, const Gwtf__TrainCert *c) {
  peer_admit *a = &p->admit;
  if (!a->private_run) return;
  if (bad_proof_lately(p, from)) {
    p->counters.messages_refused++;
    return;
  }
  p->counters.signatures_checked++;
  member_cert mc;
  const char *why = NULL;
  if (member_cert_parse(c->cert.data, c->cert.len, a->run, a->run_key, &mc) != 0)
    why = "bad_certificate";
  else if (!gw_id_eq(&mc.peer, from))
    why = "not_its_certificate";
  else if (member_revoked(&a->revoked, from))
    why = "revoked";
  else if (unix_now(p) >= mc.expires)
    why = "expired";
  if (why) {
    refuse(p, from, GWTF__TRAIN_MSG__TRAIN_CERT, why);
    return;
  }
  bool known = admit_is_member(p, from);
  remember(p, from, mc.expires);
  p->counters.certs_verified++;
  if (!known) {
    char who[GW_ID_SHORT_LEN + 1];
    peer_short(from, who);
    GW_DEBUG(&p->log, "run.member", "peer=%s expires=%llu", who, (unsigned long long)mc.expires);
  }
  /* a refusal of it earlier may be logged again if it happens again */
  for (uint32_t k = 0; k < a->n_logged; k++)
    if (gw_id_eq(&a->logged[k].id, from)) a->logged[k] = a->logged[--a->n_logged], k--;
  if (c->reply && a->my_cert) present(p, from, false);
  let_in(p, from);
}

static bool redeemed_before(train_peer *p, const uint8_t id[16], uint32_t uses, const gw_id *peer) {
  peer_admit *a = &p->admit;
  if (p->io.redeem) return p->io.redeem(p->io.ud, id, uses, peer) == 0;
  uint32_t count = 0;
  for (uint32_t i = 0; i < a->n_redeemed; i++) {
    if (memcmp(a->redeemed[i].invite, id, 16) != 0) continue;
    if (gw_id_eq(&a->redeemed[i].peer, peer)) return true;
    count++;
  }
  if (uses && count >= uses) return false;
  if (a->n_redeemed == ADMIT_MAX_REDEEMED) return false;
  memcpy(a->redeemed[a->n_redeemed].invite, id, 16);
  a->redeemed[a->n_redeemed++].peer = *peer;
  return true;
}

static int issue(train_peer *p, const gw_id *peer, uint64_t now_s, uint8_t **cert, size_t *len, uint64_t *expires) {
  peer_admit *a = &p->admit;
  member_cert mc = {0};
  snprintf(mc.run, sizeof(mc.run), "%s", a->run);
  memcpy(mc.run_key, a->run_key, MEMBER_PK_BYTES);
  mc.peer = *peer;
  mc.issued = now_s;
  mc.expires = now_s + a->cert_ttl_s;
  *expires = mc.expires;
  return member_cert_make(&mc, &a->key, cert, len);
}

/* A member renews: its certificate, still valid and not revoked, for a new one. */
static const char *renewal_refused(train_peer *p, const gw_id *from, const Gwtf__TrainRedeem *r, uint64_t now_s) {
  peer_admit *a = &p->admit;
  member_cert mc;
  if (member_cert_parse(r->cert.data, r->cert.len, a->run, a->run_key, &mc) != 0) return "bad_certificate";
  if (!gw_id_eq(&mc.peer, from)) return "not_its_certificate";
  if (member_revoked(&a->revoked, from)) return "revoked";
  if (now_s >= mc.expires) return "expired";
  return NULL;
}

void admit_on_redeem(train_peer *p, const gw_id *from, const Gwtf__TrainRedeem *r) {
  peer_admit *a = &p->admit;
  if (!a->private_run || !a->have_sk) return; /* only a holder of the run key admits */
  if (bad_proof_lately(p, from)) {
    p->counters.messages_refused++;
    return;
  }
  p->counters.signatures_checked++;
  member_invite inv;
  memset(&inv, 0, sizeof(inv));
  uint64_t now_s = unix_now(p);
  const char *why = NULL;
  if (r->cert.len)
    why = renewal_refused(p, from, r, now_s);
  else if (member_token_parse_bin(r->token.data, r->token.len, &inv) != 0)
    why = "bad_token";
  else if (memcmp(inv.run_key, a->run_key, MEMBER_PK_BYTES) != 0 || strcmp(inv.run, a->run) != 0)
    why = "other_run";
  else if (member_revoked(&a->revoked, from))
    why = "revoked";
  else if (inv.expires && now_s >= inv.expires)
    why = "token_expired";
  else if (!redeemed_before(p, inv.id, inv.uses, from))
    why = "token_used_up";
  char who[GW_ID_SHORT_LEN + 1], invite[17];
  peer_short(from, who);
  peer_hex8(inv.id, invite);
  if (why) {
    /* tell the joiner why (a token is refused once per reason in our log) */
    refuse(p, from, GWTF__TRAIN_MSG__TRAIN_REDEEM, why);
    send_cert(p, from, GWTF__TRAIN_MSG__TRAIN_ADMITTED, false, why, NULL, 0);
    return;
  }
  uint8_t *cert = NULL;
  size_t len = 0;
  uint64_t expires = 0;
  if (issue(p, from, now_s, &cert, &len, &expires) != 0) return;
  bool known = admit_is_member(p, from);
  remember(p, from, expires);
  p->counters.certs_issued++;
  if (!known && !r->cert.len)
    GW_INFO(&p->log, "run.admitted", "peer=%s invite=%s expires=%llu", who, invite, (unsigned long long)expires);
  else if (r->cert.len)
    GW_DEBUG(&p->log, "run.renewal", "peer=%s expires=%llu", who, (unsigned long long)expires);
  send_cert(p, from, GWTF__TRAIN_MSG__TRAIN_ADMITTED, false, NULL, cert, len);
  free(cert);
  if (a->my_cert && !presented(a, from)) present(p, from, false);
  let_in(p, from);
}

static void set_my_cert(train_peer *p, const uint8_t *cert, size_t len, uint64_t issued, uint64_t expires) {
  peer_admit *a = &p->admit;
  uint8_t *copy = malloc(len ? len : 1);
  if (!copy) return;
  memcpy(copy, cert, len);
  free(a->my_cert);
  a->my_cert = copy;
  a->my_cert_len = len;
  a->my_issued = issued;
  a->my_expires = expires;
  a->n_presented = 0; /* present the new one to everyone again */
  a->presented_pos = 0;
}

/* Everyone we know of hears our (new) certificate at once. */
static void present_all(train_peer *p) {
  for (int s = 0; s <= p->cfg.n_stages; s++) {
    peer_stage_view *v = &p->members[s];
    for (size_t i = 0; i < v->n; i++)
      if (!gw_id_eq(&v->v[i].id, &p->cfg.self)) present(p, &v->v[i].id, !admit_is_member(p, &v->v[i].id));
  }
  peer_admit *a = &p->admit;
  for (uint32_t k = 0; k < a->n_pending; k++) present(p, &a->pending[k].id, true);
  if (p->have_leader && !presented(a, &p->leader)) present(p, &p->leader, !admit_is_member(p, &p->leader));
}

void admit_on_admitted(train_peer *p, const gw_id *from, const Gwtf__TrainCert *c) {
  peer_admit *a = &p->admit;
  char who[GW_ID_SHORT_LEN + 1];
  peer_short(from, who);
  /* a joiner's first certificate, or a member's renewal */
  if (!a->private_run || (!a->token && !a->my_cert) || (admit_ready(p) && !renewing(p))) return;
  if (c->cert.len == 0) {
    /* Final: the token will not get better by asking again (expired, used
     * up, revoked, another run's). One clear line, and no more asking. */
    if (a->token_refused) return;
    /* An unsigned answer: only the invite's creator or the leader may end
     * our asking (anyone else could tell us to give up). */
    if (!gw_id_eq(from, &a->token_creator) && !(p->have_leader && gw_id_eq(from, &p->leader))) {
      GW_DEBUG(&p->log, "run.redeem_refused", "by=%s reason=%s", who, c->refused ? c->refused : "");
      return;
    }
    a->token_refused = true;
    GW_ERROR(&p->log, "run.redeem_refused", "by=%s reason=%s msg=\"ask the run's creator for a new invite\"", who,
             c->refused && *c->refused ? c->refused : "unknown");
    return;
  }
  member_cert mc;
  if (member_cert_parse(c->cert.data, c->cert.len, a->run, a->run_key, &mc) != 0 ||
      !member_cert_valid(&mc, &p->cfg.self, unix_now(p))) {
    refuse(p, from, GWTF__TRAIN_MSG__TRAIN_ADMITTED, "bad_certificate");
    return;
  }
  if (a->my_cert && mc.expires <= a->my_expires) return; /* not newer than ours */
  bool renewal = a->my_cert != NULL;
  set_my_cert(p, c->cert.data, c->cert.len, mc.issued, mc.expires);
  peer_emit(p, TRAIN_EV_CERTIFIED); /* the driver keeps it: a restart needs no invite */
  if (renewal) {
    GW_INFO(&p->log, "run.renewed", "by=%s expires=%llu", who, (unsigned long long)mc.expires);
    present_all(p);
    return;
  }
  GW_INFO(&p->log, "run.certified", "by=%s expires=%llu secs=%.3f", who, (unsigned long long)mc.expires,
          (double)(p->now - a->last_redeem_ms) / 1000.0);
  /* the joiner may JOIN now */
  p->last_join_ms = 0;
  present_all(p);
}

static void apply_revocations(train_peer *p) {
  peer_admit *a = &p->admit;
  char who[GW_ID_SHORT_LEN + 1];
  for (size_t i = 0; i < a->revoked.n; i++) {
    const gw_id *id = &a->revoked.peers[i];
    peer_short(id, who);
    if (gw_id_eq(id, &p->cfg.self)) {
      GW_ERROR(&p->log, "run.revoked_self", "seq=%llu msg=\"the run's creator revoked our membership\"",
               (unsigned long long)a->revoked.seq);
      continue;
    }
    admit_member *m = member_find(a, id);
    bool in_view = false;
    for (int s = 0; s <= p->cfg.n_stages; s++) in_view |= peer_in_view(&p->members[s], id);
    if (!m && !in_view) continue;
    if (m) *m = a->members[--a->n_members];
    GW_WARN(&p->log, "run.revoked", "peer=%s seq=%llu", who, (unsigned long long)a->revoked.seq);
    /* out of every view now: not waited for, not picked, not asked; the
     * microbatches it holds are re-routed as after a crash */
    train_peer_on_peer_down(p, id, p->now);
  }
}

/* Sends the list to everyone in our views (they pass it on once). */
static void flood_revocations(train_peer *p, const gw_id *from) {
  peer_admit *a = &p->admit;
  Gwtf__TrainRevoked r = GWTF__TRAIN_REVOKED__INIT;
  r.list = (ProtobufCBinaryData){a->revoked_len, a->revoked_bin};
  for (int s = 0; s <= p->cfg.n_stages; s++) {
    peer_stage_view *v = &p->members[s];
    for (size_t i = 0; i < v->n; i++)
      if (!gw_id_eq(&v->v[i].id, &p->cfg.self) && (!from || !gw_id_eq(&v->v[i].id, from)))
        peer_send(p, &v->v[i].id, GWTF__TRAIN_MSG__TRAIN_REVOKED, &r.base, NULL);
  }
}

static int take_revocations(train_peer *p, const gw_id *from, const uint8_t *buf, size_t len) {
  peer_admit *a = &p->admit;
  if (!a->private_run) return 0;
  member_revocations r;
  int rc = member_revocations_parse(buf, len, a->run, a->run_key, &r);
  if (rc != 0) return rc;
  if (a->revoked_bin && r.seq <= a->revoked.seq) {
    member_revocations_free(&r);
    return 0; /* not newer: nothing to do, nothing to pass on */
  }
  uint8_t *copy = malloc(len ? len : 1);
  if (!copy) {
    member_revocations_free(&r);
    return GW_ENOMEM;
  }
  memcpy(copy, buf, len);
  free(a->revoked_bin);
  a->revoked_bin = copy;
  a->revoked_len = len;
  member_revocations_free(&a->revoked);
  a->revoked = r;
  GW_INFO(&p->log, "run.revocations", "seq=%llu peers=%zu", (unsigned long long)r.seq, r.n);
  flood_revocations(p, from); /* first: the revoked peers still in our views hear it too */
  apply_revocations(p);
  return 0;
}

void admit_on_revoked(train_peer *p, const gw_id *from, const Gwtf__TrainRevoked *r) {
  if (take_revocations(p, from, r->list.data, r->list.len) != 0)
    refuse(p, from, GWTF__TRAIN_MSG__TRAIN_REVOKED, "bad_revocations");
}

bool train_peer_revocations(const train_peer *p, const uint8_t **list, size_t *len, uint64_t *seq) {
  const peer_admit *a = &p->admit;
  if (!a->revoked_bin) return false;
  *list = a->revoked_bin;
  *len = a->revoked_len;
  *seq = a->revoked.seq;
  return true;
}

int train_peer_set_revocations(train_peer *p, const uint8_t *list, size_t len, uint64_t now_ms) {
  p->now = now_ms;
  return take_revocations(p, NULL, list, len);
}

/* A member (not a holder) past half its certificate's lifetime asks for a
 * new one. */
static bool renewing(train_peer *p) {
  peer_admit *a = &p->admit;
  if (!a->my_cert || a->have_sk) return false;
  uint64_t half = (a->my_expires - a->my_issued) / 2;
  return unix_now(p) >= a->my_issued + half;
}

/* ---- time ---- */

/* A joiner redeems its token with the leader, the token's creator and every
 * data node of the directory (any of them may hold the run key). */

void admit_tick(train_peer *p) {
  peer_admit *a = &p->admit;
  if (!a->private_run) return;
  uint64_t now_s = unix_now(p);
  /* A holder renews its own certificate at half its lifetime. */
  if (a->have_sk && (!a->my_cert || now_s + a->cert_ttl_s / 2 >= a->my_expires)) {
    uint8_t *cert = NULL;
    size_t len = 0;
    uint64_t expires = 0;
    if (issue(p, &p->cfg.self, now_s, &cert, &len, &expires) == 0) {
      set_my_cert(p, cert, len, now_s, expires);
      free(cert);
      present_all(p);
    }
  }
  /* A joiner redeems its token with the leader and the token's creator; a
   * member renews its certificate the same way with the one it holds. */
  bool renew = admit_ready(p) && renewing(p);
  if (((!admit_ready(p) && a->token && !a->token_refused) || renew) &&
      (!a->last_redeem_ms || p->now - a->last_redeem_ms >= ADMIT_REDEEM_MS)) {
    a->last_redeem_ms = p->now ? p->now : 1;
    Gwtf__TrainRedeem r = GWTF__TRAIN_REDEEM__INIT;
    if (renew)
      r.cert = (ProtobufCBinaryData){a->my_cert_len, a->my_cert};
    else
      r.token = (ProtobufCBinaryData){a->token_len, a->token};
    if (p->have_leader) peer_send(p, &p->leader, GWTF__TRAIN_MSG__TRAIN_REDEEM, &r.base, NULL);
    if (!p->have_leader || !gw_id_eq(&p->leader, &a->token_creator))
      peer_send(p, &a->token_creator, GWTF__TRAIN_MSG__TRAIN_REDEEM, &r.base, NULL);
    /* and the other data nodes of the directory: one may hold the run key
     * (--run-key) while the creator is gone and the leader does not */
    for (uint32_t k = 0; k < a->n_pending; k++)
      if (a->pending[k].stage == 0 && !gw_id_eq(&a->pending[k].id, &a->token_creator) &&
          !(p->have_leader && gw_id_eq(&a->pending[k].id, &p->leader)))
        peer_send(p, &a->pending[k].id, GWTF__TRAIN_MSG__TRAIN_REDEEM, &r.base, NULL);
    GW_DEBUG(&p->log, "run.redeeming", "leader=%d", (int)p->have_leader);
  }
}

int train_peer_set_membership(train_peer *p, const train_membership *m) {
  peer_admit *a = &p->admit;
  admit_free(p);
  memset(a, 0, sizeof(*a));
  a->private_run = true;
  snprintf(a->run, sizeof(a->run), "%s", m->run);
  memcpy(a->run_key, m->run_key, MEMBER_PK_BYTES);
  a->cert_ttl_s = m->cert_ttl_s ? m->cert_ttl_s : ADMIT_DEFAULT_TTL_S;
  if (m->have_sk) {
    memcpy(a->key.sk, m->sk, MEMBER_SK_BYTES);
    memcpy(a->key.pk, m->sk + 32, MEMBER_PK_BYTES); /* libsodium's secret key ends with the public one */
    if (memcmp(a->key.pk, a->run_key, MEMBER_PK_BYTES) != 0) return GW_EINVAL;
    a->have_sk = true;
  }
  if (m->token && m->token_len) {
    member_invite inv;
    if (member_token_parse_bin(m->token, m->token_len, &inv) != 0 ||
        memcmp(inv.run_key, a->run_key, MEMBER_PK_BYTES) != 0)
      return GW_EINVAL;
    a->token = malloc(m->token_len);
    if (!a->token) return GW_ENOMEM;
    memcpy(a->token, m->token, m->token_len);
    a->token_len = m->token_len;
    a->token_creator = inv.creator;
  }
  if (m->cert && m->cert_len) {
    member_cert mc;
    if (member_cert_parse(m->cert, m->cert_len, a->run, a->run_key, &mc) != 0 || !gw_id_eq(&mc.peer, &p->cfg.self))
      return GW_EINVAL;
    set_my_cert(p, m->cert, m->cert_len, mc.issued, mc.expires);
  }
  return 0;
}

void admit_free(train_peer *p) {
  peer_admit *a = &p->admit;
  free(a->my_cert);
  free(a->token);
  free(a->revoked_bin);
  member_revocations_free(&a->revoked);
  sodium_memzero(a->key.sk, sizeof(a->key.sk));
  a->my_cert = a->token = a->revoked_bin = NULL;
}
