// gwtf live view: builds the picture of a run from its log events (docs/WEB.md).
// The server keeps the events; this page keeps only what it draws, bounded:
// events update plain state, and one requestAnimationFrame redraws what changed.
'use strict';

const TIMELINE_MAX = 300;   // entries kept in the DOM
const MB_SHOWN_MAX = 120;   // microbatch chips drawn
const MB_KEPT_MAX = 5000;   // microbatches tracked
const POINTS_MAX = 100000;  // per curve
const DEAD_SHOWN_MAX = 3;   // dead members listed per stage
const DEAD_DRAWN_EVENTS = 300; // the flow graph shows the dead for this many events

const S = {};
function resetState() {
  S.kind = 'node';
  S.seq = 0;
  S.events = 0;
  S.members = new Map();   // short node ID -> member
  S.procs = new Map();     // swarm process name -> {node, alive}
  S.flows = new Map();     // node -> Map(in>out -> next-hop node)
  S.mbs = new Map();       // origin/mb -> {origin, mb, stage, kind, iter}
  S.lossByIter = new Map(); // iter -> {sum, n}
  S.tputByIter = new Map(); // iter -> {sum}
  S.loss = [];             // [iter, mean loss], in order of arrival
  S.val = [];              // [iter, val_loss]
  S.tput = [];             // [iter, tokens/s]
  S.stages = 0;
  S.iter = null; S.lastLoss = null; S.lastVal = null; S.lastTput = null;
  S.crashes = 0; S.repairs = 0;
  S.aggSeen = new Set();
  S.pendingTimeline = [];  // entries not yet in the DOM
  S.dirty = { stages: true, flows: true, curves: true, mbs: true, stats: true, timelineReset: true };
}
resetState();

// ---- state from events ----

function member(id) {
  if (!id || id === '-') return null;
  let m = S.members.get(id);
  if (!m) {
    m = { id, seen: 0, downAt: 0, src: '', stage: null, addr: '', device: '', capacity: '', reach: '', ready: false, alive: true };
    S.members.set(id, m);
    S.dirty.stages = S.dirty.flows = true;
  }
  return m;
}

// A member marked dead comes back on its own next line only if it really
// lives: in a swarm, its process must be running under that identity (lines
// of a killed process can still arrive after the swarm saw it exit).
function mayRevive(m) {
  if (S.kind !== 'swarm' || !m.src) return true;
  const p = S.procs.get(m.src);
  return !!p && p.alive && p.node === m.id;
}

function down(m) {
  if (m.alive) m.downAt = S.events;
  m.alive = false;
}

function procDown(name) {
  const p = S.procs.get(name);
  if (!p) return;
  p.alive = false;
  const m = S.members.get(p.node);
  if (m) { down(m); S.flows.delete(m.id); }
  S.dirty.stages = S.dirty.flows = true;
}

function timeline(cls, ev, text) {
  const t = typeof ev.ts === 'string' ? ev.ts.slice(11, 19) : '';
  S.pendingTimeline.push({ cls, t, text });
  if (S.pendingTimeline.length > TIMELINE_MAX) S.pendingTimeline.shift();
  if (cls === 'crash') S.crashes++;
  if (cls === 'repair' || cls === 'reroute') S.repairs++;
}

function who(ev) { return (ev.src ? ev.src + ' ' : '') + (ev.node && ev.node !== '-' ? ev.node : ''); }
function num(v) { return typeof v === 'number' && isFinite(v) ? v : null; }

function addPoint(arr, x, y) {
  arr.push([x, y]);
  if (arr.length > POINTS_MAX) arr.splice(0, arr.length - POINTS_MAX);
}

function onIterationDone(ev) {
  const it = num(ev.iter), loss = num(ev.loss), tps = num(ev.tokens_per_s);
  if (it === null) return;
  if (S.iter === null || it >= S.iter) S.iter = it;
  if (loss !== null) {
    // Every data node reports its own loss: the curve shows their mean.
    let r = S.lossByIter.get(it);
    if (!r) { r = { sum: 0, n: 0, idx: S.loss.length }; S.lossByIter.set(it, r); addPoint(S.loss, it, loss); }
    r.sum += loss; r.n++;
    const p = S.loss[Math.min(r.idx, S.loss.length - 1)];
    if (p && p[0] === it) p[1] = r.sum / r.n;
    S.lastLoss = r.sum / r.n;
  }
  if (tps !== null) {
    // every data node reports its own microbatches: the swarm's is their sum
    let r = S.tputByIter.get(it);
    if (!r) { r = { sum: 0, idx: S.tput.length }; S.tputByIter.set(it, r); addPoint(S.tput, it, 0); }
    r.sum += tps;
    const p = S.tput[Math.min(r.idx, S.tput.length - 1)];
    if (p && p[0] === it) p[1] = r.sum;
    S.lastTput = r.sum;
  }
  for (const [k, mb] of S.mbs) if (mb.origin === ev.node && mb.iter !== null && mb.iter <= it) S.mbs.delete(k);
  S.dirty.curves = S.dirty.stats = S.dirty.mbs = true;
}

