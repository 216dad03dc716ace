/* node/train_node.c — the "train" component of a node (see train_node.h); its files share node/train_rt.h. */
#include "node/train_rt.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dht/stage_dir.h"
#include "flow/flow.h"
#include "flow/flow_guard.h"
#include "gwtf.pb-c.h"
#include "node/dht_node.h"
#include "node/early_certs.h"
#include "node/run_access.h"
#include "node/train_access.h"
#include "node/train_plan.h"
#include "node/worker.h"
#include "train/checkpoint.h"
#include "train/replica_store.h"
#include "node/train_replica.h"
#include "train/compute.h"
#include "train/data.h"
#include "train/model.h"
#include "train/route_flow.h"
#include "train/run.h"
#include "train/route_swarm.h"
#include "train/stage.h"
#include "train/wire_codec.h"
#include "train.pb-c.h"
#include "util/err.h"
#include "util/file.h"

void train_node_opts_default(train_node_opts *o) {
  memset(o, 0, sizeof(*o));
  o->device = "cpu";
  o->routing = "gwtf";
  o->model = "tiny";
  o->stages = 3;
  o->microbatches = 4;
  o->batch = 4;
  o->seq = 64;
  o->lr = 1e-3;
  o->grad_clip = TRAIN_RUN_GRAD_CLIP_DEFAULT;
  o->seed = 1;
  o->threads = 0; /* all the cores this process may use: a home node uses the machine */
  o->checkpoint_every = 10;
  o->replicate_every = 5;
  o->replicas = 2;
  o->replica_max = REPLICA_DEFAULT_MAX_ENTRIES;
  o->rebalance_after = 3;
  o->rebalance_margin = 0.2;
  o->flow_tick_ms = 2000;
  o->hop_timeout_ms = 5000;
  o->live_k = 4;
  o->live_floor_ms = 500;
  o->exit_when_done = true;
  o->slowdown = 1.0;
  o->byzantine_scale = 100.0;
  o->eval_every = 10;
}

void train_rt_on_peer_event(void *ud, const train_event *ev) {
  train_rt *rt = ud;
  switch (ev->kind) {
  case TRAIN_EV_STAGE_ASSIGNED:
    if (rt->stage < 0)
      train_rt_enter_stage(rt, ev->stage);
    else if (ev->stage != rt->stage)
      train_rt_switch_stage(rt, ev->stage);
    train_rt_discover_now(rt);
    break;
  case TRAIN_EV_READY: train_rt_announce(rt); break;
  case TRAIN_EV_CERTIFIED: train_access_save_cert(&rt->acc, rt->peer, &rt->log); break;
  case TRAIN_EV_LEADER_CHANGED:
    if (train_peer_is_leader(rt->peer)) {
      rt->run.leader = node_identity(rt->n)->id;
      train_rt_publish_run(rt);
    } else if (gw_id_eq(&rt->run.leader, &node_identity(rt->n)->id)) {
      /* We published the record as its leader, and the DHT keeps
       * republishing it: replace it with one naming the new leader, which
       * readers skip (they take a record only from the leader it names). */
      train_peer_leader(rt->peer, &rt->run.leader);
      train_rt_publish_run(rt);
    }
    break;
  case TRAIN_EV_ITERATION_DONE:
    if (rt->flow) {
      size_t flows, probed;
      double sum;
      route_flow_data_cost(&rt->rf, &flows, &probed, &sum);
      GW_INFO(&rt->log, "flows.cost", "iter=%llu flows=%zu probed=%zu sum=%.3f", (unsigned long long)ev->iteration,
              flows, probed, sum);
    }
    break;
  case TRAIN_EV_REPLICA_STORED: {
    stage_member me;
    train_rt_my_record(rt, &me);
    train_replica_keep(rt->d, rt->run.name, rt->data_dir, rt->peer, ev->stage, &me, &rt->log, now_ms(rt));
    break;
  }
  case TRAIN_EV_REPLICA_DROPPED: {
    stage_member me;
    train_rt_my_record(rt, &me);
    train_replica_drop(rt->d, rt->run.name, rt->data_dir, rt->peer, ev->stage, ev->iteration, &me, &rt->log,
                       now_ms(rt));
    break;
  }
  case TRAIN_EV_STAGE_LOST:
    /* our stage trained, its peers and every replica of it are gone: the
     * peer logged which (stage.lost); training on with fresh weights would
     * silently throw the run's work away */
    if (!rt->stopping) {
      node_set_exit_code(rt->n, 3);
      train_rt_stop_soon(rt);
    }
    break;
  case TRAIN_EV_AGGREGATED:
    train_rt_log_wire(rt, ev->iteration);
    if (train_replica_due(rt->peer, rt->o->replicate_every, ev->iteration)) {
      train_job *job = calloc(1, sizeof(*job));
      if (job) {
        job->kind = TRAIN_JOB_SNAPSHOT;
        job->owner = &rt->replica_marker;
        job->mb_id = rt->stage_gen;
        job->key = ev->iteration;
        memcpy(job->hash, ev->hash, sizeof(job->hash));
        if (node_worker_submit(rt->worker, job) != 0) free(job);
      }
    }
    if (rt->o->checkpoint_every > 0 && ev->iteration % (uint64_t)rt->o->checkpoint_every == 0) {
      train_job *job = calloc(1, sizeof(*job));
      if (job) {
        job->kind = TRAIN_JOB_SNAPSHOT;
        job->owner = &rt->ckpt_marker;
        job->mb_id = rt->stage_gen;
        job->key = ev->iteration;
        memcpy(job->hash, ev->hash, sizeof(job->hash));
        char dir[PATH_MAX];
        snprintf(dir, sizeof(dir), "%s", rt->ckpt_path);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0';
        gw_mkdir_p(dir, 0700);
        if (node_worker_submit(rt->worker, job) != 0) free(job);
      }
    }
    break;
  default: break;
  }
}