// A node's flow units, as its flow.* events describe them: {in, out, peer}.
// `peer` is the other end that changed (next hop, new upstream, or the node
// a unit was handed over to); which one is read from the stages at drawing time.
function onFlow(ev, m) {
  if (!m) return;
  let f = S.flows.get(m.id);
  if (!f) { f = new Map(); S.flows.set(m.id, f); }
  const zero = (x) => !x || /^0+$/.test(x);
  const key = zero(ev.in) ? 'o' + ev.out : 'i' + ev.in;
  if (ev.event === 'flow.torn_down') f.delete(key);
  else if (ev.event === 'flow.peer_dead') { for (const [k, u] of f) if (u.peer === ev.peer) f.delete(k); }
  else if (!zero(ev.peer) && ev.peer !== '-') f.set(key, { in: ev.in, out: ev.out, peer: ev.peer });
  S.dirty.flows = true;
}

// Edges "from>to" -> set of segments, from every node's units: a unit whose
// peer sits in the next stage is its outflow, one in the previous stage its
// inflow (the last relay stage feeds the data nodes' sinks, stage 0).
function flowEdges() {
  let last = S.stages || 0;
  for (const m of S.members.values()) if (m.stage !== null && m.stage > last) last = m.stage;
  const next = (s) => (s >= last ? 0 : s + 1);
  const edges = new Map();
  const add = (a, b, seg) => {
    const k = a + '>' + b;
    if (!edges.has(k)) edges.set(k, new Set());
    edges.get(k).add(seg);
  };
  for (const [id, units] of S.flows) {
    const me = S.members.get(id);
    if (!me || !me.alive || me.stage === null) continue;
    for (const u of units.values()) {
      const p = S.members.get(u.peer);
      if (!p || !p.alive || p.stage === null) continue;
      if (p.stage === next(me.stage)) add(id, u.peer, u.out);
      else if (me.stage === next(p.stage)) add(u.peer, id, u.in);
    }
  }
  return edges;
}