static void give_early_cert(void *ud, const gw_id *from, const uint8_t *body, size_t len) {
  train_rt *rt = ud;
  train_peer_on_message(rt->peer, from, GWTF__TRAIN_MSG__TRAIN_CERT, body, len, NULL, now_ms(rt));
}

static int start_peer(train_rt *rt) {
  const train_node_opts *o = rt->o;
  bool data = o->create_run || o->data;
  char err[512];
  if (data) {
    if (!o->dataset) {
      GW_ERROR(&rt->log, "train.config", "msg=\"a data node needs --dataset PATH\"");
      return GW_EINVAL;
    }
    if (train_dataset_open(o->dataset, &rt->ds, err, sizeof(err)) != 0) {
      GW_ERROR(&rt->log, "train.dataset", "err=\"%s\"", err);
      return GW_EINVAL;
    }
    rt->ds_open = true;
    if ((int)rt->ds.vocab_needed > rt->run.model.vocab_size) {
      GW_ERROR(&rt->log, "train.dataset", "err=\"the dataset needs a vocabulary of %u, the model has %d\"",
               rt->ds.vocab_needed, rt->run.model.vocab_size);
      return GW_EINVAL;
    }
    char desc[256];
    train_dataset_describe(&rt->ds, desc, sizeof(desc));
    GW_INFO(&rt->log, "dataset.opened", "path=%s desc=\"%s\"", o->dataset, desc);
    rt->data_seed = o->data_seed ? o->data_seed : train_dataset_seed_for(node_identity(rt->n)->id.b);
    if (train_rt_open_validation(rt) != 0) return GW_EINVAL;
  }
  if (train_rt_probe_compute(rt, data) != 0) return GW_EINVAL;
  if (node_worker_new(rt->loop, train_rt_run_job, rt, train_rt_on_job_done, rt, &rt->worker) != 0) return GW_EIO;
  rt->swarm_routing = strcmp(o->routing, "swarm") == 0;
  train_router router;
  route_flow_init(&rt->rf, rt->run.stages, &rt->log);
  route_flow_set_load(&rt->rf, train_rt_next_load, rt);
  if (rt->swarm_routing) {
    rt->rs = route_swarm_new(data ? 0 : -1, rt->run.stages, (unsigned)rt->run.microbatches, ROUTE_SWARM_ALPHA);
    if (!rt->rs) return GW_ENOMEM;
    router = route_swarm_router(rt->rs);
  } else {
    router = route_flow_router(&rt->rf);
  }
  train_peer_config cfg = {0};
  cfg.self = node_identity(rt->n)->id;
  cfg.role = data ? TRAIN_DATA : TRAIN_RELAY;
  cfg.n_stages = rt->run.stages;
  cfg.stage = data ? 0 : -1;
  cfg.capacity = rt->capacity;
  cfg.shape = (train_shape){rt->run.batch, rt->run.seq, rt->run.model.d_model, 0};
  cfg.data_seed = rt->data_seed;
  cfg.iterations = data ? o->iterations : 0;
  cfg.recovery = rt->swarm_routing ? TRAIN_RECOVER_RESTART : TRAIN_RECOVER_PATH;
  train_tunables_default(&cfg.tun);
  cfg.tun.tick_ms = PEER_TICK_MS;
  cfg.tun.hop_timeout_ms = o->hop_timeout_ms;
  cfg.tun.live_rto_k = o->live_k;
  cfg.tun.live_floor_ms = o->live_floor_ms;
  cfg.tun.repair_reserve = rt->repair_reserve;
  cfg.tun.aggregate = o->aggregate;
  cfg.tun.no_validation = o->no_validation;
  cfg.tun.deterministic = o->deterministic;
  cfg.tun.rerun_lost = o->rerun_lost;
  cfg.tun.byzantine = o->byzantine;
  cfg.tun.byzantine_scale = o->byzantine_scale;
  if (o->byzantine != TRAIN_BYZ_NONE)
    GW_WARN(&rt->log, "debug.byzantine", "mode=%s scale=%g msg=\"test tool: this peer misbehaves on purpose\"",
            train_byzantine_name(o->byzantine), o->byzantine_scale);
  cfg.subspace_k = rt->run.subspace_k;
  cfg.subspace_refresh = rt->run.subspace_refresh;
  cfg.model = rt->run.model;
  cfg.seed = rt->run.seed;
  cfg.wire_dtype = o->wire_dtype;
  cfg.wire_grad_dtype = o->wire_grad_dtype;
  cfg.wire_accept = o->wire_accept;
  cfg.initial_weights = o->create_run != NULL;
  cfg.movable = !data; /* train_rt_switch_stage */
  cfg.tun.rebalance_after = (uint32_t)o->rebalance_after;
  cfg.tun.rebalance_margin = o->rebalance_margin;
  cfg.tun.move_to_short = o->move_to_short;
  cfg.join_stage = o->join_stage <= rt->run.stages ? o->join_stage : 0;
  cfg.grant_join_stage = o->grant_join_stages;
  for (int s = 1; s <= rt->run.stages && s < (int)(sizeof(cfg.stage_layers) / sizeof(cfg.stage_layers[0])); s++) {
    int first, nl;
    train_run_stage_layers(&rt->run, s, &first, &nl);
    cfg.stage_layers[s] = (uint16_t)nl;
  }
  memcpy(cfg.node_pk, node_identity(rt->n)->pk, sizeof(cfg.node_pk));
  gw_id run_id; /* the run record's DHT key: every average's signature covers it */
  if (stage_dir_run_key(rt->run.name, &run_id) != 0) return GW_EINVAL;
  memcpy(cfg.run_id, run_id.b, sizeof(cfg.run_id));
  train_io io = train_rt_peer_io(rt);
  int rc = train_peer_new(&rt->peer, &cfg, &io, &router, &rt->log);
  if (rc != 0) return rc;
  if (rt->run.private_run) {
    rt->acc.run = rt->run.name;
    rc = train_access_setup(&rt->acc, rt->peer, rt->run.run_key, o->join_token, o->join_token_len, &rt->log);
    if (rc != 0) return rc;
  }
  if (data) {
    train_peer_set_sampler(rt->peer, train_rt_sample, rt);
    train_peer_set_validation(rt->peer, train_rt_val_sample, rt, rt->val_n, o->eval_every);
    train_rt_enter_stage(rt, 0);
  }
  if (!data) {
    char leader[GW_ID_SHORT_LEN + 1];
    gw_id_to_short(&rt->run.leader, leader);
    GW_INFO(&rt->log, "run.joining", "run=%s capacity=%u leader=%s access=%s", rt->run.name, rt->capacity, leader,
            rt->run.private_run ? (rt->acc.have_key ? "run_key" : o->join ? "invite" : "certificate") : "open");
    train_peer_set_leader(rt->peer, &rt->run.leader, now_ms(rt));
  }
  rt->started = true;
  train_peer_set_replica_store(rt->peer, (size_t)o->replica_max, 0);
  train_peer_start(rt->peer, now_ms(rt));
  if (rt->run.private_run) {
    /* Sessions that came up before the peer existed: what they presented
     * was kept (node/early_certs.h); ours goes to them now, asking for
     * theirs where we have none. */
    if (rt->early_certs.n)
      GW_DEBUG(&rt->log, "run.early_certificates", "peers=%zu", rt->early_certs.n);
    node_early_certs_replay(&rt->early_certs, give_early_cert, rt);
    gw_peer up[MAX_KNOWN];
    size_t n = p2p_host_peers(rt->host, up, MAX_KNOWN);
    if (n > MAX_KNOWN) n = MAX_KNOWN; /* it counts them all, fills at most MAX_KNOWN */
    for (size_t i = 0; i < n; i++) train_peer_on_peer_up(rt->peer, &up[i].id, now_ms(rt));
  }
  return 0;
}