const handlers = {
  'node.listening': (ev, m) => { if (m) m.addr = ev.addr || m.addr; if (ev.src) S.procs.set(ev.src, { node: ev.node, alive: true }); },
  'compute.ready': (ev, m) => { if (m) { m.device = ev.device || ''; m.capacity = ev.capacity ?? m.capacity; } },
  'stage.announced': (ev, m) => { if (m) { m.capacity = ev.capacity ?? m.capacity; if (!m.reach) m.reach = ev.private ? 'private' : 'public'; } },
  'nat.reachability': (ev, m) => { if (m) m.reach = ev.status || m.reach; },
  'peer.ready': (ev, m) => { if (m) m.ready = true; timeline('join', ev, `${who(ev)} ready in stage ${ev.stage} (iteration ${ev.iter})`); },
  'join.placed': (ev) => timeline('join', ev, `${who(ev)} placed newcomer ${ev.peer} in stage ${ev.to_stage}`),
  'train.resync': (ev, m) => { if (m) m.ready = false; },
  'run.created': (ev) => { S.stages = ev.stages; },
  'run.found': (ev) => { S.stages = ev.stages; },
  'iteration.done': (ev) => onIterationDone(ev),
  'eval.done': (ev) => {
    const v = num(ev.val_loss), x = num(ev.iter) ?? num(ev.step);
    if (v !== null && x !== null) { addPoint(S.val, x, v); S.lastVal = v; S.dirty.curves = S.dirty.stats = true; }
  },
  'compute.done': (ev) => {
    const k = ev.origin + '/' + ev.mb;
    if (!S.mbs.has(k) && S.mbs.size >= MB_KEPT_MAX) S.mbs.delete(S.mbs.keys().next().value);
    S.mbs.set(k, { origin: ev.origin, mb: ev.mb, stage: ev.stage, kind: ev.kind, iter: num(ev.iter) });
    S.dirty.mbs = true;
  },
  'microbatch.done': (ev) => { S.mbs.delete(ev.node + '/' + ev.mb); S.dirty.mbs = true; },
  'microbatch.lost': (ev) => { S.mbs.delete(ev.node + '/' + ev.mb); S.dirty.mbs = true; timeline('crash', ev, `${who(ev)} lost microbatch ${ev.mb}`); },
  'microbatch.deferred': (ev) => { S.mbs.delete(ev.node + '/' + ev.mb); S.dirty.mbs = true; },
  'flow.established': onFlow, 'flow.changed': onFlow, 'flow.torn_down': onFlow, 'flow.peer_dead': onFlow,
  'forward.rerouted': (ev) => timeline('reroute', ev, `${who(ev)} re-routed microbatch ${ev.mb} around ${ev.from_peer} (${ev.reason})`),
  'backward.recovered': (ev) => timeline('repair', ev, `${who(ev)} repaired the backward pass of ${ev.mb} (${ev.repairs} repair${ev.repairs === 1 ? '' : 's'})`),
  'backward.restarted': (ev) => timeline('repair', ev, `${who(ev)} restarted microbatch ${ev.mb} (attempt ${ev.attempt})`),
  'backward.resumed': (ev) => timeline('repair', ev, `${who(ev)} resumed the backward pass of ${ev.mb} via ${ev.via}`),
  'backward.rebuilt_ahead': (ev) => timeline('repair', ev, `${who(ev)} had the gap before it mended ahead of the backward pass of ${ev.mb} (via ${ev.via})`),
  'peer.presumed_dead': (ev) => {
    const m = S.members.get(ev.peer);
    if (m) { down(m); S.dirty.stages = S.dirty.flows = true; }
    timeline('crash', ev, `${who(ev)} presumes ${ev.peer} dead`);
  },
  'peer.back': (ev) => { const m = S.members.get(ev.peer); if (m && S.kind === 'node') { m.alive = true; S.dirty.stages = true; } },
  'peer.lost': (ev) => { const m = S.members.get(ev.peer); if (m && S.kind === 'node') { down(m); S.dirty.stages = true; } },
  'peer.connected': (ev) => {
    if (S.kind !== 'node') return;
    const m = member(ev.peer);
    if (m) { m.alive = true; m.addr = ev.addr || m.addr; }
  },
  'flow.link_costs': (ev, me) => {
    // a node's next-stage neighbours: "id:cost,id:cost"
    if (S.kind !== 'node' || !me || typeof ev.to !== 'string' || typeof me.stage !== 'number') return;
    for (const part of ev.to.split(',')) {
      const m = member(part.split(':')[0]);
      if (m && m.stage === null) m.stage = me.stage + 1;
    }
  },
  'debug.crash': (ev, m) => { if (m) down(m); timeline('crash', ev, `${who(ev)} crashed itself (--fault)`); },
  'aggregation.done': (ev) => {
    const k = ev.stage + '/' + ev.iter;
    if (S.aggSeen.has(k)) return;
    S.aggSeen.add(k);
    if (S.aggSeen.size > 4096) S.aggSeen.delete(S.aggSeen.values().next().value);
    timeline('agg', ev, `stage ${ev.stage} aggregated iteration ${ev.iter}: ${ev.total} microbatches from ${ev.members} member(s), hash ${ev.hash}`);
  },
  'aggregation.aggregator_lost': (ev) => timeline('crash', ev, `${who(ev)} lost aggregator ${ev.aggregator} (iteration ${ev.iter})`),
  'leader.elected': (ev) => timeline('join', ev, `${who(ev)} sees ${ev.leader} as leader`),
  'run.finished': (ev) => timeline('agg', ev, `${who(ev)} finished ${ev.iterations} iterations`),
  'node.stopped': (ev, m) => { if (m) down(m); },
  // the swarm's own events about its processes (src: the process)
  'swarm.kill': (ev) => { procDown(ev.src); timeline('crash', ev, `swarm killed ${ev.src} (${ev.signal || 'SIGKILL'})`); },
  'swarm.exit': (ev) => { procDown(ev.src); if (ev.expected === false) timeline('crash', ev, `${ev.src} exited unexpectedly (status ${ev.status}, signal ${ev.signal})`); },
  'swarm.start': (ev) => {
    S.procs.set(ev.src, { node: null, alive: true });
    if (ev.generation > 0) timeline('repair', ev, `swarm restarted ${ev.src} with a fresh identity (generation ${ev.generation})`);
    else if (ev.late) timeline('join', ev, `${ev.src} joins the run late`);
  },
};