/* The freshest record whose publisher is the leader it names. */
void train_rt_run_cb(void *ud, int status, const stage_run *runs, size_t n) {
  train_rt *rt = train_rt_query_done(ud);
  if (!rt) return;
  rt->run_query_busy = false;
  if (status != 0 || rt->stopping) return;
  const stage_run *best = NULL;
  train_run best_info, info;
  char err[256];
  for (size_t i = 0; i < n; i++) {
    if (train_run_decode(runs[i].value, runs[i].len, &info, err, sizeof(err)) != 0) {
      GW_WARN(&rt->log, "run.bad_record", "err=\"%s\"", err);
      continue;
    }
    if (!gw_id_eq(&info.leader, &runs[i].publisher)) continue;
    if (info.subspace_refresh != 0) { /* the swarm has no protocol for the table's refresh yet */
      GW_WARN(&rt->log, "run.bad_record", "err=\"subspace refresh %d: this build keeps the subspace's table fixed\"",
              info.subspace_refresh);
      continue;
    }
    /* the invite (or our copy of the run key) is the root of trust: a
     * record naming another key is someone else's run of that name */
    const uint8_t *want = rt->o->join ? rt->o->invite.run_key : rt->acc.have_key ? rt->acc.key.pk : NULL;
    if (want && (!info.private_run || memcmp(info.run_key, want, 32) != 0)) {
      char who[GW_ID_SHORT_LEN + 1];
      gw_id_to_short(&runs[i].publisher, who);
      GW_WARN(&rt->log, "run.bad_record", "publisher=%s err=\"%s\"", who,
              info.private_run ? "another run key than ours" : "an open run, where our invite is for a private one");
      continue;
    }
    if (!best || runs[i].remaining_ms > best->remaining_ms) best = &runs[i], best_info = info;
  }
  if (!best) {
    if (!rt->have_run) GW_INFO(&rt->log, "run.searching", "run=%s", rt->o->run ? rt->o->run : rt->o->create_run);
    return;
  }
  if (rt->have_run) {
    /* only the leader may change */
    if (!gw_id_eq(&best_info.leader, &rt->run.leader) && rt->peer) {
      rt->run.leader = best_info.leader;
      if (!rt->o->create_run && !rt->o->data) train_peer_set_leader(rt->peer, &rt->run.leader, now_ms(rt));
    }
    return;
  }
  if (best_info.private_run && !rt->o->join && !rt->acc.have_key &&
      !train_access_has_cert(rt->data_dir, best_info.name)) {
    GW_ERROR(&rt->log, "run.private",
             "run=%s msg=\"a private run: join it with --join TOKEN (gwtf invite on its creator) or --run-key FILE\"",
             best_info.name);
    node_stop(rt->n);
    rt->stopping = true;
    return;
  }
  rt->run = best_info;
  rt->have_run = true;
  char leader[GW_ID_SHORT_LEN + 1];
  gw_id_to_short(&rt->run.leader, leader);
  GW_INFO(&rt->log, "run.found", "run=%s model=%s stages=%d layers=%d d_model=%d leader=%s access=%s", rt->run.name,
          model_arch_name(rt->run.model.arch), rt->run.stages, rt->run.model.n_layers, rt->run.model.d_model,
          leader, rt->run.private_run ? "private" : "open");
  if (start_peer(rt) != 0) {
    node_stop(rt->n);
    return;
  }
  /* the stages' members (the leader among them) now, not at the next round */
  uv_timer_start(&rt->disco_timer, train_rt_disco_cb, 0, DISCOVER_MS);
}

int train_rt_create_run(train_rt *rt) {
  const train_node_opts *o = rt->o;
  char err[512];
  train_run *r = &rt->run;
  memset(r, 0, sizeof(*r));
  if (model_preset_get(o->model, &r->model) != 0) {
    uint8_t *text = NULL;
    size_t len = 0;
    if (gw_file_read_all(o->model, 1 << 20, &text, &len) != 0) {
      GW_ERROR(&rt->log, "train.config", "err=\"--model %s is neither a preset nor a readable JSON file\"", o->model);
      return GW_EINVAL;
    }
    model_preset_get("tiny", &r->model);
    int rc = model_config_from_json((const char *)text, len, &r->model, err, sizeof(err));
    free(text);
    if (rc != 0) {
      GW_ERROR(&rt->log, "train.config", "err=\"%s: %s\"", o->model, err);
      return rc;
    }
  }
  snprintf(r->name, sizeof(r->name), "%s", o->create_run);
  r->stages = o->stages;
  r->batch = o->batch;
  r->seq = o->seq;
  r->microbatches = o->microbatches;
  r->lr = o->lr;
  r->grad_clip = o->grad_clip;
  r->subspace_k = o->subspace_k;
  r->subspace_refresh = o->subspace_refresh;
  r->seed = o->seed;
  r->leader = node_identity(rt->n)->id;
  snprintf(r->dataset, sizeof(r->dataset), "%s", o->dataset ? o->dataset : "");
  if (!o->open_run) {
    /* private: the run key stays in our data dir (or where --run-key says) */
    char path[PATH_MAX];
    if (o->run_key)
      snprintf(path, sizeof(path), "%s", o->run_key);
    else
      run_access_path(rt->data_dir, r->name, "run.key", path, sizeof(path));
    if (run_access_load_key(path, true, &rt->acc.key, err, sizeof(err)) != 0) {
      GW_ERROR(&rt->log, "train.config", "err=\"run key: %s\"", err);
      return GW_EINVAL;
    }
    rt->acc.have_key = true;
    r->private_run = true;
    memcpy(r->run_key, rt->acc.key.pk, sizeof(r->run_key));
  }
  if (train_run_validate(r, err, sizeof(err)) != 0) {
    GW_ERROR(&rt->log, "train.config", "err=\"%s\"", err);
    return GW_EINVAL;
  }
  int prc = train_plan_stages(&rt->log, o, r);
  if (prc != 0) return prc;
  rt->have_run = true;
  GW_INFO(&rt->log, "run.created",
          "run=%s model=%s stages=%d layers=%d d_model=%d microbatches=%d batch=%d seq=%d lr=%g grad_clip=%g "
          "subspace=%d access=%s",
          r->name, model_arch_name(r->model.arch), r->stages, r->model.n_layers, r->model.d_model, r->microbatches,
          r->batch, r->seq, r->lr, r->grad_clip, r->subspace_k, r->private_run ? "private" : "open");
  int rc = start_peer(rt);
  if (rc == 0) train_rt_publish_run(rt);
  return rc;
}