function ingest(ev) {
  if (!ev || typeof ev.event !== 'string') return;
  S.events++;
  const m = member(ev.node);
  if (m) {
    m.seen = S.events;
    if (ev.src) m.src = ev.src;
    if (typeof ev.stage === 'number' && m.stage !== ev.stage) { m.stage = ev.stage; S.dirty.stages = S.dirty.flows = true; }
    if (!m.alive && ev.event !== 'node.stopped' && ev.event !== 'debug.crash' && mayRevive(m)) { m.alive = true; S.dirty.stages = true; }
  }
  const h = handlers[ev.event];
  if (h) { h(ev, m); S.dirty.stages = true; }
  S.dirty.stats = true;
  schedule();
}

// ---- drawing, once per frame ----

let frameAsked = false;
function schedule() {
  if (frameAsked) return;
  frameAsked = true;
  requestAnimationFrame(render);
}

const $ = (id) => document.getElementById(id);
const esc = (s) => String(s ?? '').replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));
const fmt = (v, d) => (v === null || v === undefined ? '–' : Number(v).toFixed(d));

function render() {
  frameAsked = false;
  const d = S.dirty;
  if (d.stats) renderStats();
  if (d.stages) renderStages();
  if (d.flows) renderFlows();
  if (d.curves) renderCurves();
  if (d.mbs) renderMbs();
  renderTimeline();
  S.dirty = { stages: false, flows: false, curves: false, mbs: false, stats: false, timelineReset: false };
}

function liveMembers() { let n = 0; for (const m of S.members.values()) n += m.alive ? 1 : 0; return n; }

function renderStats() {
  $('kind').textContent = S.kind === 'swarm' ? 'local swarm' : 'node';
  $('st-iter').textContent = S.iter ?? '–';
  $('st-loss').textContent = fmt(S.lastLoss, 4);
  $('st-val').textContent = fmt(S.lastVal, 4);
  $('st-tput').textContent = fmt(S.lastTput, 0);
  $('st-peers').textContent = liveMembers() + ' / ' + S.members.size;
  $('st-mbs').textContent = S.mbs.size;
  $('st-crash').textContent = S.crashes;
  $('st-repair').textContent = S.repairs;
  $('st-events').textContent = S.events;
}

function byStage() {
  const stages = new Map();
  for (const m of S.members.values()) {
    const s = m.stage === null ? -1 : m.stage;
    if (!stages.has(s)) stages.set(s, []);
    stages.get(s).push(m);
  }
  return [...stages.entries()].sort((a, b) => (a[0] === -1 ? 1e9 : a[0]) - (b[0] === -1 ? 1e9 : b[0]));
}

function renderStages() {
  let html = '';
  for (const [s, ms] of byStage()) {
    ms.sort((a, b) => (b.alive - a.alive) || (b.seen - a.seen));
    const live = ms.filter((m) => m.alive).length, gone = ms.length - live;
    // under churn the dead pile up: the tables keep the latest few
    if (gone > DEAD_SHOWN_MAX) ms.length = live + DEAD_SHOWN_MAX;
    html += `<div class="stage" data-stage="${s}"><h3>${s === -1 ? 'stage unknown' : 'stage ' + s}${s === 0 ? ' (data)' : ''} — ${live} live</h3><table><tr><th>ID</th><th>proc</th><th>address</th><th>device</th><th>cap</th><th>reach</th></tr>`;
    for (const m of ms) {
      const cls = !m.alive ? 'dead' : (m.ready || m.stage === 0 ? '' : 'joining');
      html += `<tr class="member ${cls}" data-id="${esc(m.id)}"><td><span class="dot"></span>${esc(m.id)}</td><td>${esc(m.src)}</td><td>${esc(m.addr)}</td><td>${esc(m.device)}</td><td>${esc(m.capacity)}</td><td>${esc(m.reach)}</td></tr>`;
    }
    if (gone > DEAD_SHOWN_MAX) html += `<tr><td colspan="6" class="more">and ${gone - DEAD_SHOWN_MAX} more gone</td></tr>`;
    html += '</table></div>';
  }
  $('stages').innerHTML = html;
}