/* ---- the component ---- */

static int comp_start(node *n, void **state) {
  const train_node_opts *o = node_get_config(n)->train;
  *state = NULL;
  if (!o) return 0;
  train_rt *rt = calloc(1, sizeof(*rt));
  if (!rt) return GW_ENOMEM;
  rt->n = n;
  rt->loop = node_loop(n);
  rt->o = o;
  flow_guard_init(&rt->guard);
  rt->log = *node_log(n);
  rt->host = node_host(n);
  rt->stage = -1;
  dht_runtime *drt = node_dht(n);
  if (!drt) {
    GW_ERROR(&rt->log, "train.config", "msg=\"training needs the DHT\"");
    free(rt);
    return GW_EINVAL;
  }
  rt->d = dht_runtime_dht(drt);
  rt->data_dir = node_get_config(n)->data_dir ? node_get_config(n)->data_dir : ".";
  rt->acc.data_dir = rt->data_dir;
  if (o->run_key && !o->create_run) {
    char err[512];
    if (run_access_load_key(o->run_key, false, &rt->acc.key, err, sizeof(err)) != 0) {
      GW_ERROR(&rt->log, "train.config", "err=\"--run-key: %s\"", err);
      free(rt);
      return GW_EINVAL;
    }
    rt->acc.have_key = true;
  }
  uv_timer_t *timers[] = {&rt->peer_timer, &rt->flow_timer, &rt->disco_timer,
                          &rt->cost_timer, &rt->stop_timer, &rt->placed_timer};
  for (size_t i = 0; i < sizeof(timers) / sizeof(timers[0]); i++) {
    uv_timer_init(rt->loop, timers[i]);
    timers[i]->data = rt;
    rt->open_timers++;
  }
  *state = rt;
  int rc = o->create_run ? train_rt_create_run(rt) : 0;
  if (rc != 0) return rc;
  uv_timer_start(&rt->disco_timer, train_rt_disco_cb, 0, DISCOVER_MS);
  return 0;
}