function fitCanvas(c) {
  const w = c.clientWidth || 300, h = Number(c.getAttribute('height')), r = window.devicePixelRatio || 1;
  if (c.width !== Math.round(w * r)) { c.width = Math.round(w * r); c.style.height = h + 'px'; }
  const g = c.getContext('2d');
  g.setTransform(c.width / w, 0, 0, c.width / w, 0, 0);
  g.clearRect(0, 0, w, h);
  return [g, w, h];
}

function renderFlows() {
  const c = $('flows');
  const [g, w, h] = fitCanvas(c);
  const recent = (m) => m.alive || S.events - m.downAt < DEAD_DRAWN_EVENTS;
  const cols = byStage().filter(([s]) => s >= 0).map(([s, ms]) => [s, ms.filter(recent)]);
  const pos = new Map();
  cols.forEach(([s, ms], i) => {
    const x = 40 + (cols.length > 1 ? i * (w - 80) / (cols.length - 1) : (w - 80) / 2);
    ms.forEach((m, j) => pos.set(m.id, [x, 34 + (ms.length > 1 ? j * (h - 58) / (ms.length - 1) : (h - 58) / 2), m]));
    g.fillStyle = '#6b7280'; g.font = '11px system-ui'; g.textAlign = 'center';
    g.fillText(s === 0 ? 'stage 0 (data)' : 'stage ' + s, x, 10);
  });
  const edges = flowEdges();
  for (const [k, segs] of edges) {
    const [a, b] = k.split('>'), n = segs.size;
    const pa = pos.get(a), pb = pos.get(b);
    if (!pa || !pb) continue;
    g.strokeStyle = pb[0] < pa[0] ? 'rgba(217,119,6,0.55)' : 'rgba(37,99,235,0.6)';
    g.lineWidth = Math.min(1 + n, 6);
    g.beginPath(); g.moveTo(pa[0], pa[1]);
    if (pb[0] < pa[0]) g.bezierCurveTo(pa[0] + 40, h + 10, pb[0] - 40, h + 10, pb[0], pb[1]); // back to a data node
    else g.lineTo(pb[0], pb[1]);
    g.stroke();
    const ang = Math.atan2(pb[1] - pa[1], pb[0] - pa[0]);
    if (pb[0] >= pa[0]) {
      const ex = pb[0] - 8 * Math.cos(ang), ey = pb[1] - 8 * Math.sin(ang);
      g.beginPath(); g.moveTo(ex, ey);
      g.lineTo(ex - 7 * Math.cos(ang - 0.4), ey - 7 * Math.sin(ang - 0.4));
      g.lineTo(ex - 7 * Math.cos(ang + 0.4), ey - 7 * Math.sin(ang + 0.4));
      g.closePath(); g.fillStyle = g.strokeStyle; g.fill();
    }
  }
  g.font = '10px system-ui'; g.textAlign = 'center';
  for (const [, [x, y, m]] of pos) {
    g.beginPath(); g.arc(x, y, 6, 0, 2 * Math.PI);
    g.fillStyle = !m.alive ? '#d1343b' : (m.ready || m.stage === 0 ? '#15803d' : '#d97706'); g.fill();
    if (pos.size <= 60) { g.fillStyle = '#1d2330'; g.fillText(m.src || m.id, x, y - 9); }
  }
}

function plot(c, series, logY) {
  const [g, w, h] = fitCanvas(c);
  const all = series.flatMap((s) => s.pts.length ? [s.pts[0], s.pts[s.pts.length - 1]] : []);
  let n = 0;
  for (const s of series) n += s.pts.length;
  c.dataset.points = n;
  if (!n) { g.fillStyle = '#6b7280'; g.font = '12px system-ui'; g.fillText('waiting for points…', 10, 20); return; }
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
  for (const p of all) { x0 = Math.min(x0, p[0]); x1 = Math.max(x1, p[0]); }
  for (const s of series) for (const p of s.pts) { y0 = Math.min(y0, p[1]); y1 = Math.max(y1, p[1]); x0 = Math.min(x0, p[0]); x1 = Math.max(x1, p[0]); }
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y1 += 0.5; y0 -= 0.5; }
  const L = 46, R = 8, T = 8, B = 18;
  const X = (x) => L + (x - x0) / (x1 - x0) * (w - L - R), Y = (y) => T + (1 - (y - y0) / (y1 - y0)) * (h - T - B);
  g.strokeStyle = '#e3e6ea'; g.lineWidth = 1; g.fillStyle = '#6b7280'; g.font = '10px system-ui';
  for (let i = 0; i <= 4; i++) {
    const y = y0 + (y1 - y0) * i / 4;
    g.beginPath(); g.moveTo(L, Y(y)); g.lineTo(w - R, Y(y)); g.stroke();
    g.textAlign = 'right'; g.fillText(y.toPrecision(4), L - 4, Y(y) + 3);
  }
  g.textAlign = 'left'; g.fillText('iter ' + x0, L, h - 4);
  g.textAlign = 'right'; g.fillText('iter ' + x1, w - R, h - 4);
  for (const s of series) {
    const step = Math.max(1, Math.floor(s.pts.length / (w - L - R))); // a point per pixel at most
    g.strokeStyle = g.fillStyle = s.color; g.lineWidth = 1.5;
    if (s.dots) {
      for (let i = 0; i < s.pts.length; i += step) { g.beginPath(); g.arc(X(s.pts[i][0]), Y(s.pts[i][1]), 3, 0, 7); g.fill(); }
    } else {
      g.beginPath();
      for (let i = 0; i < s.pts.length; i += step) { const p = s.pts[i]; i ? g.lineTo(X(p[0]), Y(p[1])) : g.moveTo(X(p[0]), Y(p[1])); }
      const last = s.pts[s.pts.length - 1]; g.lineTo(X(last[0]), Y(last[1]));
      g.stroke();
    }
  }
}