static void timer_closed(uv_handle_t *h) {
  train_rt *rt = h->data;
  if (--rt->open_timers > 0) return;
  node *n = rt->n;
  free(rt);
  node_component_stopped(n);
}

static void comp_stop(node *n, void *state) {
  train_rt *rt = state;
  if (!rt) {
    node_component_stopped(n);
    return;
  }
  rt->stopping = true;
  for (size_t i = 0; i < MAX_QUERIES; i++) /* their callbacks free them */
    if (rt->queries[i]) rt->queries[i]->rt = NULL;
  if (rt->announced) stage_dir_withdraw(rt->d, rt->run.name, (uint32_t)rt->stage, now_ms(rt));
  node_worker_free(rt->worker); /* joins the compute thread before the stage goes */
  rt->worker = NULL;
  train_peer_free(rt->peer);
  node_early_certs_free(&rt->early_certs);
  rt->peer = NULL;
  train_access_wipe(&rt->acc);
  flow_free(rt->flow);
  rt->flow = NULL;
  route_swarm_free(rt->rs);
  if (rt->compute_ready) train_compute_free(&rt->compute);
  train_dataset_close(&rt->val); /* a view of ds unmaps nothing */
  if (rt->ds_open) train_dataset_close(&rt->ds);
  uv_timer_t *timers[] = {&rt->peer_timer, &rt->flow_timer, &rt->disco_timer,
                          &rt->cost_timer, &rt->stop_timer, &rt->placed_timer};
  for (size_t i = 0; i < sizeof(timers) / sizeof(timers[0]); i++) uv_close((uv_handle_t *)timers[i], timer_closed);
}

/* A member whose session came back (a relay circuit replaced after its
 * relay died, a redial after a network blip) is a live neighbour for the
 * flow protocol again, with its link cost measured on the new session:
 * flows re-form through it instead of staying on the fallback route. */
static void comp_peer_up(void *state, const gw_peer *peer, bool back) {
  train_rt *rt = state;
  if (!rt || rt->stopping) return;
  /* a private run: our certificate first, on every new session */
  if (rt->peer) train_peer_on_peer_up(rt->peer, &peer->id, now_ms(rt));
  known_peer *k = rt->flow ? train_rt_known_find(rt, &peer->id) : NULL;
  if (!k) return;
  if (k->stage == train_rt_next_stage(rt) || k->stage == train_rt_prev_stage(rt)) train_rt_costs_soon(rt);
  if (!back) return;
  flow_add_peer(rt->flow, &k->id, k->stage);
  double c = train_rt_link_cost(rt, &k->id);
  if (k->stage == train_rt_next_stage(rt)) flow_set_cost(rt->flow, &k->id, FLOW_DIR_NEXT, c);
  if (k->stage == train_rt_prev_stage(rt)) flow_set_cost(rt->flow, &k->id, FLOW_DIR_PREV, c);
}

static void comp_peer_down(void *state, const gw_id *id, p2p_down_reason reason) {
  train_rt *rt = state;
  if (!rt || !rt->peer) return;
  rt->rf.now_ms = now_ms(rt);
  (void)reason;
  train_peer_on_peer_down(rt->peer, id, now_ms(rt));
}

static void comp_message(void *state, const gw_id *from, p2p_msg *msg) {
  train_rt *rt = state;
  if (!rt) return;
  if (!rt->peer) {
    if (msg->type == GWTF__TRAIN_MSG__TRAIN_CERT && !msg->data_len && !rt->stopping)
      node_early_certs_keep(&rt->early_certs, from, msg->body, msg->body_len);
    return;
  }
  uint64_t now = now_ms(rt);
  rt->rf.now_ms = now;
  if (msg->type == GWTF__MSG_TYPE__MSG_FLOW) {
    bool first;
    uint64_t dropped;
    if (!flow_guard_admit(&rt->guard, from, now, &first, &dropped)) {
      if (first) {
        char who[GW_ID_SHORT_LEN + 1];
        gw_id_to_short(from, who);
        GW_WARN(&rt->log, "flow.rate_limited", "peer=%s rate=%d burst=%d dropped=%llu", who, FLOW_GUARD_RATE,
                FLOW_GUARD_BURST, (unsigned long long)dropped);
      }
      return;
    }
    /* flows and placement are for members only (the same state as the
     * dispatcher's, train/peer_admit.c; refusals logged there) */
    if (!train_peer_admit(rt->peer, from, now)) return;
    if (rt->flow) {
      gw_peer p = {.id = *from};
      flow_on_message(rt->flow, &p, msg->body, msg->body_len, now);
    }
    return;
  }
  train_tensor t, *tp = NULL;
  if (msg->tensor || msg->data_len) {
    memset(&t, 0, sizeof(t));
    if (msg->tensor) {
      if (msg->tensor->ndim > 4) return; /* no training tensor has more dimensions */
      t.dtype = (train_dtype)msg->tensor->dtype;
      t.ndim = msg->tensor->ndim;
      for (uint32_t i = 0; i < t.ndim; i++) t.shape[i] = msg->tensor->shape[i];
    } else {
      t.dtype = TRAIN_U8;
    }
    t.data = msg->data;
    t.nbytes = msg->data_len;
    tp = &t;
  }
  train_peer_on_message(rt->peer, from, msg->type, msg->body, msg->body_len, tp, now);
}

const node_component train_component = {
    .name = "train",
    .type_lo = 200,
    .type_hi = 399,
    .start = comp_start,
    .stop = comp_stop,
    .peer_up = comp_peer_up,
    .peer_down = comp_peer_down,
    .message = comp_message,
};