function renderCurves() {
  plot($('loss'), [{ pts: S.loss, color: '#2563eb' }, { pts: S.val, color: '#d97706', dots: true }]);
  plot($('tput'), [{ pts: S.tput, color: '#15803d' }]);
}

function renderMbs() {
  let html = '', i = 0;
  const shown = [...S.mbs.values()].slice(-MB_SHOWN_MAX);
  for (const mb of shown) {
    html += `<span class="mb ${String(mb.kind).includes('backward') ? 'backward' : ''}" title="origin ${esc(mb.origin)} iteration ${esc(mb.iter)}">${esc(mb.origin)}/${esc(mb.mb).slice(-6)} s${esc(mb.stage)} ${esc(mb.kind)}</span>`;
    i++;
  }
  if (S.mbs.size > i) html += `<span class="more">and ${S.mbs.size - i} more</span>`;
  if (!S.mbs.size) html = '<span class="more">none</span>';
  $('mbs').innerHTML = html;
}

function renderTimeline() {
  const ol = $('timeline');
  if (S.dirty.timelineReset) ol.textContent = '';
  if (!S.pendingTimeline.length) return;
  const frag = document.createDocumentFragment();
  for (const e of S.pendingTimeline) {
    const li = document.createElement('li');
    li.className = 'tl-' + e.cls;
    const t = document.createElement('time');
    t.textContent = e.t;
    li.append(t, ' ' + e.text);
    frag.prepend(li);
  }
  S.pendingTimeline = [];
  ol.prepend(frag);
  while (ol.childElementCount > TIMELINE_MAX) ol.lastElementChild.remove();
}

// ---- the feed ----

let source = null;
function setStatus(text, cls) { const s = $('status'); s.textContent = text; s.className = 'status ' + cls; }

async function start() {
  if (source) { source.close(); source = null; }
  let snap;
  try {
    const r = await fetch('/api/snapshot');
    snap = await r.json();
  } catch (e) {
    setStatus('server unreachable; retrying', 'down');
    setTimeout(start, 3000);
    return;
  }
  resetState();
  S.kind = snap.kind;
  for (const ev of snap.events) ingest(ev);
  S.seq = snap.seq;
  schedule();
  source = new EventSource('/api/events?since=' + snap.seq);
  source.onopen = () => setStatus('live', 'live');
  source.onmessage = (m) => {
    S.seq = Number(m.lastEventId) || S.seq;
    try { ingest(JSON.parse(m.data)); } catch (e) { /* a line cut short: skip it */ }
  };
  source.addEventListener('reset', () => start()); // fell behind the server's ring
  source.onerror = () => setStatus(source && source.readyState === EventSource.CLOSED ? 'disconnected' : 'reconnecting…', 'down');
}

for (const cb of document.querySelectorAll('#filters input')) {
  cb.addEventListener('change', () => document.body.classList.toggle('hide-' + cb.dataset.cls, !cb.checked));
}
window.addEventListener('resize', () => { S.dirty.flows = S.dirty.curves = true; schedule(); });

// For tests and benchmarks: feed events as if they came from the server.
window.gwtf = { ingest, state: S, flowEdges, render: () => { frameAsked = false; render(); } };
start();
